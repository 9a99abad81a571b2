#!/usr/bin/env bash
# natledger as a CNI plugin: a runtime runs the plugin named by a conflist's "type" from its
# CNI plugin directory, so natledger is linked there as `natledger`. The directories are
# Debian's (/usr/lib/cni, containernetworking-plugins) and the upstream one (/opt/cni/bin:
# containerd, Kubernetes); only those that exist are touched (no CNI on the host, no link).
#
#   scripts/cni-link.sh install BINARY   link DIR/natledger -> BINARY (again: no change)
#   scripts/cni-link.sh remove BINARY    remove DIR/natledger if it is that link
#
# ROOT (default empty) is put before every directory (an image build, tests/it/install_cni.rs);
# BINARY is the path as the installed system sees it. An operator's own file or link to
# another binary at DIR/natledger is left alone, with a warning. Used by install.sh and
# uninstall.sh.
set -euo pipefail
usage="usage: ${0##*/} install|remove BINARY"
action=${1:?$usage}
binary=${2:?$usage}
ROOT=${ROOT:-}
CNI_DIRS=(/usr/lib/cni /opt/cni/bin)
for dir in "${CNI_DIRS[@]}"; do
  [ -d "$ROOT$dir" ] || continue
  link=$ROOT$dir/natledger
  ours=false
  if [ -L "$link" ] && [ "$(readlink "$link")" = "$binary" ]; then ours=true; fi
  case $action in
  install)
    if [ -e "$link" ] || [ -L "$link" ]; then
      if ! $ours; then
        echo "${0##*/}: $link exists and is not a link to $binary: left alone" >&2
      fi
      continue
    fi
    ln -s "$binary" "$link"
    echo "CNI plugin: $dir/natledger -> $binary"
    ;;
  remove)
    if $ours; then
      rm -f "$link"
    elif [ -e "$link" ] || [ -L "$link" ]; then
      echo "${0##*/}: $link is not a link to $binary: left alone" >&2
    fi
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
  esac
done
