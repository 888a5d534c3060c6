"""Preflight: refuse a node that is not what the cluster file allows, before any change.

Problems are found from facts while pyinfra plans; the one operation that reports them
fails on that host only, so the other hosts go on and nothing was touched on this one.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import KernelVersion, LinuxDistribution, Port

from deploy.cluster import Cluster, Node
from deploy.facts.system import DiskFreeGB
from roles.shared_ops import fail

# The master's own service may hold its port on a re-deploy.
OWN_UNITS = ("determined-master.service",)


def os_label(distribution: Mapping[str, Any]) -> str:
    version = distribution.get("release_meta", {}).get("VERSION_ID") or str(distribution.get("major"))
    return f"{distribution.get('name')} {version}"


def os_problems(label: str, kernel: str, allowed: dict) -> list[str]:
    if label not in allowed:
        return [f"OS {label} is not allowed (allowed: {', '.join(allowed)})"]
    patterns = allowed[label]
    if not any(fnmatch.fnmatchcase(kernel, p) for p in patterns):
        return [f"kernel {kernel} is not allowed on {label} (allowed: {', '.join(patterns)})"]
    return []


def cgroup_unit(lines: list[str] | None) -> str | None:
    """The systemd unit in a process's /proc/<pid>/cgroup lines, or None."""
    for line in lines or ():
        for part in reversed(line.split(":", 2)[-1].split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None


def port_problem(port: int, holder: tuple, unit: str | None) -> str | None:
    process, pid = holder
    if process is None or unit in OWN_UNITS:
        return None
    owner = f"{process} (pid {pid}{', unit ' + unit if unit else ''})"
    return f"port {port} is already in use by {owner}: stop it or choose another master_port in cluster.yaml"


@operation(is_idempotent=True)
def checks(cluster: Cluster, node: Node):
    distribution = host.get_fact(LinuxDistribution)
    problems = os_problems(
        os_label(distribution),
        host.get_fact(KernelVersion),
        dict(cluster.preflight.allowed_os),
    )
    free = host.get_fact(DiskFreeGB, path=cluster.preflight.disk_path)
    if free < cluster.preflight.min_free_disk_gb:
        problems.append(
            f"{cluster.preflight.disk_path} has {free:.1f} GB free, "
            f"needs {cluster.preflight.min_free_disk_gb} GB"
        )
    if "master" in node.roles:
        holder = host.get_fact(Port, port=cluster.master_port) or (None, None)
        pid = holder[1]
        unit = cgroup_unit(host.get_fact(FileContents, path=f"/proc/{int(pid)}/cgroup")) if pid else None
        problem = port_problem(cluster.master_port, holder, unit)
        if problem:
            problems.append(problem)
    if not problems:
        host.noop("preflight passed")
        return
    yield fail("; ".join(f"preflight failed on {node.hostname}: {p}" for p in problems))


@deploy("Preflight")
def apply(cluster: Cluster, node: Node) -> None:
    checks(name="Check OS, kernel, disk and the master's port", cluster=cluster, node=node)
