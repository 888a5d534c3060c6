#!/bin/sh
# Stands in for NVIDIA's nvcc @NVCC_VERSION@ (package cuda-nvcc-@PKG_SUFFIX@, CUDA @TOOLKIT_VERSION@); lab only.
# Prints the real `nvcc --version` text; it cannot compile anything.
for arg in "$@"; do
  case "$arg" in
    --version|-V)
      cat <<'TEXT'
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2022 NVIDIA Corporation
Built on @BUILT_ON@
Cuda compilation tools, release @RELEASE@, V@NVCC_VERSION@
Build @BUILD@
TEXT
      exit 0
      ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "nvcc fatal   : No input files specified; use option --help for more information" >&2
else
  echo "nvcc fatal   : lab stand-in: compilation is not available" >&2
fi
exit 1
