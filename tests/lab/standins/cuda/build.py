# Builds stand-ins for NVIDIA's CUDA 11.7.1 toolkit packages (cuda-toolkit-11-7, cuda-nvcc-11-7, cuda-11-7).
"""CUDA 11.7.1 packages for the lab's CUDA repository, with NVIDIA's dependency structure.

- cuda-toolkit-11-7 (11.7.1-1) -> cuda-nvcc-11-7 (11.7.99-1) and
  cuda-toolkit-11-7-config-common, whose postinst points the `cuda` and `cuda-11`
  alternatives (/usr/local/cuda, /usr/local/cuda-11) at /usr/local/cuda-11.7.
- The trap: cuda-11-7 (11.7.1-1) -> cuda-runtime-11-7 -> cuda-drivers (>= 515.65.01), which
  an unpinned apt satisfies with the newest driver in the repository.
"""

from __future__ import annotations

import json

from tests.lab.standins import render, source

STANDIN_NOTE = "\n This is a lab stand-in built by tests/lab; it contains no NVIDIA software."

TOOLKIT = "11.7.1"  # CUDA release
RELEASE = "11.7"
SUFFIX = "11-7"  # package name suffix
NVCC = "11.7.99"
NVCC_BUILT_ON = "Wed_Jun__8_16:49:14_PDT_2022"
NVCC_BUILD = "cuda_11.7.r11.7/compiler.31442593_0"
PREFIX = f"/usr/local/cuda-{RELEASE}"
ALT_PRIORITY = "117"
MIN_DRIVER = "515.65.01"


def build(ctx) -> None:
    pool = ctx.cuda_pool
    meta = f"{TOOLKIT}-1"
    comp = f"{NVCC}-1"

    nvcc = render(
        source("cuda/nvcc.sh"),
        NVCC_VERSION=NVCC,
        PKG_SUFFIX=SUFFIX,
        TOOLKIT_VERSION=TOOLKIT,
        BUILT_ON=NVCC_BUILT_ON,
        RELEASE=RELEASE,
        BUILD=NVCC_BUILD,
    )
    ctx.build_deb(
        pool,
        f"cuda-nvcc-{SUFFIX}",
        comp,
        {f"{PREFIX}/bin/nvcc": (nvcc.encode(), 0o755)},
        description=f"CUDA nvcc{STANDIN_NOTE}",
        extra_control={"Section": "multiverse/devel"},
    )

    postinst = f"""#!/bin/sh
# Stands in for cuda-toolkit-{SUFFIX}-config-common's postinst (CUDA alternatives); lab only.
set -e
if [ "$1" = configure ]; then
    update-alternatives ${{DPKG_ROOT:+--root "$DPKG_ROOT"}} --install /usr/local/cuda cuda {PREFIX} {ALT_PRIORITY}
    update-alternatives ${{DPKG_ROOT:+--root "$DPKG_ROOT"}} --install /usr/local/cuda-11 cuda-11 {PREFIX} {ALT_PRIORITY}
fi
exit 0
"""
    prerm = f"""#!/bin/sh
# Stands in for cuda-toolkit-{SUFFIX}-config-common's prerm (CUDA alternatives); lab only.
set -e
if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
    update-alternatives ${{DPKG_ROOT:+--root "$DPKG_ROOT"}} --remove cuda {PREFIX}
    update-alternatives ${{DPKG_ROOT:+--root "$DPKG_ROOT"}} --remove cuda-11 {PREFIX}
fi
exit 0
"""
    ctx.build_deb(
        pool,
        f"cuda-toolkit-{SUFFIX}-config-common",
        comp,
        {},
        arch="all",
        description=f"Common config package for CUDA Toolkit {RELEASE}.{STANDIN_NOTE}",
        extra_control={"Section": "multiverse/devel"},
        scripts={"postinst": postinst, "prerm": prerm},
    )

    version_json = json.dumps(
        {
            "cuda": {"name": "CUDA SDK", "version": TOOLKIT},
            "cuda_nvcc": {"name": "CUDA NVCC", "version": NVCC},
        },
        indent=3,
        sort_keys=True,
    )
    ctx.build_deb(
        pool,
        f"cuda-toolkit-{SUFFIX}",
        meta,
        {f"{PREFIX}/version.json": ((version_json + "\n").encode(), 0o644)},
        depends=[
            f"cuda-nvcc-{SUFFIX} (>= {NVCC})",
            f"cuda-toolkit-{SUFFIX}-config-common (>= {NVCC})",
        ],
        description=f"CUDA Toolkit {RELEASE} meta-package{STANDIN_NOTE}",
        extra_control={"Section": "multiverse/devel"},
    )
    ctx.build_deb(
        pool,
        f"cuda-runtime-{SUFFIX}",
        meta,
        {},
        depends=[f"cuda-drivers (>= {MIN_DRIVER})"],
        description=f"CUDA Runtime {RELEASE} meta-package{STANDIN_NOTE}",
        extra_control={"Section": "multiverse/devel"},
    )
    ctx.build_deb(
        pool,
        f"cuda-{SUFFIX}",
        meta,
        {},
        depends=[f"cuda-runtime-{SUFFIX} (>= {TOOLKIT})", f"cuda-toolkit-{SUFFIX} (>= {TOOLKIT})"],
        description=f"CUDA {RELEASE} meta-package{STANDIN_NOTE}",
        extra_control={"Section": "multiverse/devel"},
    )
