#!/usr/bin/env bash
# natledger's systemd units: enabling, starting, stopping. Used by install.sh, uninstall.sh
# and the Debian package's maintainer scripts (installed as /usr/lib/natledger/units.sh), so
# a package install does exactly what the install script does.
#
#   units.sh enable    enable the units; where systemd runs, also daemon-reload, start the
#                      timer, and start natledger-runtime@X for each runtime X running now
#   units.sh disable   disable and stop the units whose file is installed (stopping a
#                      natledger-runtime@ unit runs its sweep), let a running timer sweep end
#
# Without a running systemd (no /run/systemd/system: a chroot, an image build) only the
# enable symlinks are made or removed: nothing is started, stopped or reloaded.
set -euo pipefail
UNITS=(natledger-boot.service natledger-sweep.timer natledger-runtime@docker.service
  natledger-runtime@containerd.service natledger-runtime@crio.service)
# Installed but not enabled (an operator's choice, docs/watch.md); disabled and stopped with
# the others.
OPTIONAL=(natledger-watch.service)
# Where the unit files are: install.sh's and the package's.
UNIT_DIRS=(/etc/systemd/system /lib/systemd/system)
running() { [ -d /run/systemd/system ]; }
installed() {
  local dir
  for dir in "${UNIT_DIRS[@]}"; do
    # natledger-runtime@X.service: the template's file.
    [ -e "$dir/${1/@*./@.}" ] && return 0
  done
  return 1
}
case ${1:-} in
enable)
  if running; then
    systemctl daemon-reload
    systemctl enable "${UNITS[@]}"
    systemctl start natledger-sweep.timer
    # A runtime that is already running: start its unit now, so that its next stop sweeps.
    for runtime in docker containerd crio; do
      if systemctl is-active --quiet "$runtime.service"; then
        systemctl start "natledger-runtime@$runtime.service"
      fi
    done
  else
    systemctl enable "${UNITS[@]}"
  fi
  ;;
disable)
  # Only the units whose file is still there, so that running this again after a failure
  # does not stop at an already removed unit.
  present=()
  for unit in "${UNITS[@]}" "${OPTIONAL[@]}"; do
    if installed "$unit"; then present+=("$unit"); fi
  done
  [ ${#present[@]} -gt 0 ] || exit 0
  if running; then
    # Stopping a natledger-runtime@ unit runs its sweep (a few seconds); let a running timer
    # sweep finish too, so that nothing runs the binary once it is gone.
    systemctl disable --now "${present[@]}"
    if installed natledger-sweep.service; then systemctl stop natledger-sweep.service; fi
  else
    systemctl disable "${present[@]}"
  fi
  ;;
*)
  echo "usage: ${0##*/} enable|disable" >&2
  exit 2
  ;;
esac
