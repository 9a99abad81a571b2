#!/usr/bin/env bash
# Build natledger's container image, offline: an OCI image-layout archive
# (target/oci/natledger-VERSION.tar; its path is the LAST line of stdout, everything else goes
# to stderr) that `podman load -i` and `ctr -n k8s.io images import` accept, named
# natledger:VERSION (Cargo.toml's version). docs/kubernetes.md says how to push and run it.
#
# FROM scratch: one layer holding /natledger (the static release binary, stripped) and
# nothing else: no shell, no package manager, no iptables (the DaemonSet runs the host's
# tools through NATLEDGER_HOST_ROOT=/host). Entrypoint /natledger; labels
# org.opencontainers.image.{version,revision,source,...}.
#
# The binary: NATLEDGER_BINARY if set (a static binary built already), else
# scripts/build-release.sh's (its last stdout line is the binary's path). A dynamically linked
# binary is refused: there is no loader in the image.
#
# Reproducible: the same binary and commit give the same archive byte for byte. Every date is
# SOURCE_DATE_EPOCH (default: the last commit's time); files are owned by 0:0, the tars are
# sorted by name, gzip -n stores no name or time.
#
# archive.tar: oci-layout     {"imageLayoutVersion":"1.0.0"}
#              index.json     one manifest, annotated org.opencontainers.image.ref.name
#                             (natledger:VERSION, what podman names it) and
#                             io.containerd.image.name (docker.io/library/natledger:VERSION,
#                             what ctr names it)
#              blobs/sha256/  the layer (tar+gzip), the config, the manifest
#
# Tools: tar (GNU), gzip, sha256sum, strip (binutils), readelf; no network, no jq.
set -euo pipefail
cd "$(dirname "$0")/.."
me=${0##*/}
fail() { echo "$me: $*" >&2; exit 1; }

if [ -n "${NATLEDGER_BINARY:-}" ]; then
  binary=$NATLEDGER_BINARY
else
  binary=$(scripts/build-release.sh | tail -n 1)
fi
[ -x "$binary" ] || fail "no executable at $binary"
if readelf -l "$binary" | grep -q INTERP; then
  fail "$binary is dynamically linked: the image has no loader (use scripts/build-release.sh)"
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || fail "no version in Cargo.toml"
revision=${NATLEDGER_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
source_url=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
source_url=${source_url:-https://github.com/natledger/natledger}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
case "$(readelf -h "$binary" | sed -n 's/^ *Machine: *//p')" in
  *X86-64*) arch=amd64 ;;
  *AArch64*) arch=arm64 ;;
  *) fail "$binary: an architecture this script does not name" ;;
esac
name=natledger:$version
containerd_name=docker.io/library/$name

target_dir=${CARGO_TARGET_DIR:-target}
out=$target_dir/oci
work=$out/natledger-$version.d
archive=$out/natledger-$version.tar
rm -rf "$work"
mkdir -p "$work/rootfs" "$work/layout/blobs/sha256"
umask 022

# Deterministic tar of DIR's NAMES: sorted, 0:0, fixed mtime, ustar (no pax times).
det_tar() {
  local dir=$1
  shift
  tar --create --file=- --directory="$dir" --format=ustar --sort=name \
    --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    --mode='u+rwX,go+rX,go-w' "$@"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
# Moves FILE into the layout's blobs under its digest; prints its digest (hex).
blob() {
  local digest
  digest=$(sha "$1")
  mv "$1" "$work/layout/blobs/sha256/$digest"
  echo "$digest"
}

# The layer: /natledger, stripped as the .deb strips it (the symbol table is only for
# build-release.sh's NSS check).
install -m 0755 "$binary" "$work/rootfs/natledger"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$work/rootfs/natledger"
det_tar "$work/rootfs" natledger > "$work/layer.tar"
diff_id=$(sha "$work/layer.tar")
gzip -n -9 < "$work/layer.tar" > "$work/layer.tar.gz"
rm "$work/layer.tar"
layer_size=$(size "$work/layer.tar.gz")
layer=$(blob "$work/layer.tar.gz")

labels=$(printf '"%s":"%s",' \
  org.opencontainers.image.title natledger \
  org.opencontainers.image.description "records and removes exactly the NAT port forwards it writes" \
  org.opencontainers.image.version "$version" \
  org.opencontainers.image.revision "$revision" \
  org.opencontainers.image.source "$source_url" \
  org.opencontainers.image.created "$created")
labels={${labels%,}}
# The image config (OCI image spec, config.md). No Env: natledger needs no PATH of its own
# (the host's tools run chrooted under NATLEDGER_HOST_ROOT with the host's PATH).
printf '{"created":"%s","architecture":"%s","os":"linux","config":{"Entrypoint":["/natledger"],"Labels":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"scripts/build-image.sh"}]}' \
  "$created" "$arch" "$labels" "$diff_id" "$created" > "$work/config.json"
config_size=$(size "$work/config.json")
config=$(blob "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":%s}' \
  "$config" "$config_size" "$layer" "$layer_size" "$labels" > "$work/manifest.json"
manifest_size=$(size "$work/manifest.json")
manifest=$(blob "$work/manifest.json")

printf '{"imageLayoutVersion":"1.0.0"}' > "$work/layout/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest" "$manifest_size" "$arch" "$containerd_name" "$name" > "$work/layout/index.json"

det_tar "$work/layout" oci-layout index.json blobs > "$archive.tmp"
mv "$archive.tmp" "$archive"
rm -rf "$work"
echo "$me: $name ($containerd_name), manifest sha256:$manifest, layer $layer_size bytes" >&2
case "$archive" in /*) echo "$archive" ;; *) echo "$PWD/$archive" ;; esac
