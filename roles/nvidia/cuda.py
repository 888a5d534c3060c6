"""The CUDA toolkit on GPU nodes, pinned and held.

install:   cuda-toolkit-<major>-<minor>=<version>-1 only. Never cuda-<major>-<minor>: that
           meta package pulls cuda-runtime and with it a driver of apt's choosing.
configure: /usr/local/cuda -> /usr/local/cuda-<major>.<minor> through the "cuda"
           alternative (the name NVIDIA's packages use), and /etc/profile.d/cuda.sh so
           login shells find nvcc and the libraries
"""

from __future__ import annotations

import io
from typing import cast

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from deploy.cluster import Cluster, Node
from deploy.facts.system import ResolvedPath
from deploy.pins import CUDA_LINK, cuda_home, cuda_major_minor, cuda_pins
from roles.apt import cuda_repo as apt_pins
from roles.shared.scripts import script
from roles.shared.templates import render

PROFILE = "/etc/profile.d/cuda.sh"


def alternative_priority(cuda_version: str) -> int:
    """11.7.x -> 117, the priority NVIDIA's own packages give the cuda alternative."""
    return int(cuda_major_minor(cuda_version).replace(".", ""))


def profile(cuda_version: str) -> str:
    """/etc/profile.d/cuda.sh for the pinned toolkit."""
    return render("nvidia/cuda.sh.j2", cuda_home=cuda_home(cuda_version), cuda_version=cuda_version)


@operation()
def cuda_link(home: str, priority: int):
    """/usr/local/cuda resolves to `home`."""
    # Not files.link: NVIDIA's packages own /usr/local/cuda through the "cuda" alternative.
    if host.get_fact(ResolvedPath, path=CUDA_LINK) == home:
        host.noop(f"{CUDA_LINK} leads to {home}")
        return
    yield script("nvidia/cuda-link.sh", home, priority, CUDA_LINK)


@deploy("CUDA toolkit")
def apply(cluster: Cluster, node: Node) -> None:
    version = cluster.versions.cuda
    home = cuda_home(version)
    # @deploy's typing gives every deploy an OperationMeta result; cuda_repo returns a Repo.
    repo = cast(apt_pins.Repo, apt_pins.cuda_repo(cluster=cluster))
    apt_pins.pinned(pinset=cuda_pins(version), repo=repo)
    cuda_link(name=f"{CUDA_LINK} -> {home}", home=home, priority=alternative_priority(version))
    # Rendered here rather than by files.template (the same Jinja2 settings): every role's
    # templates go through roles/shared/templates.py, and a unit test sees what the node gets.
    files.put(name="CUDA paths for login shells", src=io.StringIO(profile(version)), dest=PROFILE, mode="644")
