#!/usr/bin/env bash
# Build the Debian package: target/debian/natledger_VERSION-1_ARCH.deb (its path is the last
# line printed). Tools: dpkg-deb (dpkg, on every Debian host), gzip, file and strip (binutils),
# and dpkg-shlibdeps (dpkg-dev) for a dynamically linked binary only; the maintainer scripts,
# the units and the layout are this repository's own (packaging/debian, packaging/systemd).
#
# The binary: NATLEDGER_BINARY if set (a binary built already, e.g. by the tests), else the
# static release build of scripts/build-release.sh where that exists (its last stdout line is
# the binary's path), else `cargo build --release --locked`. Man pages and completions come
# from natledger-docs beside that binary (`natledger-docs OUTDIR`), skipped with a warning
# where it is not built.
set -euo pipefail
cd "$(dirname "$0")/.."
warn() { echo "${0##*/}: warning: $*" >&2; }

if [ -n "${NATLEDGER_BINARY:-}" ]; then
  binary=$NATLEDGER_BINARY
elif [ -x scripts/build-release.sh ]; then
  binary=$(scripts/build-release.sh | tail -n 1)
else
  cargo build --release --locked >&2
  binary=target/release/natledger
fi
[ -x "$binary" ] || { echo "${0##*/}: no binary at $binary" >&2; exit 1; }
docs=$(dirname "$binary")/natledger-docs
[ -x "$docs" ] || { [ -x target/release/natledger-docs ] && docs=target/release/natledger-docs; }

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)-1
arch=$(dpkg --print-architecture)
# The maintainer: DEB_MAINTAINER, else the last commit's author.
maintainer=${DEB_MAINTAINER:-$(git log -1 --format='%an <%ae>')}
# Reproducible: every date is the last commit's.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

out=target/debian
root=$out/root
rm -rf "$root"
umask 022
mkdir -p "$root/DEBIAN"
# The installed files name the binary and the README by absolute path (as install.sh's
# at_prefix rewrites them for PREFIX): here /usr.
at_usr() {
  install -d "$(dirname "$2")"
  sed -e "s|/usr/local/bin/natledger|/usr/bin/natledger|" \
    -e "s|/usr/local/share/doc/natledger|/usr/share/doc/natledger|" "$1" > "$2"
  chmod 0644 "$2"
}

install -D -m 0755 "$binary" "$root/usr/bin/natledger"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/natledger"
ln -s natledger "$root/usr/bin/natledger-runtime"
at_usr hooks/natledger.json "$root/usr/share/containers/oci/hooks.d/natledger.json"
for unit in packaging/systemd/*; do
  at_usr "$unit" "$root/lib/systemd/system/$(basename "$unit")"
done
# The maintainer scripts run the install script's own steps (docs/packaging.md).
install -D -m 0755 scripts/cni-link.sh "$root/usr/lib/natledger/cni-link.sh"
install -D -m 0755 scripts/units.sh "$root/usr/lib/natledger/units.sh"
sed -i '1s|^#!/usr/bin/env bash$|#!/bin/bash|' "$root"/usr/lib/natledger/*.sh

doc=$root/usr/share/doc/natledger
install -D -m 0644 README.md "$doc/README.md"
# The years of the repository's history.
years=$(git log --format=%ad --date=format:%Y | sort -u | sed -n '1p;$p' | uniq | paste -sd-)
sed "s|@YEARS@|$years|" packaging/debian/copyright > "$doc/copyright"
chmod 0644 "$doc/copyright"
{
  echo "natledger ($version) unstable; urgency=medium"
  echo
  echo "  * Built from commit $commit by scripts/build-deb.sh."
  echo
  echo " -- $maintainer  $(date -R -u -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n > "$doc/changelog.Debian.gz"

if [ -x "$docs" ]; then
  gen=$(mktemp -d)
  trap 'rm -rf "$gen"' EXIT
  "$docs" "$gen"
  for page in "$gen"/man/man8/*.8; do
    install -D -m 0644 "$page" "$root/usr/share/man/man8/$(basename "$page")"
    gzip -9n "$root/usr/share/man/man8/$(basename "$page")"
  done
  install -D -m 0644 "$gen/completions/bash/natledger" \
    "$root/usr/share/bash-completion/completions/natledger"
  install -D -m 0644 "$gen/completions/zsh/_natledger" \
    "$root/usr/share/zsh/vendor-completions/_natledger"
  install -D -m 0644 "$gen/completions/fish/natledger.fish" \
    "$root/usr/share/fish/vendor_completions.d/natledger.fish"
else
  warn "no natledger-docs binary (cargo build --release --bin natledger-docs): the package has no man pages or completions"
fi

# A static binary is deliberate (docs/performance.md, "The released binary": the hook starts
# on every container start and stop, and makes no NSS lookup; scripts/build-release.sh checks it).
if file -L "$root/usr/bin/natledger" | grep -q 'statically linked'; then
  install -D -m 0644 /dev/stdin "$root/usr/share/lintian/overrides/natledger" <<'OVERRIDES'
# Static on purpose: a faster start for a process run on every container start and stop;
# natledger makes no NSS lookup (scripts/build-release.sh refuses a binary that links one).
natledger: statically-linked-binary [usr/bin/natledger]
OVERRIDES
fi

for script in postinst prerm postrm; do
  install -m 0755 "packaging/debian/$script" "$root/DEBIAN/$script"
done
# libc6, unless the binary is static (dpkg-shlibdeps wants a debian/control to read).
depends=
if file -L "$root/usr/bin/natledger" | grep -q 'dynamically linked'; then
  shlibs=$(mktemp -d)
  mkdir "$shlibs/debian"
  printf 'Source: natledger\n\nPackage: natledger\nArchitecture: any\n' > "$shlibs/debian/control"
  abs=$(realpath "$root/usr/bin/natledger")
  depends=$(cd "$shlibs" && dpkg-shlibdeps -O -e"$abs" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
  rm -rf "$shlibs"
  [ -n "$depends" ] && depends="$depends, "
fi
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@MAINTAINER@|$maintainer|" \
  -e "s|@SIZE@|$size|" -e "s|@DEPENDS@|$depends|" packaging/debian/control.in > "$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
  xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

deb=$out/natledger_${version}_$arch.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
realpath "$deb"
