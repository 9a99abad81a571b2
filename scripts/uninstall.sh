#!/usr/bin/env bash
# Undo scripts/install.sh: remove the hooks.d file, the CNI plugin link and the systemd
# units, remove every rule natledger owns (`natledger sweep --all`: live containers' rules
# too, since no hook will remove them later), then the binary, its README and its state.
# PREFIX as for install.sh.
set -euo pipefail
PREFIX=${PREFIX:-/usr/local}

# First, no new rules: podman and CRI-O stop calling the hook for new containers.
rm -f /usr/share/containers/oci/hooks.d/natledger.json
# A conflist still naming natledger fails every ADD and DEL once the plugin is gone: say so
# (switch it back to portmap first, docs/cni.md).
for conf in /etc/cni/net.d/* /etc/containers/networks/*; do
  if [ -f "$conf" ] && grep -q '"type": *"natledger"' "$conf"; then
    echo "scripts/uninstall.sh: warning: $conf names the natledger CNI plugin" >&2
  fi
done
scripts_dir=$(dirname "$0")
"$scripts_dir/cni-link.sh" remove "$PREFIX/bin/natledger"
# Disable and stop the units (stopping natledger-runtime@X sweeps once more).
"$scripts_dir/units.sh" disable
rm -f /etc/systemd/system/natledger-boot.service /etc/systemd/system/natledger-sweep.service \
  /etc/systemd/system/natledger-sweep.timer /etc/systemd/system/natledger-runtime@.service \
  /etc/systemd/system/natledger-watch.service
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl reset-failed 'natledger-*' 2>/dev/null || true
fi

if [ -x "$PREFIX/bin/natledger" ] && ! "$PREFIX/bin/natledger" sweep --all; then
  echo "scripts/uninstall.sh: 'natledger sweep --all' failed, natledger rules remain;" \
    "$PREFIX/bin/natledger is kept: fix the cause and run scripts/uninstall.sh again" >&2
  exit 1
fi
rm -f "$PREFIX/bin/natledger" "$PREFIX/bin/natledger-runtime"
rm -rf "$PREFIX/share/doc/natledger" /run/natledger
echo "natledger uninstalled; runc/crun bundles that name it in config.json still need editing"
