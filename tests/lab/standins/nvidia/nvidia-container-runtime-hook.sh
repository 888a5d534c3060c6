#!/bin/sh
# Stands in for NVIDIA's nvidia-container-runtime-hook @VERSION@ (package nvidia-container-toolkit); lab only.
# A prestart hook with no GPUs to mount: succeed without changing the container.
if [ "$1" = "--version" ] || [ "$1" = "-version" ]; then
  echo "NVIDIA Container Runtime Hook version @VERSION@"
  echo "commit: @COMMIT@"
fi
exit 0
