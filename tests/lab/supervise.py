"""Keeps one lab node running: restarts systemd-nspawn when the node reboots.

`systemctl reboot` inside a node makes systemd-nspawn exit with 133 and nothing restarts
it; this loop does what systemd-nspawn@.service does with RestartForceExitStatus=133.
"""

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from .network import IB_ALIAS, IB_PARKED

REBOOT_STATUS = 133


def nspawn_argv(args) -> list[str]:
    # nspawn runs inside the node's namespace (rather than joining it with
    # --network-namespace-path) so that the sysfs it mounts shows the node's own
    # interfaces in /sys/class/net, as on a real server, not the controller's.
    nspawn = [
        "systemd-nspawn",
        "--quiet",
        "-D",
        args.root,
        "--boot",
        "--register=no",
        "--keep-unit",
        "-M",
        args.name,
        "--capability=CAP_NET_ADMIN",
        # Trials get IPC_LOCK (Determined's InfiniBand checklist: task_container_defaults
        # add_capabilities); runc cannot give a container a capability its node lacks ("unable
        # to apply caps: operation not permitted"), and nspawn drops this one by default.
        # (CAP_SYS_RESOURCE, for an unlimited memlock, the controller itself does not have.)
        "--capability=CAP_IPC_LOCK",
        # runc joins a new session keyring and loads BPF device filters for every container;
        # nspawn's default seccomp filter refuses both syscalls ("unable to join session
        # keyring: unable to create session key: operation not permitted"), so Docker could
        # not start a container on a lab node as it does on a real one.
        "--system-call-filter=add_key keyctl bpf",
        "--console=read-only",
    ]
    nspawn += [f"--bind={b}" for b in args.bind]
    # A fresh sysfs, mounted from inside the node's namespace, with the cgroup mounts
    # carried over (nspawn needs them): parked under /run while /sys is replaced.
    park = f"/run/dtlab-cgroup-{args.name}"
    script = (
        f"mkdir -p {park} && mount --rbind /sys/fs/cgroup {park} && "
        "mount -t sysfs sysfs /sys && "
        f"mount --move {park} /sys/fs/cgroup && rmdir {park} && "
        'exec "$@"'
    )
    return [
        "nsenter",
        f"--net={args.netns}",
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        script,
        "sh",
        *nspawn,
    ]


def cgroups_writable(nspawn_pid: int) -> None:
    """Remount the node's read-only cgroup v1 controllers read-write.

    Without a user namespace nspawn mounts every cgroup v1 controller read-only inside the
    node (only name=systemd is writable), and Docker's cgroupfs driver must create a cgroup
    per container in each controller ("mkdir /sys/fs/cgroup/cpuset/docker: read-only file
    system"). A real server's Docker writes there freely; so must the lab's. Called every
    second for the node's whole life: nspawn mounts the controllers one by one while the node
    boots, so a single pass could see only some of them.
    """
    try:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
        mounts = Path(f"/proc/{children[0]}/mountinfo").read_text().splitlines() if children else []
    except OSError:
        return
    for line in mounts:
        fields = line.split()
        point, options = fields[4], fields[5]
        if " - cgroup " not in line or not options.startswith("ro"):
            continue
        if point.startswith("/sys/fs/cgroup/") and point != "/sys/fs/cgroup/systemd":
            remount = ["nsenter", "-t", children[0], "-m", "mount", "-o", "remount,bind,rw", point]
            subprocess.run(remount, capture_output=True, check=False)


def reset_kernel_network_state(netns: str) -> None:
    """What a real reboot does to the network: addresses and firewall rules are gone.

    The node's namespace outlives its nspawn process, so without this a rebooted node
    would keep state that a real server loses (and that its boot must rebuild).
    eth0 stays: the lab configures it from outside, like the installer's static config.
    """
    enter = ["nsenter", f"--net={netns}"]
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle", "raw"):
            subprocess.run(enter + [tool, "-t", table, "-F"], capture_output=True, check=False)
            subprocess.run(enter + [tool, "-t", table, "-X"], capture_output=True, check=False)
        for chain in ("INPUT", "FORWARD", "OUTPUT"):
            subprocess.run(enter + [tool, "-P", chain, "ACCEPT"], capture_output=True, check=False)
    links = subprocess.run(enter + ["ip", "-j", "link", "show"], capture_output=True, text=True, check=False)
    for link in json.loads(links.stdout or "[]"):
        name = link["ifname"]
        if name not in ("lo", "eth0"):
            subprocess.run(enter + ["ip", "addr", "flush", "dev", name], capture_output=True, check=False)
            subprocess.run(enter + ["ip", "link", "set", name, "down"], capture_output=True, check=False)
        # A reboot unloads ib_ipoib: the fabric port has no IPoIB interface again until openibd
        # loads it at boot (tests/lab/network.py IB_PARKED).
        if link.get("ifalias") == IB_ALIAS and name != IB_PARKED:
            subprocess.run(
                enter + ["ip", "link", "set", name, "name", IB_PARKED], capture_output=True, check=False
            )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--netns", required=True)
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--bind", action="append", default=[])
    args = parser.parse_args()

    stopping = False
    child: subprocess.Popen | None = None

    def stop(_signum, _frame):
        nonlocal stopping
        stopping = True
        if child and child.poll() is None:
            # nspawn turns SIGTERM into an orderly poweroff of the node.
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    boots = 0
    while not stopping:
        boots += 1
        print(f"supervise: boot {boots} of {args.name}", flush=True)
        reset_kernel_network_state(args.netns)  # every boot starts from a clean kernel
        child = subprocess.Popen(nspawn_argv(args), stdin=subprocess.DEVNULL)
        Path(args.pidfile).write_text(f"{child.pid}\n")
        while True:
            cgroups_writable(child.pid)
            try:
                status = child.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        print(f"supervise: nspawn exited {status}", flush=True)
        if status != REBOOT_STATUS:
            break
        time.sleep(0.5)
    Path(args.pidfile).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
