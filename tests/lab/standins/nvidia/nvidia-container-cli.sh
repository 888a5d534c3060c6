#!/bin/sh
# Stands in for NVIDIA's nvidia-container-cli @VERSION@ (package libnvidia-container-tools); lab only.
case "$1" in
  --version|-V)
    echo "cli-version: @VERSION@"
    echo "lib-version: @VERSION@"
    echo "build date: 2023-07-18T11:00+00:00"
    echo "build revision: @COMMIT@"
    echo "build platform: x86_64"
    exit 0
    ;;
  info)
    nvidia-smi -L >/dev/null 2>&1
    case $? in
      0) ;;
      18) echo "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch" >&2; exit 1 ;;
      *) echo "nvidia-container-cli: initialization error: nvml error: driver not loaded" >&2; exit 1 ;;
    esac
    echo "NVRM version:   $(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0)"
    echo "CUDA version:   $(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9.]*\).*/\1/p')"
    echo
    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id --format=csv,noheader |
      while IFS=, read -r idx name uuid bus; do
        echo "Device Index:   $idx"
        echo "Device Minor:   $idx"
        echo "Model:         $name"
        echo "Brand:          Nvidia"
        echo "GPU UUID:      $uuid"
        echo "Bus Location:  $bus"
        echo "Architecture:   8.0"
        echo
      done
    exit 0
    ;;
  *)
    echo "nvidia-container-cli: lab stand-in supports only --version and info" >&2
    exit 1
    ;;
esac
