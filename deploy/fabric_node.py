"""What the fabric role leaves on the subnet manager's node, named once for roles/fabric/opensm.py
and verify (tests/verify/test_gpu_stack.py).

MLNX_OFED ships OpenSM as its own `opensm` deb (with libopensm), installed by mlnxofedinstall
with the rest of its packages; its service is `opensmd` (the MLNX_OFED user manual's "OpenSM"
chapter starts it as `/etc/init.d/opensmd start`; on Ubuntu systemd runs it as opensmd.service),
not started by the package.
"""

OPENSM_PACKAGE = "opensm"
OPENSMD_UNIT = "opensmd.service"
