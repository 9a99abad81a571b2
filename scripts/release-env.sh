# Sourced by scripts/build-release.sh and scripts/test-release.sh: how the released binary is
# built (docs/performance.md, "The released binary"). glibc statically linked (+crt-static;
# libc6-dev provides libc.a)
# and not position-independent (relocation-model=static): no dynamic loader, no relocations,
# about 0.5 ms less per hook process. Only with an explicit --target, so that build scripts
# and proc macros (which must be dynamic) are built without these flags.
# shellcheck shell=bash
NATLEDGER_TARGET=${NATLEDGER_TARGET:-$(rustc -vV | sed -n 's/^host: //p')}
case "$NATLEDGER_TARGET" in
  *-linux-gnu) ;;
  *) echo "natledger release build: target $NATLEDGER_TARGET is not *-linux-gnu" >&2; exit 1 ;;
esac
export RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static${RUSTFLAGS:+ $RUSTFLAGS}"
