"""The pinned GPU and fabric stack: versions from cluster.yaml -> exact package strings.

Everything here is pure (no pyinfra, no I/O) so the mapping can be unit tested. The rules
follow how NVIDIA's CUDA apt repository and Mellanox name their packages and releases:

- driver 515.65.01: the meta package `cuda-drivers-515=515.65.01-1`; the packages under it
  carry `515.65.01-0ubuntu1`. Ubuntu's own archive ships the same driver as
  `515.65.01-0ubuntu0.20.04.1`, so every sub-package is pinned by its exact NVIDIA version,
  never left for apt to choose.
- CUDA 11.7.1: `cuda-toolkit-11-7=11.7.1-1`, never `cuda-11-7` (that one pulls
  cuda-runtime-11-7 and with it a driver of apt's choice, breaking the driver pin).
- NCCL 2.14.3 built for CUDA 11.7: `libnccl2` and `libnccl-dev` at `2.14.3-1+cuda11.7`.
- MLNX_OFED 5.8-3.0.7.0: `ofed_info -s` prints `MLNX_OFED_LINUX-5.8-3.0.7.0:`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The `Origin:` field of the Release file of NVIDIA's CUDA repository: what apt preferences
# match with `Pin: release o=...`. A mirror copies the Release file unchanged (it must:
# InRelease is signed), so a mirrored repo keeps this origin.
NVIDIA_REPO_ORIGIN = "NVIDIA"

# The keyring package NVIDIA publishes in every repo folder; it installs this keyring file
# and a sources list named after the repo folder (ours replaces that list, same name).
CUDA_KEYRING_PACKAGE = "cuda-keyring"
CUDA_KEYRING_VERSION = "1.1-1"
CUDA_KEYRING_DEB = f"{CUDA_KEYRING_PACKAGE}_{CUDA_KEYRING_VERSION}_all.deb"
CUDA_KEYRING_FILE = "/usr/share/keyrings/cuda-archive-keyring.gpg"

# Debian revisions NVIDIA's repo uses for the driver: the meta package vs. what it pulls in.
DRIVER_META_REVISION = "1"
DRIVER_PACKAGE_REVISION = "0ubuntu1"
# Every package of the driver's dependency graph that carries the driver's own version: what
# cuda-drivers-<branch> pulls in, nvidia-driver-<branch>'s Depends with it (Ubuntu's
# nvidia-graphics-drivers-<branch> debian/templates/control.in, which NVIDIA builds its repo's
# driver packages from; docs/lab.md, "Stand-ins"). Each is pinned and held, none left to apt:
# nvidia-driver-515 Depends on exact versions (`= 515.65.01-0ubuntu1`, or a range only that
# build falls in) of packages NVIDIA's repo also has in newer builds of the same branch
# (515.86.01, 515.105.01). apt only ever considers a package's candidate, so one sub-package
# left unpinned is a candidate the driver cannot take: "Depends: libnvidia-gl-515 (=
# 515.65.01-0ubuntu1) but 515.105.01-0ubuntu1 is to be installed ... you have held broken
# packages". Named in full rather than by an apt preferences pattern (`Package: *-515`): the
# holds need the names anyway, and a pattern would also catch the fabric manager
# (nvidia-fabricmanager-515, pinned at <version>-1 in its own file) and miss nvidia-modprobe.
# tests/unit/test_driver_graph.py checks this list against the stand-in repo's graph.
DRIVER_SUBPACKAGES = (
    "nvidia-driver-{branch}",
    "nvidia-dkms-{branch}",
    "nvidia-kernel-common-{branch}",
    "nvidia-kernel-source-{branch}",
    "libnvidia-compute-{branch}",
    # nvidia-persistenced and its unit (roles/nvidia/gpu_services.py turns persistence mode on).
    "nvidia-compute-utils-{branch}",
    "nvidia-utils-{branch}",
    "libnvidia-gl-{branch}",
    # Architecture: all (libnvidia-common-515_515.65.01-0ubuntu1_all.deb); libnvidia-gl's one
    # unversioned dependency, pinned so it is not 515.105.01's files beside 515.65.01's.
    "libnvidia-common-{branch}",
    "libnvidia-extra-{branch}",
    "libnvidia-decode-{branch}",
    "libnvidia-encode-{branch}",
    "libnvidia-fbc1-{branch}",
    "libnvidia-cfg1-{branch}",
    "xserver-xorg-video-nvidia-{branch}",
    "nvidia-modprobe",
)
# nvidia-driver-<branch> also Recommends nvidia-settings (unversioned: apt would take the
# repo's newest, another branch's) and nvidia-prime, X11 desktop tools a GPU server does not
# use. The driver is installed without Recommends (PinSet.recommends) rather than pinning them.

CUDA_PACKAGE_REVISION = "1"
NCCL_PACKAGE_REVISION = "1"
NCCL_LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu"
CUDA_LINK = "/usr/local/cuda"

_DRIVER = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")
_CUDA = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_NCCL = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_MOFED = re.compile(r"^\d+\.\d+-[\d.]+$")


class PinError(ValueError):
    """A version string that cannot be turned into NVIDIA's or Mellanox' package names."""


@dataclass(frozen=True)
class PinSet:
    """Packages installed at exact versions and held there, as one unit.

    name: a short file-system-safe name (the apt preferences file is named after it).
    packages: (package, version) in install order.
    recommends: install the packages' Recommends too (apt's default). Off where a Recommends
        would be a package outside the pin, at a version of apt's choosing.
    """

    name: str
    packages: tuple[tuple[str, str], ...]
    origin: str = NVIDIA_REPO_ORIGIN
    recommends: bool = True

    def as_dict(self) -> dict[str, str]:
        return dict(self.packages)

    def install_args(self) -> list[str]:
        """`pkg=version` arguments for apt-get install."""
        return [f"{p}={v}" for p, v in self.packages]


def _match(pattern: re.Pattern, version: str, what: str, example: str) -> re.Match:
    m = pattern.match(str(version))
    if not m:
        raise PinError(f"{what} version {version!r} is not like {example}")
    return m


def driver_branch(version: str) -> str:
    """515.65.01 -> "515": NVIDIA names the driver packages after the branch."""
    return _match(_DRIVER, version, "NVIDIA driver", "515.65.01").group(1)


def driver_pins(version: str) -> PinSet:
    """515.65.01 -> cuda-drivers-515=515.65.01-1 and its sub-packages at 515.65.01-0ubuntu1."""
    branch = driver_branch(version)
    meta = (f"cuda-drivers-{branch}", f"{version}-{DRIVER_META_REVISION}")
    subs = tuple(
        (name.format(branch=branch), f"{version}-{DRIVER_PACKAGE_REVISION}") for name in DRIVER_SUBPACKAGES
    )
    return PinSet(name="nvidia-driver", packages=(meta,) + subs, recommends=False)


def cuda_major_minor(version: str) -> str:
    """11.7.1 -> "11.7"."""
    m = _match(_CUDA, version, "CUDA", "11.7.1")
    return f"{m.group(1)}.{m.group(2)}"


def cuda_pins(version: str) -> PinSet:
    """11.7.1 -> cuda-toolkit-11-7=11.7.1-1 (the toolkit only: cuda-11-7 pulls a driver)."""
    dashed = cuda_major_minor(version).replace(".", "-")
    return PinSet(
        name="cuda-toolkit",
        packages=((f"cuda-toolkit-{dashed}", f"{version}-{CUDA_PACKAGE_REVISION}"),),
    )


def cuda_home(version: str) -> str:
    """11.7.1 -> /usr/local/cuda-11.7, where NVIDIA's packages install the toolkit."""
    return f"/usr/local/cuda-{cuda_major_minor(version)}"


