"""NCCL on GPU nodes: libnccl2 and libnccl-dev at <nccl>-1+cuda<major.minor>, pinned and held.

NVIDIA's own CUDA 11.7.1 images ship NCCL 2.13.4, and the repo offers many builds per CUDA
release: the version is always given explicitly, never left for apt to choose.
"""

from __future__ import annotations

from typing import cast

from pyinfra.api import deploy

from deploy.cluster import Cluster, Node
from deploy.pins import nccl_pins
from roles.apt import cuda_repo as apt_pins


@deploy("NCCL")
def apply(cluster: Cluster, node: Node) -> None:
    versions = cluster.versions
    # @deploy's typing gives every deploy an OperationMeta result; cuda_repo returns a Repo.
    repo = cast(apt_pins.Repo, apt_pins.cuda_repo(cluster=cluster))
    apt_pins.pinned(pinset=nccl_pins(versions.nccl, versions.cuda), repo=repo)
