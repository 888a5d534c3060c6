#!/bin/sh
# Stands in for the NVIDIA kernel module (nvidia.ko from nvidia-dkms-@BRANCH@) being loaded at boot; lab only.
# The "module" loaded in this boot is the version installed on disk when the node booted:
# nvidia-smi compares it with its own userspace version, so a driver change needs a reboot.
# On a node with NVSwitches (NVIDIA PCI devices of class 0x068000) the fabric starts "Not
# Started": the stand-in libcuda's cuInit fails with 802 until nv-fabricmanager has run (it
# writes "Completed"). Written before loaded-version, which the fabric manager waits for.
set -e
mkdir -p /run/nvidia-standin
rm -f /run/nvidia-standin/fabric-state
for d in /sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] && [ -r "$d/class" ] || continue
  if [ "$(cat "$d/vendor")" = 0x10de ] && [ "$(cat "$d/class")" = 0x068000 ]; then
    echo "Not Started" > /run/nvidia-standin/fabric-state
    break
  fi
done
cp /usr/lib/nvidia-standin/module-version /run/nvidia-standin/loaded-version
# The device nodes the loaded driver has (nvidia-modprobe and udev make them on real hardware,
# with the driver's fixed major 195: /dev/nvidiactl is minor 255, /dev/nvidia<N> minor N; the
# UVM major is dynamic). nvidia-container-cli bind-mounts them into GPU containers.
mknod_once() { [ -e "$1" ] || mknod -m 666 "$1" c "$2" "$3"; }
mknod_once /dev/nvidiactl 195 255
mknod_once /dev/nvidia-uvm 510 0
mknod_once /dev/nvidia-uvm-tools 510 1
count="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
i=0
while [ "$i" -lt "${count:-0}" ]; do
  mknod_once "/dev/nvidia$i" 195 "$i"
  i=$((i + 1))
done
