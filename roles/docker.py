"""Docker and the NVIDIA Container Toolkit on the agents (the Determined agent runs trials
in Docker containers and needs Docker 20.10+ with the NVIDIA runtime).

install:   the distribution's docker.io (Debian 12: 20.10.24; Ubuntu 20.04/22.04: 20.10+)
           and nvidia-container-toolkit from NVIDIA's CUDA repository (added by
           roles/nvidia_driver, which runs earlier on the same nodes)
configure: `nvidia-ctk runtime configure --runtime=docker` only when daemon.json lacks the
           nvidia runtime (the tool rewrites the file on every run, so it is not run blindly)
activate:  docker enabled and running; restarted only when the runtime was added
"""

from __future__ import annotations

import json

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import FileContents
from pyinfra.operations import systemd

from deploy.cluster import Cluster, Node
from roles.shared_ops import packages

DAEMON_JSON = "/etc/docker/daemon.json"
RUNTIME = "nvidia"


def runtimes(lines: list[str] | None) -> frozenset[str]:
    """Runtime names declared in daemon.json's lines (None: no file)."""
    try:
        config = json.loads("\n".join(lines or ["{}"]))
    except ValueError:
        # An unreadable file counts as lacking the runtime; nvidia-ctk then reports the
        # JSON error itself, which is the message an operator needs.
        return frozenset()
    declared = config.get("runtimes") if isinstance(config, dict) else None
    return frozenset(declared) if isinstance(declared, dict) else frozenset()


@operation()
def nvidia_runtime():
    """Register the nvidia runtime with Docker, unless daemon.json already has it."""
    if RUNTIME in runtimes(host.get_fact(FileContents, path=DAEMON_JSON)):
        host.noop(f"{DAEMON_JSON} has the {RUNTIME} runtime")
        return
    yield "install -d -m 755 /etc/docker && nvidia-ctk runtime configure --runtime=docker"


@deploy("Docker and the NVIDIA Container Toolkit")
def apply(cluster: Cluster, node: Node) -> None:
    packages(["docker.io", "nvidia-container-toolkit"], "Docker and the NVIDIA Container Toolkit")
    runtime = nvidia_runtime(name="Docker knows the nvidia runtime (nvidia-ctk)")
    systemd.service(
        name="Restart Docker for the nvidia runtime",
        service="docker.service",
        running=True,
        restarted=True,
        _if=runtime.did_change,
    )
    systemd.service(name="Docker enabled and running", service="docker.service", running=True, enabled=True)
