#!/usr/bin/env bash
# Set up natledger on a Debian 12 host: dependencies, release build, binary (and the
# natledger-runtime wrapper link), the CNI plugin link (scripts/cni-link.sh), hooks.d file, systemd units, then `natledger selftest`. PREFIX (default /usr/local) says where the binary goes.
# scripts/uninstall.sh undoes it.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}

# Build dependencies (a C linker, glibc's static libc.a in libc6-dev, binutils' readelf and nm
# for scripts/build-release.sh's checks; Rust itself comes from rustup) and what natledger runs:
# both iptables backends and iproute2 (selftest).
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  gcc libc6-dev binutils iptables iproute2 ca-certificates
command -v cargo >/dev/null || {
  echo "scripts/install.sh: needs a Rust toolchain, 1.88 or newer (rustup)" >&2
  exit 1
}
# The released build: static glibc, non-PIE, checked to link no NSS lookups
# (docs/performance.md, "The released binary").
bin=$(scripts/build-release.sh | tail -n 1)
install -D -m 0755 "$bin" "$PREFIX/bin/natledger"
# The wrapper runtime for Docker and containerd is the same binary under another name.
ln -sf natledger "$PREFIX/bin/natledger-runtime"
install -D -m 0644 README.md "$PREFIX/share/doc/natledger/README.md"
# Installed files name the binary (and the README) by absolute path: rewrite it for PREFIX.
at_prefix() {
  sed -e "s|/usr/local/bin/natledger|$PREFIX/bin/natledger|" \
    -e "s|/usr/local/share/doc/natledger|$PREFIX/share/doc/natledger|" "$1" > "$2"
  chmod 0644 "$2"
}
# CNI runtimes (podman's CNI backend, containerd's CRI, nerdctl) find a plugin by its type in
# their plugin directory: link natledger there (docs/cni.md).
scripts/cni-link.sh install "$PREFIX/bin/natledger"
# podman and CRI-O read hooks.d; the hook path must be absolute (poststop has no PATH).
install -d /usr/share/containers/oci/hooks.d
at_prefix hooks/natledger.json /usr/share/containers/oci/hooks.d/natledger.json
# systemd: sweep at boot, after a runtime stops, and every 15 minutes
# (docs/sweep.md, "systemd units").
for unit in packaging/systemd/*; do
  at_prefix "$unit" "/etc/systemd/system/$(basename "$unit")"
done
# Enable them; where systemd runs, start the timer and the units of running runtimes.
scripts/units.sh enable
install -d -m 0700 /run/natledger
"$PREFIX/bin/natledger" --version
"$PREFIX/bin/natledger" list
# Prove it works on this host, in private namespaces (the host's own rules are not touched).
"$PREFIX/bin/natledger" selftest
echo "natledger installed: $PREFIX/bin/natledger, /usr/share/containers/oci/hooks.d/natledger.json," \
  "/etc/systemd/system/natledger-*," \
  "natledger in the CNI plugin directories that exist (/usr/lib/cni, /opt/cni/bin)"
