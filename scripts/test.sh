#!/usr/bin/env bash
# The whole test suite on a Debian 12 machine, as root, installing what it needs first.
# Integration tests create (and delete) their own network namespaces; they never touch the
# machine's own firewall.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh: run as root (the tests create network namespaces)" >&2
  exit 1
fi

# Debian packages the tests use: both iptables backends (iptables), ip/netns (iproute2),
# systemd-analyze for the unit files (systemd), and the real runtimes the end-to-end tests
# run containers with: runc, crun, podman (with conmon and the CNI plugins), Docker's daemon
# and containerd (with ctr, and the CNI plugins its CRI test uses), and busybox-static for the
# containers' root filesystem (and the CRI test's images). nsenter and unshare are util-linux.
# conntrack (conntrack-tools) reads the conntrack table independently of natledger's ctnetlink.
# nft (nftables) shows and writes native nf_tables tables independently of natledger's netlink
# (the nftables backend's before/after dumps, encoding comparisons, other owners' tables).
missing=()
command -v iptables-legacy-save >/dev/null || missing+=(iptables)
command -v iptables-nft-save >/dev/null || missing+=(iptables)
command -v ip >/dev/null || missing+=(iproute2)
command -v sysctl >/dev/null || missing+=(procps)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v conntrack >/dev/null || missing+=(conntrack)
command -v nft >/dev/null || missing+=(nftables)
# man (man-db) renders the generated man pages; zsh and fish check their completion files'
# syntax (tests/it/docs.rs; together about 2 MB to download).
command -v man >/dev/null || missing+=(man-db)
command -v zsh >/dev/null || missing+=(zsh)
command -v fish >/dev/null || missing+=(fish)
# The package test builds the .deb (tests/runtimes/package.rs, scripts/build-deb.sh): dpkg-deb (dpkg),
# dpkg-shlibdeps (dpkg-dev), file, strip (binutils).
command -v dpkg-shlibdeps >/dev/null || missing+=(dpkg-dev)
command -v file >/dev/null || missing+=(file)
command -v strip >/dev/null || missing+=(binutils)
# promtool (prometheus) checks and unit-tests deploy/prometheus's alert rules and lints watch's
# live /metrics (tests/it/alerts.rs); policy-rc.d below keeps the server from starting.
command -v promtool >/dev/null || missing+=(prometheus)
for pkg in runc crun busybox-static podman conmon containernetworking-plugins docker.io \
  containerd util-linux tar; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  # No package may start its service (dockerd would write the machine's own firewall):
  # policy-rc.d answering 101 forbids it, for the install only, unless one is already there.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 0755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [ "$(trap -p EXIT)" != "" ]; then rm -f "$policy"; trap - EXIT; fi
fi
# The CRI test's client (tests/cri/cri.py) speaks gRPC: grpcio, and grpcio-tools, which
# generates its stubs from tests/cri/api.proto at test time. tests/it/metrics.rs parses the
# --metrics-file files with the Prometheus text-format parser of prometheus_client.
# tests/it/deploy.rs checks deploy/kubernetes/natledger.yaml offline with kubernetes-validate
# (it bundles the API schemas of each Kubernetes version; PyYAML comes with it and reads the
# YAML for tests/runtimes/kubernetes.rs too). Pinned, and
# installed only when these exact versions are not importable. Debian's own python3 refuses pip
# installs outside a virtual environment (PEP 668) unless told; packages go to /usr/local, not
# apt's directories.
python_pins=(grpcio==1.85.1 grpcio-tools==1.85.1 prometheus_client==0.26.0
  kubernetes-validate==1.37.0)
if ! python3 - "${python_pins[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    sys.exit(any(version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
except PackageNotFoundError:
    sys.exit(1)
EOF
then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip
  fi
  python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
    "${python_pins[@]}"
fi
command -v cargo >/dev/null || { echo "scripts/test.sh: needs cargo (rustup)" >&2; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The library's unit tests, then tests/it, then tests/runtimes (real runtimes and daemons),
# one crate after another.
cargo test --locked 2>&1 | tee "$log"
# One closing line for the whole suite, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "suite: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' "$log"