def nccl_package_version(nccl_version: str, cuda_version: str) -> str:
    """2.14.3 built for CUDA 11.7.x -> 2.14.3-1+cuda11.7."""
    _match(_NCCL, nccl_version, "NCCL", "2.14.3")
    return f"{nccl_version}-{NCCL_PACKAGE_REVISION}+cuda{cuda_major_minor(cuda_version)}"


def nccl_pins(nccl_version: str, cuda_version: str) -> PinSet:
    version = nccl_package_version(nccl_version, cuda_version)
    return PinSet(name="nccl", packages=(("libnccl2", version), ("libnccl-dev", version)))


def nccl_version_code(nccl_version: str) -> int:
    """2.14.3 -> 21403, what ncclGetVersion() returns (major*10000 + minor*100 + patch)."""
    major, minor, patch = (int(x) for x in _match(_NCCL, nccl_version, "NCCL", "2.14.3").groups())
    return major * 10000 + minor * 100 + patch


def nccl_library(nccl_version: str) -> str:
    """The shared object the libnccl2 package installs, named with the full version."""
    _match(_NCCL, nccl_version, "NCCL", "2.14.3")
    return f"{NCCL_LIBRARY_DIR}/libnccl.so.{nccl_version}"


def ofed_release(mofed_version: str) -> str:
    """5.8-3.0.7.0 -> MLNX_OFED_LINUX-5.8-3.0.7.0 (`ofed_info -s` without its trailing colon)."""
    _match(_MOFED, mofed_version, "MLNX_OFED", "5.8-3.0.7.0")
    return f"MLNX_OFED_LINUX-{mofed_version}"


