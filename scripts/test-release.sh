#!/usr/bin/env bash
# Run integration tests against the released binary itself, as root (the tests create network
# namespaces). The tests name the binary at compile time (env!("CARGO_BIN_EXE_natledger")), so
# they are built with the release build's profile, flags and --target (scripts/release-env.sh),
# which puts that path at target/TARGET/release/natledger. cargo's test build links that binary
# with panic=unwind; scripts/build-release.sh then rebuilds it as released (panic=abort) at the
# same path, and the test executables are run directly, against it.
# Default: the hooks, sweep, CNI and selftest modules of tests/it; arguments replace them:
# cargo test target selection, then after `--` the test filters (e.g. --test runtimes -- runc::).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/release-env.sh
targets=()
filters=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; filters=("$@"); break; fi
  targets+=("$1")
  shift
done
if [ ${#targets[@]} -eq 0 ]; then targets=(--test it); filters=(hooks:: sweep:: cni:: selftest::); fi
exes=$(cargo test --release --locked --target "$NATLEDGER_TARGET" --no-run --message-format=json "${targets[@]}" \
  | grep '"test":true' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
bin=$(scripts/build-release.sh | tail -n 1)
echo "scripts/test-release.sh: testing $bin ($(sha256sum < "$bin" | cut -c1-16))" >&2
status=0
for exe in $exes; do
  echo "== $exe" >&2
  "$exe" "${filters[@]}" || status=1
done
# The binary tested is still the one built for release (nothing rebuilt it meanwhile).
[ "$(scripts/build-release.sh 2>/dev/null | tail -n 1)" = "$bin" ]
echo "scripts/test-release.sh: tested $bin ($(sha256sum < "$bin" | cut -c1-16))" >&2
exit $status
