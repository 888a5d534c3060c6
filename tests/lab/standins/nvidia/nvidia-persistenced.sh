#!/bin/sh
# Stands in for NVIDIA's nvidia-persistenced @VERSION@ (package nvidia-compute-utils-@BRANCH@); lab only.
# Persistence mode is on while the daemon runs unless --no-persistence-mode (the default is on:
# NVIDIA/nvidia-persistenced, nvidia-persistenced.1.m4); it forks (the unit is Type=forking)
# and drops the mode again when it stops, as the real daemon releases the devices.
# Without a loaded driver of its own version it fails the way the real one does ("failed to
# initialize. Check syslog", exit 1: journal excerpts in gpu-operator/HAMi reports).
RUN_DIR="${DTLAB_STANDIN_RUN_DIR:-/run/nvidia-standin}"
PID_DIR="${DTLAB_STANDIN_PERSISTENCED_DIR:-/var/run/nvidia-persistenced}"
persistence=1
user=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-persistence-mode) persistence=0 ;;
    --persistence-mode) persistence=1 ;;
    -u|--user) shift; user="$1" ;;
    --user=*) user="${1#--user=}" ;;
    -V|--verbose) ;;
    -v|--version) echo "nvidia-persistenced:  version @VERSION@"; exit 0 ;;
    *) echo "nvidia-persistenced: Unrecognized option: '$1'" >&2; exit 1 ;;
  esac
  shift
done
fail() {
  logger -t nvidia-persistenced "$1" 2>/dev/null || true
  echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2
  exit 1
}
[ "$(cat "$RUN_DIR/loaded-version" 2>/dev/null)" = "@VERSION@" ] \
  || fail "Failed to query NVIDIA devices. Please ensure that the NVIDIA device files (/dev/nvidia*) exist, and that user 0 has read and write permissions for those files."
if [ -n "$user" ] && ! id "$user" >/dev/null 2>&1; then
  fail "Failed to find user '$user'"
fi
mkdir -p "$PID_DIR" "$RUN_DIR"
(
  trap 'rm -f "$RUN_DIR/persistence-mode"; exit 0' TERM INT
  [ "$persistence" = 1 ] && : > "$RUN_DIR/persistence-mode"
  while :; do sleep 3600 & wait $!; done
) </dev/null >/dev/null 2>&1 &
echo $! > "$PID_DIR/nvidia-persistenced.pid"
logger -t nvidia-persistenced "Started ($!)" 2>/dev/null || true
exit 0
