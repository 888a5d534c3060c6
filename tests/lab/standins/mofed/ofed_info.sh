#!/bin/sh
# Stands in for MLNX_OFED's ofed_info (package ofed-scripts @SCRIPTS_VERSION@, MLNX_OFED_LINUX-@OFED_VERSION@); lab only.
case "$1" in
  -s)
    echo "MLNX_OFED_LINUX-@OFED_VERSION@:"
    ;;
  -n)
    echo "@OFED_VERSION@"
    ;;
  "")
    echo "MLNX_OFED_LINUX-@OFED_VERSION@ (OFED-@OFED_BASE@):"
    echo
    echo "Installed Packages:"
    echo "-------------------"
    dpkg-query -W -f='ii  ${Package}  ${Version}\n' @PACKAGES@ 2>/dev/null
    ;;
  *)
    echo "Usage: ofed_info [-s|-n]" >&2
    echo "    -s  Show package name and version number." >&2
    echo "    -n  Show numerical version number only." >&2
    exit 1
    ;;
esac
exit 0
