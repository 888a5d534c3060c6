"""The CUDA toolkit on GPU nodes, pinned and held.

install:   cuda-toolkit-<major>-<minor>=<version>-1 only. Never cuda-<major>-<minor>: that
           meta package pulls cuda-runtime and with it a driver of apt's choosing.
configure: /usr/local/cuda -> /usr/local/cuda-<major>.<minor> through the "cuda"
           alternative (the name NVIDIA's packages use), and /etc/profile.d/cuda.sh so
           login shells find nvcc and the libraries
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.operations import files

from deploy.facts_gpu import ResolvedPath
from deploy.pins import CUDA_LINK, cuda_home, cuda_major_minor, cuda_pins
from roles import apt_pins

FILES = Path(__file__).resolve().parent.parent / "files" / "cuda"
PROFILE = "/etc/profile.d/cuda.sh"


def alternative_priority(cuda_version: str) -> int:
    """11.7.x -> 117, the priority NVIDIA's own packages give the cuda alternative."""
    return int(cuda_major_minor(cuda_version).replace(".", ""))


def link_shell(home: str, priority: int) -> str:
    h, link = shlex.quote(home), shlex.quote(CUDA_LINK)
    wrong = shlex.quote(
        f"{CUDA_LINK} does not lead to {home} after update-alternatives "
        f"(is {CUDA_LINK} a directory rather than a link?)"
    )
    return (
        f"[ -d {h} ] || {{ echo {shlex.quote(f'{home} is missing: the toolkit is not installed')}"
        " >&2; exit 1; }; "
        f"update-alternatives --install {link} cuda {h} {priority} && "
        f"update-alternatives --set cuda {h} && "
        f'[ "$(readlink -e {link})" = {h} ] || {{ echo {wrong} >&2; exit 1; }}'
    )


@operation()
def cuda_link(home: str, priority: int):
    """/usr/local/cuda resolves to `home`."""
    if host.get_fact(ResolvedPath, path=CUDA_LINK) == home:
        host.noop(f"{CUDA_LINK} leads to {home}")
        return
    yield StringCommand(link_shell(home, priority))


@deploy("CUDA toolkit")
def apply():
    version = host.data.cluster.versions.cuda
    home = cuda_home(version)
    repo = apt_pins.cuda_repo()
    apt_pins.pinned(cuda_pins(version), repo)
    cuda_link(name=f"{CUDA_LINK} -> {home}", home=home, priority=alternative_priority(version))
    files.template(
        name="CUDA paths for login shells",
        src=str(FILES / "cuda.sh.j2"),
        dest=PROFILE,
        mode="644",
        cuda_home=home,
        cuda_version=version,
    )
