#!/bin/sh
# Stands in for NVIDIA's nv-fabricmanager @VERSION@ (package nvidia-fabricmanager-@BRANCH@); lab only.
# Refuses as the real one does, exit 1 so that nvidia-fabricmanager.service fails:
# - a loaded driver of another version: "fabric manager NVIDIA GPU driver interface version X
#   don't match with driver version Y. Please update with matching NVIDIA driver package."
#   (NVIDIA/gpu-operator#544, siderolabs/pkgs#720);
# - no NVSwitch: "request to query NVSwitch device information from NVSwitch driver failed
#   with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]" (NVIDIA/gpu-operator#610).
# NVSwitches are NVIDIA PCI devices of class 0x068000, read from sysfs as the deploy does.
# Running, it has trained the fabric: $RUN_DIR/fabric-state says "Completed" (the stand-in
# libcuda's cuInit then succeeds); stopped, "Not Started" again (cuInit: 802, system not ready).
RUN_DIR="${DTLAB_STANDIN_RUN_DIR:-/run/nvidia-standin}"
PCI_DEVICES="${DTLAB_STANDIN_PCI_DEVICES:-/sys/bus/pci/devices}"
PID_FILE="${DTLAB_STANDIN_FM_PID:-/var/run/nvidia-fabricmanager/nv-fabricmanager.pid}"
loaded="$(cat "$RUN_DIR/loaded-version" 2>/dev/null)"
if [ -z "$loaded" ]; then
  # No source for the real message here: the stand-in says what it is.
  echo "nv-fabricmanager (lab stand-in): no NVIDIA driver is loaded" >&2
  exit 1
fi
if [ "$loaded" != "@VERSION@" ]; then
  echo "fabric manager NVIDIA GPU driver interface version @VERSION@ don't match with driver version $loaded. Please update with matching NVIDIA driver package." >&2
  exit 1
fi
switches=0
for d in "$PCI_DEVICES"/*; do
  [ -r "$d/vendor" ] && [ -r "$d/class" ] || continue
  if [ "$(cat "$d/vendor")" = 0x10de ] && [ "$(cat "$d/class")" = 0x068000 ]; then
    switches=$((switches + 1))
  fi
done
if [ "$switches" = 0 ]; then
  echo "request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]" >&2
  exit 1
fi
mkdir -p "$(dirname "$PID_FILE")"
echo Completed > "$RUN_DIR/fabric-state"
# The daemon writes its own pid once its TERM trap is set, and the parent returns only then
# (systemd's Type=forking reads PIDFile= when the parent exits): a stop right after the start
# must find the trap, or the fabric would stay "Completed" with no fabric manager.
rm -f "$PID_FILE"
(
  trap 'echo "Not Started" > "$RUN_DIR/fabric-state"; exit 0' TERM INT
  # $(exec sh ...) runs sh in place of the substitution's fork: its parent is this subshell.
  echo "$(exec sh -c 'echo "$PPID"')" > "$PID_FILE"
  while :; do sleep 3600 & wait $!; done
) </dev/null >/dev/null 2>&1 &
while [ ! -s "$PID_FILE" ]; do sleep 0.05; done
exit 0
