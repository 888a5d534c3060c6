"""Booting and stopping nodes; every process is found by its own recorded id."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import hardware
from .network import netns_path
from .paths import APT_PROXY_PORT, LOGS, REPO
from .shell import LabError
from .spec import LabNode, LabSpec

SSH_OPTS = (
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=3",
)


def _pid(path: Path, marker: str) -> int | None:
    """The recorded pid if that process is still the one we started (no pid reuse)."""
    try:
        pid = int(path.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if marker.encode() in cmdline else None


def supervisor_pid(node: LabNode) -> int | None:
    return _pid(node.dir / "supervisor.pid", f"--name {node.hostname} ")


def nspawn_pid(node: LabNode) -> int | None:
    return _pid(node.dir / "nspawn.pid", f"-M {node.hostname} ")


def is_running(node: LabNode) -> bool:
    return supervisor_pid(node) is not None and nspawn_pid(node) is not None


def start(spec: LabSpec, node: LabNode) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "tests.lab.supervise",
        "--name",
        node.hostname,
        "--root",
        str(node.root),
        "--netns",
        str(netns_path(node)),
        "--pidfile",
        str(node.dir / "nspawn.pid"),
    ]
    if node.is_storage:
        node.data_disk.mkdir(parents=True, exist_ok=True)
        argv += ["--bind", f"{node.data_disk}:{spec.storage_data_dir}"]
    # Docker's disk: a real server keeps /var/lib/docker on ext4 or xfs, where Docker uses
    # overlay2. On the node's overlay root it falls back to vfs, which copies the whole image
    # for every container (6 s per `docker run` of a task image instead of a fraction of one).
    docker_disk = node.dir / "docker-disk"
    docker_disk.mkdir(parents=True, exist_ok=True)
    argv += ["--bind", f"{docker_disk}:/var/lib/docker"]
    # A node whose hardware has NVSwitches sees its own PCI bus (tests/lab/hardware.py).
    pci = hardware.write_pci_tree(spec.cluster_path, node.hostname, node.dir / "pci-devices")
    if pci is not None:
        argv += ["--bind", f"{pci}:/sys/bus/pci/devices"]
    log = open(LOGS / f"{node.hostname}.console.log", "ab")  # noqa: SIM115 (the node keeps it)
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    (node.dir / "supervisor.pid").write_text(f"{proc.pid}\n")
    # Until exec, /proc/<pid>/cmdline is still ours: wait so the pid can be recognised.
    for _ in range(50):
        if supervisor_pid(node):
            return
        time.sleep(0.1)
    raise LabError(
        f"{node.hostname}: supervisor did not start; see {LOGS / (node.hostname + '.console.log')}"
    )


def kill_leftovers(node: LabNode) -> list[int]:
    """Kill what still runs in the node's namespace: a node whose nspawn died can leave
    its systemd behind, which would otherwise share the root with the next boot."""
    if not Path(f"/run/netns/{node.netns}").exists():
        return []
    proc = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True, check=False)
    pids = [int(p) for p in proc.stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        _wait_gone(pid, 5)
    return pids


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        with contextlib.suppress(ChildProcessError):  # reap it if it is our child
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    return not Path(f"/proc/{pid}").exists()


def stop(node: LabNode, timeout: float = 30) -> None:
    sup, nsp = supervisor_pid(node), nspawn_pid(node)
    if sup:
        os.kill(sup, signal.SIGTERM)
    elif nsp:  # an orphaned nspawn from a crashed supervisor
        os.kill(nsp, signal.SIGTERM)
    for pid in filter(None, (nsp, sup)):
        if not _wait_gone(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 5)
    kill_leftovers(node)
    for name in ("supervisor.pid", "nspawn.pid"):
        (node.dir / name).unlink(missing_ok=True)


def pull_cables(node: LabNode, pulled: bool = True) -> None:
    """The host ends of the node's veths down (or up again): its addresses stop answering ARP,
    as a powered-off server's do. A stopped node alone keeps its network namespace, whose
    kernel still answers every connect with a reset ("connection refused")."""
    for veth in (node.veth_mgmt, node.veth_ib):
        subprocess.run(["ip", "link", "set", veth, "down" if pulled else "up"], check=True)


def ssh_argv(spec: LabSpec, node: LabNode, *command: str) -> list[str]:
    return ["ssh", "-i", str(spec.ssh_key), *SSH_OPTS, f"root@{node.address}", *command]


def wait_ready(spec: LabSpec, node: LabNode, timeout: float = 120) -> str:
    """Wait until systemd in the node has finished booting; returns its state."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if supervisor_pid(node) is None:
            raise LabError(
                f"{node.hostname}: its supervisor is not running; "
                f"see {LOGS / (node.hostname + '.console.log')}"
            )
        proc = subprocess.run(
            ssh_argv(spec, node, "systemctl", "is-system-running", "--wait"),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        last = (proc.stdout or proc.stderr).strip() or f"ssh exited {proc.returncode}"
        if last in ("running", "degraded"):
            return last
        time.sleep(1)
    raise LabError(f"{node.hostname}: not ready after {timeout:.0f}s (last: {last})")


def init_pid(node: LabNode) -> int | None:
    """PID (on the controller) of the node's systemd: nspawn's child."""
    nsp = nspawn_pid(node)
    if nsp is None:
        return None
    children = Path(f"/proc/{nsp}/task/{nsp}/children").read_text().split()
    return int(children[0]) if children else None


def console_argv(node: LabNode, *command: str) -> list[str]:
    """Run a command inside a node without SSH (for when its sshd is what broke)."""
    pid = init_pid(node)
    if pid is None:
        raise LabError(f"{node.hostname}: not running")
    return ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", *command]


def preinstall(node: LabNode) -> list[str]:
    """Install the node's as-delivered packages (LabNode.packages) into its root filesystem
    before it boots, from Debian's archive through the lab's apt-cacher-ng; returns those it
    had to install. A package already unpacked there is left alone."""
    missing = [p for p in node.packages if not (node.root / f"var/lib/dpkg/info/{p}.list").exists()]
    if not missing:
        return []
    proxy = f"Acquire::http::Proxy=http://127.0.0.1:{APT_PROXY_PORT}"
    # A container of its own (not chroot): apt and the maintainer scripts see /proc and /dev.
    nspawn = ["systemd-nspawn", "-q", "--register=no", "--keep-unit", "-M", f"{node.hostname}-setup"]
    nspawn += ["-D", str(node.root), "-E", "DEBIAN_FRONTEND=noninteractive"]
    for command in (
        ["apt-get", "-q", "-o", proxy, "update"],
        ["apt-get", "-q", "-y", "-o", proxy, "install", "--no-install-recommends", *missing],
        ["apt-get", "clean"],
    ):
        proc = subprocess.run([*nspawn, *command], capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            raise LabError(f"{node.hostname}: {' '.join(command)}: {(proc.stderr or proc.stdout)[-2000:]}")
    return missing
