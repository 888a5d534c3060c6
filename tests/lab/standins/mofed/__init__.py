# Stand-ins for NVIDIA MLNX_OFED 5.8-3.0.7.0 installer tarballs (lab only).
