#!/bin/sh
# Stands in for the NVIDIA kernel module (nvidia.ko from nvidia-dkms-@BRANCH@) being loaded at boot; lab only.
# The "module" loaded in this boot is the version installed on disk when the node booted:
# nvidia-smi compares it with its own userspace version, so a driver change needs a reboot.
set -e
mkdir -p /run/nvidia-standin
cp /usr/lib/nvidia-standin/module-version /run/nvidia-standin/loaded-version
