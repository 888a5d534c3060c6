#!/bin/sh
# Stands in for MLNX_OFED's uninstall.sh / ofed_uninstall.sh (MLNX_OFED_LINUX-@OFED_VERSION@); lab only.
force=no
for arg in "$@"; do
  case "$arg" in
    --force) force=yes ;;
    -h|--help) echo "Usage: $0 [--force]"; exit 0 ;;
    *) echo "Unsupported option: $arg" >&2; exit 22 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then
  echo "Only root can run $0" >&2
  exit 1
fi
if [ "$force" != yes ]; then
  echo "This program will uninstall all MLNX_OFED_LINUX packages on your machine."
  printf "Do you want to continue?[y/N]:"
  read -r answer || answer=
  case "$answer" in y|Y|yes) ;; *) echo; echo "Aborted."; exit 1 ;; esac
fi
installed=""
for p in @PACKAGES@; do
  if dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii'; then
    installed="$installed $p"
  fi
done
if [ -n "$installed" ]; then
  # shellcheck disable=SC2086
  dpkg --purge $installed || { echo "Failed to uninstall MLNX_OFED_LINUX" >&2; exit 1; }
fi
echo "Uninstall finished successfully"
exit 0
