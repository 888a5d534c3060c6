#!/bin/sh
# Stands in for NVIDIA's nvidia-modprobe @VERSION@ (creates /dev/nvidia* nodes on real hardware); lab only.
case "$1" in
  -v|--version)
    echo "nvidia-modprobe: version @VERSION@"
    ;;
esac
exit 0