# NVIDIA's repo names the fabric manager after the driver branch and versions it like the
# driver's meta package: nvidia-fabricmanager-515_515.65.01-1_amd64.deb. It refuses to start
# on another driver version ("fabric manager NVIDIA GPU driver interface version X don't match
# with driver version Y"), so it is pinned from the driver's version, never set on its own.
FABRICMANAGER_REVISION = "1"


def fabricmanager_pins(driver_version: str) -> PinSet:
    """515.65.01 -> nvidia-fabricmanager-515=515.65.01-1 (NVSwitch nodes only)."""
    branch = driver_branch(driver_version)
    return PinSet(
        name="nvidia-fabricmanager",
        packages=((f"nvidia-fabricmanager-{branch}", f"{driver_version}-{FABRICMANAGER_REVISION}"),),
    )


# The NVIDIA Container Toolkit at one exact build, held. Why held: NVIDIA's notice on
# containers losing their GPUs (NVIDIA/nvidia-docker#1730, which the toolkit's install guide
# points to) is that with Docker's systemd cgroup driver a `systemctl daemon-reload` detaches
# GPUs from running containers ("Failed to initialize NVML: Unknown Error" until the container
# is recreated), and upgrading the toolkit's packages runs daemon-reload. Held, it changes only
# when a deploy moves the pin, never by an unattended upgrade under running trials. A constant
# rather than a cluster.yaml key: no site needs another build, and a change is a code change
# the lab's stand-in (tests/lab/standins/nvidia/build.py, TOOLKIT_DEB_VERSION) must follow.
CONTAINER_TOOLKIT_VERSION = "1.13.5-1"
# nvidia-container-toolkit Depends on the other three (NVIDIA's packaging): libnvidia-container
# (>= its version) would otherwise move alone to the repo's newest.
CONTAINER_TOOLKIT_PACKAGES = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)


def container_toolkit_pins() -> PinSet:
    """nvidia-container-toolkit and the libnvidia-container packages under it, one build."""
    return PinSet(
        name="nvidia-container-toolkit",
        packages=tuple((p, CONTAINER_TOOLKIT_VERSION) for p in CONTAINER_TOOLKIT_PACKAGES),
    )


def all_pins(versions) -> tuple[PinSet, ...]:
    """Every PinSet of a node with GPUs, from the model's `versions`."""
    return (
        driver_pins(versions.nvidia_driver),
        cuda_pins(versions.cuda),
        nccl_pins(versions.nccl, versions.cuda),
        container_toolkit_pins(),
    )
