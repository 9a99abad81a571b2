#!/usr/bin/env bash
# Set up natledger on a Debian 12 host: dependencies, release build, binary, hooks.d file,
# then a first run. PREFIX (default /usr/local) says where the binary goes.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables iproute2
cargo build --release --locked
install -D -m 0755 target/release/natledger "$PREFIX/bin/natledger"
# podman and CRI-O read hooks.d; the hook path must be absolute (poststop has no PATH).
install -d /usr/share/containers/oci/hooks.d
sed "s|/usr/local/bin/natledger|$PREFIX/bin/natledger|" hooks/natledger.json \
  > /usr/share/containers/oci/hooks.d/natledger.json
install -d -m 0700 /run/natledger
"$PREFIX/bin/natledger" --version
"$PREFIX/bin/natledger" list
echo "natledger installed: $PREFIX/bin/natledger, /usr/share/containers/oci/hooks.d/natledger.json"
