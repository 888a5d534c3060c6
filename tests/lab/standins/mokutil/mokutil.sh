#!/bin/sh
# Stands in for mokutil (--sb-state only; Ubuntu ships it with shim-signed); lab only.
# The node's firmware state is a lab setting: /etc/dtlab/secure-boot holds "enabled",
# "disabled" or "bios" (no EFI); missing means disabled. Output, streams and exit codes are
# mokutil's (src/mokutil.c of github.com/lcp/mokutil, 0.3.0 to 0.7.2): main() prints
# "EFI variables are not supported on this system" to stderr and exits 1 without EFI;
# sb_state() prints "SecureBoot enabled" / "SecureBoot disabled" to stdout and returns 0.
state=$(cat /etc/dtlab/secure-boot 2>/dev/null || echo disabled)
case "$1" in
  --sb-state)
    case "$state" in
      bios)
        echo "EFI variables are not supported on this system" >&2
        exit 1
        ;;
      enabled)
        echo "SecureBoot enabled"
        ;;
      *)
        echo "SecureBoot disabled"
        ;;
    esac
    exit 0
    ;;
  *)
    # The lab only answers what the deploy asks; anything else is a lab bug, said loudly.
    echo "mokutil stand-in: only --sb-state is implemented, not: $*" >&2
    exit 2
    ;;
esac
