"""Names the GPU stack's roles leave on a node: the GPU services (roles/nvidia/gpu_services.py) and the
held kernel packages (roles/shared/kernel.py), named once here for those roles and for
tests/verify/test_gpu_stack.py, which checks them. No role module: verify imports none
(tests/unit/test_shape.py).
"""

from __future__ import annotations

FABRICMANAGER = "nvidia-fabricmanager.service"
PEERMEM = "/etc/modules-load.d/nvidia-peermem.conf"  # GPUDirect RDMA's module, loaded at boot
PEERMEM_MODULE = "nvidia_peermem"  # its name in /sys/module (kmod takes '-' and '_' alike)

# The kernel hold: MLNX_OFED's --add-kernel-support modules are built for one kernel, without
# DKMS, so the running kernel's packages stay held and unattended-upgrades leaves them.
# The packages of one kernel build (Ubuntu splits the modules out of the image).
PER_RELEASE = ("linux-image-{}", "linux-headers-{}", "linux-modules-{}", "linux-modules-extra-{}")
# What pulls a newer kernel in on an upgrade: Ubuntu's meta packages (GA and HWE), and Debian's
# (linux-image-amd64 Depends on the current linux-image-<abi>-amd64; -cloud- for cloud images):
# without them a Debian node's security update installs a kernel MLNX_OFED was not built for.
META = tuple(
    f"linux-{kind}{track}"
    for kind in ("generic", "image-generic", "headers-generic")
    for track in ("", "-hwe-20.04", "-hwe-22.04")
) + tuple(f"linux-{kind}-{flavour}amd64" for kind in ("image", "headers") for flavour in ("", "cloud-"))
UU_CONF = "/etc/apt/apt.conf.d/51gpu-cluster-kernel"


def headers_package(release: str) -> str:
    return f"linux-headers-{release}"


def hold_candidates(release: str) -> list[str]:
    return [p.format(release) for p in PER_RELEASE] + list(META)


def _regex(name: str) -> str:
    # No backslashes: apt.conf would need them escaped. [.] and [+] match themselves.
    return "^" + name.replace(".", "[.]").replace("+", "[+]") + "$"


def uu_blacklist_entries(release: str) -> list[str]:
    """Unattended-Upgrade::Package-Blacklist entries (Python regular expressions matched against
    package names) for this kernel's packages and the metas."""
    return [_regex(e) for e in hold_candidates(release)]
