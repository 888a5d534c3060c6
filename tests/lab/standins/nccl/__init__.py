# Stand-ins for NVIDIA NCCL packages libnccl2 / libnccl-dev (lab only).
