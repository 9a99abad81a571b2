#!/usr/bin/env bash
# Build the released natledger binary: static glibc, non-PIE (scripts/release-env.sh;
# docs/performance.md), then check that it is what it should be: a static, non-PIE
# executable that starts,
# and that links none of glibc's NSS lookups (a statically linked glibc would dlopen NSS
# modules of the build host's glibc version for them: getaddrinfo, getpwnam, ...).
# Usage: scripts/build-release.sh [extra cargo build arguments]
# Interface (scripts/install.sh, the package build): the LAST line of stdout is the absolute
# path of the built binary; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/release-env.sh

cargo build --release --locked --target "$NATLEDGER_TARGET" "$@" >&2
target_dir=${CARGO_TARGET_DIR:-target}
case "$target_dir" in /*) ;; *) target_dir=$PWD/$target_dir ;; esac
bin=$target_dir/$NATLEDGER_TARGET/release/natledger

fail() { echo "scripts/build-release.sh: $bin: $*" >&2; exit 1; }
# ELF type EXEC (not DYN: PIE) and no PT_INTERP (no dynamic loader).
readelf -h "$bin" | grep -Eq 'Type:[[:space:]]+EXEC' || fail "not a non-PIE executable"
if readelf -l "$bin" | grep -q INTERP; then fail "has a program interpreter (dynamically linked)"; fi
if readelf -d "$bin" 2>/dev/null | grep -q NEEDED; then fail "needs shared libraries"; fi
# No NSS: none of glibc's name-service entry points may be linked in at all, so no code
# path can reach them (the symbol table is there: the release profile does not strip).
syms=$(nm "$bin") || fail "cannot read its symbol table"
grep -q ' main$' <<<"$syms" || fail "has no symbol table (stripped?): cannot check for NSS"
nss=$(grep -Ew '(getaddrinfo|getnameinfo|gethostbyname2?(_r)?|gethostbyaddr(_r)?|getservbyname(_r)?|getservbyport(_r)?|getpwnam(_r)?|getpwuid(_r)?|getpwent(_r)?|getgrnam(_r)?|getgrgid(_r)?|getgrouplist|initgroups|getspnam(_r)?|getprotobyname(_r)?)$' <<<"$syms" \
  | grep -E ' [Tt] ' || true)
[ -z "$nss" ] || fail "links glibc NSS lookups (unsafe in a static glibc binary):
$nss"
"$bin" --version >&2 || fail "does not run"
echo "$bin"
