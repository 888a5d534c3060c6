"""Trial images: the reference check of `determined.task_image.*` and the table of the CUDA
versions known images need, against the CUDA version the pinned driver supports.

A trial container starts only where libnvidia-container accepts the image's
NVIDIA_REQUIRE_CUDA (`cuda>=X.Y`) against the driver's CUDA version ("requirement error:
unsatisfied condition: cuda>=12.4, please update your driver to a newer version, or use an
earlier cuda container"). R515 has no forward compatibility for CUDA 12.x: NVIDIA's CUDA
Compatibility guide (docs.nvidia.com/deploy/cuda-compatibility/, "Forward Compatibility")
lists no 12.x compat package for branch 515, and a 12.x runtime needs a ≥ 525 driver (CUDA
12.0 release notes, Table 3). An image this table does not know passes; verify reads the
truth (NVIDIA_REQUIRE_CUDA) on each agent.
"""

from __future__ import annotations

import re
from typing import Any

from deploy.cluster.checks import check
from deploy.cluster.reader import Reader

# name[:tag]@sha256:<64 hex>: Docker's reference grammar (distribution/reference), lower-case
# repository path components, an optional registry host[:port] first.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_REGISTRY = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::\d{{1,5}})?/)"
_NAME = rf"(?:{_REGISTRY}?{_COMPONENT}(?:/{_COMPONENT})*)"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
IMAGE_REF = re.compile(
    rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?", re.ASCII
)

# Determined's defaults before its move to CUDA 12 (determined-ai/determined commit 55b7fd9b97,
# master/pkg/schemas/expconf/const.go, April 2024): built FROM nvidia/cuda:11.3.1-cudnn8-devel
# (determined-ai/environments, Makefile build-cuda-113-base). No public source states their
# digests: they are pinned by tag until cluster.yaml names them with one.
DEFAULT_GPU_IMAGE = "determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4"
DEFAULT_CPU_IMAGE = "determinedai/environments:py-3.9-pytorch-1.12-tf-2.11-cpu-748dda4"

# (repository, tag pattern) -> the CUDA version the image requires, with where that is stated.
KNOWN_CUDA: tuple[tuple[str, str, tuple[int, int], str], ...] = (
    # Determined 0.38.0's default image (master/pkg/schemas/expconf/const.go at v0.38.0), built
    # FROM nvcr.io/nvidia/pytorch:24.03-py3 (determined-ai/environments Makefile,
    # NGC_PYTORCH_VERSION := 24.03-py3).
    ("determinedai/pytorch-ngc", r"0\.38\.0", (12, 4), "Determined 0.38's default, on NGC PyTorch 24.03"),
    # determined-ai/environments Makefile: build-cuda-113-base / build-cuda-118-base.
    ("determinedai/environments", r"cuda-11\.3-.*", (11, 3), "FROM nvidia/cuda:11.3.1"),
    ("determinedai/environments", r"cuda-11\.8-.*", (11, 8), "FROM nvidia/cuda:11.8.0"),
    # NVIDIA's Frameworks Support Matrix (docs.nvidia.com/deeplearning/frameworks/
    # support-matrix/) and each release's notes (pytorch-release-notes/rel-YY-MM.html,
    # "Release YY.MM is based on CUDA ..."): the CUDA each NGC PyTorch release is built on.
    # Re-read them before adding a row; when in doubt leave an image out (it then passes).
    ("nvcr.io/nvidia/pytorch", r"22\.08-py3", (11, 7), "NGC PyTorch 22.08: CUDA 11.7.1"),
    ("nvcr.io/nvidia/pytorch", r"23\.01-py3", (12, 0), "NGC PyTorch 23.01: CUDA 12.0.1"),
    ("nvcr.io/nvidia/pytorch", r"24\.03-py3", (12, 4), "NGC PyTorch 24.03: CUDA 12.4.0"),
)

# Driver branch -> the newest CUDA it runs (CUDA Toolkit release notes, Table 3: CUDA 11.7
# Update 1 ships 515.65.01; 12.0 GA needs ≥ 525.60.13). Within CUDA 11 minor version
# compatibility runs any 11.x runtime on ≥ 450.80.02, so only a newer major is refused.
DRIVER_CUDA: dict[str, tuple[int, int]] = {"515": (11, 7)}


@check("`name[:tag]@sha256:<64 hex>`")
def image_ref(r: Reader, path: str, v: Any) -> str | None:
    """A Docker image reference pinned by digest: a tag alone can be moved to another image."""
    m = IMAGE_REF.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        r.bad(path, v, "must be a Docker image reference like 'repo/name:tag@sha256:<64 hex digits>'")
        return None
    if m["digest"] is None:
        r.bad(
            path,
            v,
            "has no digest: write name:tag@sha256:<digest> (`docker buildx imagetools inspect "
            f"{v}` or `skopeo inspect docker://{v}` prints it)",
        )
        return None
    return str(v)


def required_cuda(ref: str) -> tuple[tuple[int, int], str] | None:
    """The CUDA version `ref` needs and the table row's source, or None if the table has no row."""
    m = IMAGE_REF.fullmatch(ref)
    if m is None:
        return None
    name, tag = m["name"], m["tag"] or "latest"
    for repo, tag_pattern, cuda, source in KNOWN_CUDA:
        if (name == repo or name == f"docker.io/{repo}" or name.endswith(f"/{repo}")) and re.fullmatch(
            tag_pattern, tag
        ):
            return cuda, source
    return None


def too_new(ref: str, driver_version: str) -> str | None:
    """Why `ref` cannot run on `driver_version`, or None (also for unknown images or drivers)."""
    supported = DRIVER_CUDA.get(driver_version.split(".")[0])
    known = required_cuda(ref)
    if supported is None or known is None:
        return None
    (major, minor), source = known
    if major <= supported[0]:
        return None
    return (
        f"needs CUDA {major}.{minor} ({source}); driver {driver_version} runs CUDA up to "
        f"{supported[0]}.{supported[1]} and R{driver_version.split('.')[0]} has no forward "
        f"compatibility for CUDA {major}: nvidia-container-cli refuses the container"
    )
