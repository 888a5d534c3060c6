"""Docker and the NVIDIA Container Toolkit on the agents (the Determined agent runs trials
in Docker containers and needs Docker 20.10+ with the NVIDIA runtime).

install:   the distribution's docker.io (Debian 12: 20.10.24; Ubuntu 20.04/22.04: 20.10+)
           and nvidia-container-toolkit from NVIDIA's CUDA repository (added by
           roles/nvidia/driver, which runs earlier on the same nodes), pinned at one build and
           held (deploy/pins.py: an upgrade under running containers detaches their GPUs)
configure: `nvidia-ctk runtime configure --runtime=docker` only when daemon.json lacks the
           nvidia runtime (the tool rewrites the file on every run, so it is not run blindly);
           then the toolkit's own settings merged into what is there (daemon_settings), the
           file rewritten only when one of them is missing or different
activate:  docker enabled and running; restarted only when daemon.json changed
guard:     a restart of Docker ends every container on the node, so while the master runs
           trials there (deploy/training.py) a daemon.json that would change stops the host
           before anything is written, naming them (accepted with --data disruptive=yes)
"""

from __future__ import annotations

import io
import json
from typing import cast

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import FileContents
from pyinfra.operations import files, systemd

from deploy.cluster import Cluster, Node
from deploy.pins import container_toolkit_pins
from deploy.training import IDLE, Busy
from roles.apt import cuda_repo as apt_pins
from roles.shared.ops import fail, packages

DAEMON_JSON = "/etc/docker/daemon.json"
RUNTIME = "nvidia"


def daemon_settings(memlock_bytes: int = -1) -> dict:
    """What this role keeps in daemon.json: every container's locked-memory limit
    (determined.memlock_bytes, hard and soft; -1 is "unlimited" in Docker's ulimit type, as
    `docker run --ulimit memlock=-1:-1`).

    RDMA (NCCL over InfiniBand, GPUDirect) registers, i.e. locks, its buffers; the limit a
    container otherwise inherits from dockerd is often 64 KiB. Determined: its
    master/static/srv/dispatcher-wrapper.sh raises a 64 KiB limit to unlimited as "too low for
    IB", and harness/tests/experiment/keras/test_callback.py lists this daemon.json entry among
    the "settings commonly used to make dtrain happy" (determined-ai/determined). master.yaml's
    task_container_defaults has no ulimit key, so the daemon's default is where it goes.
    """
    return {"default-ulimits": {"memlock": {"Name": "memlock", "Hard": memlock_bytes, "Soft": memlock_bytes}}}


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


def merged(lines: list[str] | None, settings: dict) -> str | None:
    """daemon.json with `settings` merged in (other keys, other ulimits and the runtimes kept),
    or None when it already has them. Raises ValueError when the file is not a JSON object."""
    config = json.loads("\n".join(lines or ["{}"]))
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    changed = False
    for key, wanted in settings.items():
        current = config.get(key)
        if isinstance(wanted, dict) and isinstance(current, dict):
            for name, value in wanted.items():
                if current.get(name) != value:
                    current[name] = value
                    changed = True
        elif current != wanted:
            config[key] = wanted
            changed = True
    # nvidia-ctk writes four-space indentation; the same keeps a diff of the file readable.
    return json.dumps(config, indent=4) + "\n" if changed else None


@operation()
def nvidia_runtime():
    """Register the nvidia runtime with Docker, unless daemon.json already has it."""
    if RUNTIME in runtimes(host.get_fact(FileContents, path=DAEMON_JSON)):
        host.noop(f"{DAEMON_JSON} has the {RUNTIME} runtime")
        return
    yield "install -d -m 755 /etc/docker && nvidia-ctk runtime configure --runtime=docker"


@operation()
def daemon_json(settings: dict):
    """`settings` merged into daemon.json as it is now (after nvidia-ctk: read when the
    operation runs, so the runtime that tool just wrote is kept)."""
    try:
        content = merged(host.get_fact(FileContents, path=DAEMON_JSON), settings)
    except ValueError as e:
        yield fail(f"{DAEMON_JSON}: cannot merge Docker settings into it ({e}): fix or remove the file")
        return
    if content is None:
        host.noop(f"{DAEMON_JSON} has the settings")
        return
    yield from files.put._inner(
        src=io.StringIO(content), dest=DAEMON_JSON, user="root", group="root", mode="644"
    )


@operation()
def containers_kept(settings: dict, refusal: str):
    """Stop this host if daemon.json would change now (nvidia-ctk's runtime or `settings`):
    the restart that follows ends the trials named in `refusal`."""
    current = host.get_fact(FileContents, path=DAEMON_JSON)
    try:
        changes = RUNTIME not in runtimes(current) or merged(current, settings) is not None
    except ValueError:
        changes = False  # daemon_json stops the host over the unreadable file itself
    if not changes:
        host.noop(f"{DAEMON_JSON} stays as it is: Docker keeps its containers")
        return
    yield fail(refusal)


@deploy("Docker and the NVIDIA Container Toolkit")
def apply(cluster: Cluster, node: Node, busy: Busy = IDLE) -> None:
    packages(["docker.io"], "Docker")
    # @deploy's typing gives every deploy an OperationMeta result; cuda_repo returns a Repo.
    repo = cast(apt_pins.Repo, apt_pins.cuda_repo(cluster=cluster))
    apt_pins.pinned(pinset=container_toolkit_pins(), repo=repo)
    memlock = cluster.determined.memlock_bytes
    if busy.guarded:
        containers_kept(
            name="Docker's daemon.json unchanged while trials run here",
            settings=daemon_settings(memlock),
            refusal=busy.refusal("restarting Docker for a new daemon.json"),
        )
    runtime = nvidia_runtime(name="Docker knows the nvidia runtime (nvidia-ctk)")
    shown = "unlimited" if memlock == -1 else f"{memlock} bytes"
    settings = daemon_json(
        name=f"Docker's default ulimits: memlock {shown}", settings=daemon_settings(memlock)
    )
    systemd.service(
        name="Restart Docker for its new daemon.json",
        service="docker.service",
        running=True,
        restarted=True,
        _if=lambda: runtime.did_change() or settings.did_change(),
    )
    systemd.service(name="Docker enabled and running", service="docker.service", running=True, enabled=True)
