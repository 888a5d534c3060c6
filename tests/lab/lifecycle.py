"""up / down / status / recreate: the lab's whole lifecycle, each step idempotent."""

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import hardware, network, nodes, pins, registry, rootfs, services
from .paths import DISKS, MIRROR_PORT, NODES
from .shell import LabError, run
from .spec import LabNode, LabSpec, ensure_secrets, lab_ssh_key, load_spec
from .standins import mokutil

NEEDED_TOOLS = ("debootstrap", "systemd-nspawn", "ip", "ssh", "ssh-keygen")


def check_tools() -> None:
    missing = [t for t in NEEDED_TOOLS if shutil.which(t) is None]
    if missing:
        raise LabError(
            f"missing on the controller: {', '.join(missing)}; "
            "apt-get install -y debootstrap systemd-container iproute2 openssh-client apt-cacher-ng"
        )


# Every node's systemd and journald take inotify instances; the kernel's default of 128 per
# user stops the 20th-odd node with "Too many open files". The ARP table is one table for all
# network namespaces, with one size limit: 32 nodes that each know every peer on two networks
# hold ~2,000 entries, the default limit is 1,024, and past it the kernel drops resolutions
# ("neighbor table overflow!"): SSH to random nodes then times out or finds no route.
# A real cluster has a kernel, and a table, per node.
KERNEL_LIMITS = {
    "fs/inotify/max_user_instances": 8192,
    "fs/inotify/max_user_watches": 1048576,
    "net/ipv4/neigh/default/gc_thresh1": 4096,
    "net/ipv4/neigh/default/gc_thresh2": 16384,
    "net/ipv4/neigh/default/gc_thresh3": 32768,
}


def raise_kernel_limits() -> None:
    """Raise, never lower, the controller kernel's limits a lab of many nodes outgrows."""
    for key, wanted in KERNEL_LIMITS.items():
        path = Path("/proc/sys") / key
        if int(path.read_text()) < wanted:
            path.write_text(f"{wanted}\n")


def ensure_ssh_key(key: Path) -> str:
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtlab", "-f", key)
    return Path(f"{key}.pub").read_text()


def prepare(cluster_path: Path) -> LabSpec:
    """Everything the model needs to load: secrets and the lab key exist."""
    ensure_secrets(cluster_path)
    registry.ensure_ca()  # sources.registry_ca: checked when cluster.yaml loads
    ensure_ssh_key(lab_ssh_key(cluster_path))  # ssh.key_file too: a missing key is refused
    return load_spec(cluster_path)


def lab_files(cluster_path: Path, node: LabNode) -> dict[str, str]:
    return hardware.node_files(cluster_path).get(node.hostname, {})


def up(cluster_path: Path, log=print) -> LabSpec:
    check_tools()
    t0 = time.monotonic()
    spec = prepare(cluster_path)
    built = rootfs.ensure_base()
    log(f"base root filesystem {'built' if built else 'cached'} ({time.monotonic() - t0:.1f}s)")
    network.ensure_bridges(spec)
    raise_kernel_limits()
    services.ensure_apt_proxy()
    # One mirror serves every lab; the URL inside cuda-keyring is replaced by the deploy.
    services.ensure_mirror(f"http://10.77.0.1:{MIRROR_PORT}")
    # The task images' digests follow this machine's base root filesystem: pin cluster.yaml's
    # task_image lines to them (only those lines change).
    changed = registry.update_cluster_yaml(cluster_path, registry.ensure(log))
    if changed:
        keys = ", ".join(f"determined.task_image.{k}" for k in changed)
        log(f"{cluster_path}: {keys} rewritten to this machine's lab image digests")
    log(f"controller services ready ({time.monotonic() - t0:.1f}s)")
    stale = pins.stale(cluster_path)
    if stale:
        log(
            f"warning: {cluster_path}: sha256 of {', '.join(stale)} differ from the lab mirror's "
            f"build; run `python -m tests.lab.pins {cluster_path}`"
        )
    public_key = Path(f"{spec.ssh_key}.pub").read_text()
    t1 = time.monotonic()
    for node in spec.nodes:
        network.ensure_node_network(spec, node)
        if not nodes.is_running(node):
            nodes.stop(node)  # whatever is half-alive from an interrupted run
            rootfs.mount_node(node)
            rootfs.seed_node(node, public_key, lab_files(cluster_path, node))
            nodes.start(spec, node)
        if rootfs.is_mounted(node.root):  # also on running nodes: their root is mounted here
            mokutil.install(node.root)
        rootfs.seed_kernel_archive(node, f"http://{spec.controller_address}:{MIRROR_PORT}")
    for node in spec.nodes:
        state = nodes.wait_ready(spec, node)
        log(f"{node.hostname}: {state} at {node.address}")
    log(f"{len(spec.nodes)} nodes up; boot {time.monotonic() - t1:.1f}s, total {time.monotonic() - t0:.1f}s")
    return spec


def destroy_node(node: LabNode) -> None:
    nodes.stop(node)
    network.remove_node_network(node)
    rootfs.wipe_node(node)


def down(cluster_path: Path, log=print) -> None:
    spec = load_spec(cluster_path) if cluster_path.exists() else None
    if spec is None:
        raise LabError(f"{cluster_path}: no such cluster file")

    def remove(node: LabNode) -> None:
        destroy_node(node)
        shutil.rmtree(DISKS / node.hostname, ignore_errors=True)
        log(f"{node.hostname}: removed")

    # All nodes at once: each one's systemd takes seconds to power off, and the soak's last
    # teardown spent a minute on four of them one after the other.
    with ThreadPoolExecutor(max_workers=len(spec.nodes) or 1) as pool:
        list(pool.map(remove, spec.nodes))
    network.remove_bridges(spec)
    # The mirror and the apt proxy serve every lab; the last one down stops them.
    remaining = list(NODES.iterdir()) if NODES.exists() else []
    if not remaining:
        services.stop_services()
        log("controller services stopped")


def recreate(cluster_path: Path, hostname: str, wipe_disks: bool = False, log=print) -> None:
    """A blank root filesystem for one node: the dead server back from the vendor."""
    spec = prepare(cluster_path)
    node = spec.node(hostname)
    nodes.stop(node)
    rootfs.wipe_node(node)
    if wipe_disks:
        shutil.rmtree(DISKS / node.hostname, ignore_errors=True)
    network.ensure_node_network(spec, node)
    rootfs.mount_node(node)
    rootfs.seed_node(node, Path(f"{spec.ssh_key}.pub").read_text(), lab_files(cluster_path, node))
    mokutil.install(node.root)
    rootfs.seed_kernel_archive(node, f"http://{spec.controller_address}:{MIRROR_PORT}")
    nodes.start(spec, node)
    log(f"{hostname}: {nodes.wait_ready(spec, node)} with a blank root filesystem")


def status(cluster_path: Path) -> list[dict]:
    spec = load_spec(cluster_path)
    namespaces = network.netns_list()
    rows = []
    for node in spec.nodes:
        rows.append(
            {
                "node": node.hostname,
                "address": str(node.address),
                "netns": node.netns in namespaces,
                "mounted": rootfs.is_mounted(node.root),
                "supervisor": nodes.supervisor_pid(node),
                "nspawn": nodes.nspawn_pid(node),
            }
        )
    return rows
