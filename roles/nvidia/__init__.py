"""The GPU stack on agents: the NVIDIA driver (driver), its services (gpu_services), the CUDA
toolkit (cuda), NCCL (nccl). Files: files/nvidia/.
"""
