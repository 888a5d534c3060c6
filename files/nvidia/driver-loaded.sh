#!/bin/sh
# driver-loaded.sh VERSION SECONDS, from roles/nvidia/driver.py after its reboot: wait up to
# SECONDS for nvidia-smi to report VERSION on every GPU, else fail with what nvidia-smi said,
# so that a reboot that did not load the new module stops this host here.
set -u
version=$1 seconds=$2
v=
for _ in $(seq $((seconds / 2))); do
    v=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader,nounits 2>&1 | sort -u)
    [ "$v" = "$version" ] && exit 0
    sleep 2
done
echo "driver $version is not loaded after the reboot; nvidia-smi says: $v" >&2
exit 1
