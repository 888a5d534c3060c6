"""Preflight: refuse a node that is not what the cluster file allows, before any change.

Problems are found from facts while pyinfra plans; the one operation that reports them
fails on that host only, so the other hosts go on and nothing was touched on this one.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from pyinfra import host, logger
from pyinfra.api import deploy, operation
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import KernelVersion, LinuxDistribution, Port

from deploy.cluster import Cluster, Node
from deploy.facts.system import DiskFreeGB, IsMountPoint, SecureBootState
from roles.shared.ops import fail

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


def certified_warning(kernel: str, certified: tuple[str, ...]) -> str | None:
    """A kernel the allowed series accepts but the cluster was not certified on: warn only."""
    if not certified or any(fnmatch.fnmatchcase(kernel, p) for p in certified):
        return None
    return (
        f"kernel {kernel} is not a build this cluster was certified on "
        f"({', '.join(certified)}): deploying anyway; re-run the checks you certified with "
        "(verify, a test experiment), or list it in preflight.certified_kernels"
    )


# Why the driver and MLNX_OFED stop under Secure Boot, and the two ways out.
SECURE_BOOT_WAYS_OUT = (
    "the NVIDIA driver's and MLNX_OFED's modules are built on the node and unsigned, and the "
    "kernel refuses them (modprobe: 'Key was rejected by service'): turn Secure Boot off in the "
    "firmware setup, or enrol a Machine Owner Key that DKMS signs the modules with and set "
    "preflight.secure_boot: signed_modules (docs/operations.md, 'Kernels and Secure Boot')"
)


def secure_boot_problem(state: str, said: str, policy: str) -> str | None:
    if state == "enabled" and policy != "signed_modules":
        return f"Secure Boot is on ({said}): {SECURE_BOOT_WAYS_OUT}"
    return None


def secure_boot_warning(state: str, said: str, policy: str) -> str | None:
    if state == "unknown" and policy != "signed_modules":
        return f"Secure Boot state unknown ({said}): if it is on, {SECURE_BOOT_WAYS_OUT}"
    return None


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


def data_dir_problem(data_dir: str, is_mount_point: bool, on_root_disk: bool) -> str | None:
    """MinIO on an unmounted data disk writes into the empty directory beneath it, on the root
    disk: the deploy would then make an empty bucket there and verify would pass."""
    if is_mount_point or on_root_disk:
        return None
    return (
        f"storage.data_dir {data_dir} is not a mount point, so MinIO would keep its objects on "
        f"the root disk: mount the data disk at {data_dir} (and list it in /etc/fstab), or set "
        "storage.data_on_root_disk: true in cluster.yaml if the root disk is intended"
    )


@operation(is_idempotent=True)
def checks(cluster: Cluster, node: Node):
    distribution = host.get_fact(LinuxDistribution)
    problems = os_problems(
        os_label(distribution),
        host.get_fact(KernelVersion),
        dict(cluster.preflight.allowed_os),
    )
    state, said = host.get_fact(SecureBootState)
    problem = secure_boot_problem(state, said, cluster.preflight.secure_boot)
    if problem:
        problems.append(problem)
    free = host.get_fact(DiskFreeGB, path=cluster.preflight.disk_path)
    if free < cluster.preflight.min_free_disk_gb:
        problems.append(
            f"{cluster.preflight.disk_path} has {free:.1f} GB free, "
            f"needs {cluster.preflight.min_free_disk_gb} GB"
        )
    if "storage" in node.roles:
        data_dir = cluster.storage.data_dir
        problem = data_dir_problem(
            data_dir, host.get_fact(IsMountPoint, path=data_dir), cluster.storage.data_on_root_disk
        )
        if problem:
            problems.append(problem)
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


def warnings(cluster: Cluster) -> list[str]:
    kernel = host.get_fact(KernelVersion)
    allowed = dict(cluster.preflight.allowed_os)
    distribution = host.get_fact(LinuxDistribution)
    refused = os_problems(os_label(distribution), kernel, allowed)
    state, said = host.get_fact(SecureBootState)
    found = [
        None if refused else certified_warning(kernel, cluster.preflight.certified_kernels),
        secure_boot_warning(state, said, cluster.preflight.secure_boot),
    ]
    return [w for w in found if w]


@deploy("Preflight")
def apply(cluster: Cluster, node: Node) -> None:
    # pyinfra's logger at WARNING: printed without -v, in the deploy's own output, once per host
    # while it plans; the deploy goes on.
    for warning in warnings(cluster):
        host.log_styled(f"warning: {warning}", fg="yellow", log_func=logger.warning)
    checks(name="Check OS, kernel, Secure Boot, disks and the master's port", cluster=cluster, node=node)
