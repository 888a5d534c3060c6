# Stand-ins for NVIDIA CUDA 11.7.1 toolkit packages (lab only).
