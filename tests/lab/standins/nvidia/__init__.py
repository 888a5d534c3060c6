# Stand-ins for NVIDIA driver packages, cuda-keyring and the NVIDIA Container Toolkit (lab only).
