#!/bin/sh
# Stands in for NVIDIA's nvidia-container-runtime @VERSION@ (package nvidia-container-toolkit-base); lab only.
# The real runtime (legacy mode) adds nvidia-container-runtime-hook to the OCI spec's prestart
# hooks and then runs runc; this one runs runc unchanged. GPUs reach the lab's containers through
# Docker's --gpus, for which dockerd adds the same hook itself (moby daemon/nvidia_linux.go), as
# Determined's agent asks for them.
for arg in "$@"; do
  if [ "$arg" = "--version" ] || [ "$arg" = "-v" ]; then
    echo "NVIDIA Container Runtime version @VERSION@"
    echo "commit: @COMMIT@"
    echo "spec: 1.1.0-rc.2"
    echo
    if command -v runc >/dev/null 2>&1; then runc --version; fi
    exit 0
  fi
done
if ! command -v runc >/dev/null 2>&1; then
  echo "nvidia-container-runtime: error locating runtime: no runtime binary found from candidate list: [docker-runc runc]" >&2
  exit 1
fi
exec runc "$@"
