# Builds stand-ins for NVIDIA's NCCL packages libnccl2 / libnccl-dev (2.14.3 and 2.13.4, +cuda11.7).
"""NCCL for the lab's CUDA repository: a real shared library compiled at mirror build time.

libnccl.so.<version> exports ncclGetVersion() returning NCCL_VERSION_CODE (21403 for 2.14.3),
so a check that loads the library (ctypes, or a linked program) sees the installed version;
and ncclGetUniqueId() bootstraps as NCCL 2.14 does: a NCCL_SOCKET_IFNAME that names no
interface here fails with NCCL's own "Bootstrap : no socket interface found" (nccl.c).
2.13.4 is what NVIDIA's CUDA 11.7.1 images ship; it is served too, so a version pin that
names the wrong release installs something that the 21403 check rejects.
"""

from __future__ import annotations

from tests.lab.debs import Symlink
from tests.lab.standins import compile_shared_library, render, source

STANDIN_NOTE = "\n This is a lab stand-in built by tests/lab; it contains no NVIDIA software."
RELEASES = ("2.14.3", "2.13.4")
CUDA_TAG = "cuda11.7"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def header(version: str) -> str:
    major, minor, patch = version.split(".")
    return render(
        source("nccl/nccl.h"),
        DEB_VERSION=f"{version}-1+{CUDA_TAG}",
        MAJOR=major,
        MINOR=minor,
        PATCH=patch,
        CODE=str(int(major) * 10000 + int(minor) * 100 + int(patch)),
    )


def build_release(ctx, version: str) -> None:
    deb_version = f"{version}-1+{CUDA_TAG}"
    h = header(version)
    library = compile_shared_library(h + "\n" + source("nccl/nccl.c"), "libnccl.so.2")
    ctx.build_deb(
        ctx.cuda_pool,
        "libnccl2",
        deb_version,
        {
            f"{LIBDIR}/libnccl.so.{version}": (library, 0o644),
            f"{LIBDIR}/libnccl.so.2": Symlink(f"libnccl.so.{version}"),
        },
        description=f"NVIDIA Collective Communication Library (NCCL) Runtime{STANDIN_NOTE}",
        extra_control={"Section": "libs", "Homepage": "https://developer.nvidia.com/nccl"},
        scripts={"triggers": "activate-noawait ldconfig\n"},
    )
    ctx.build_deb(
        ctx.cuda_pool,
        "libnccl-dev",
        deb_version,
        {
            "/usr/include/nccl.h": (h.encode(), 0o644),
            f"{LIBDIR}/libnccl.so": Symlink("libnccl.so.2"),
        },
        depends=[f"libnccl2 (= {deb_version})"],
        description=f"NVIDIA Collective Communication Library (NCCL) Development Files{STANDIN_NOTE}",
        extra_control={"Section": "libdevel", "Homepage": "https://developer.nvidia.com/nccl"},
    )


def build(ctx) -> None:
    for version in RELEASES:
        build_release(ctx, version)
