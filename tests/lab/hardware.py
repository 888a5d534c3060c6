"""What the lab pretends each node's hardware and installed system are, from a sidecar file.

`<cluster dir>/lab-hardware.yaml` sits next to the lab's cluster.yaml; the deploy never reads
it (only cluster.yaml differs between lab and production). The lab writes each node's
topology to /etc/dtlab/gpu-topology.json before boot, where the nvidia-smi stand-in reads it.
A preset with NVSwitches also gives the node a PCI bus (`pci_tree`): its GPUs and NVSwitches
as sysfs device directories, bind-mounted over /sys/bus/pci/devices (tests/lab/nodes.py), where
deploy/facts/gpu.py and the fabric-manager stand-in look for NVSwitches; other nodes see the
controller's PCI bus, which has no NVIDIA device.
`network: netplan` makes a node what an Ubuntu server is as installed: netplan.io (Debian's
real package) in its root filesystem before its first boot (tests/lab/nodes.py preinstall).

    nodes:
      lab-gpu2: {gpu_topology: a100-nvswitch-8}
      lab-gpu3: {network: netplan}
"""

import json
import shutil
from pathlib import Path

import yaml

A100 = "NVIDIA A100-SXM4-80GB"
# nvidia-smi's stand-in gives GPU i this bus id when the topology names none.
DEFAULT_BUS_IDS = [f"00000000:{b}:00.0" for b in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")]


def _gpus(count: int, per_numa: int) -> list[dict]:
    gpus = []
    for i in range(count):
        numa = i // per_numa
        cpus = f"{numa * 32}-{numa * 32 + 31}"
        gpus.append({"name": A100, "cpu_affinity": cpus, "numa_affinity": str(numa)})
    return gpus


def _matrix(count: int, link) -> list[list[str]]:
    """GPUs plus one NIC (mlx5_0, on NUMA 0) as the last row and column."""
    size = count + 1
    rows = [["X"] * size for _ in range(size)]
    for a in range(size):
        for b in range(size):
            if a == b:
                continue
            if a == count or b == count:
                gpu = b if a == count else a
                rows[a][b] = "PXB" if gpu < count // 2 else "SYS"
            else:
                rows[a][b] = link(a, b)
    return rows


PRESETS = {
    # Two NVLink domains of four (NV12 inside, SYS across): the stand-in's own default.
    "a100-2x4": lambda: {
        "gpus": _gpus(8, 4),
        "nics": ["mlx5_0"],
        "matrix": _matrix(8, lambda a, b: "NV12" if a // 4 == b // 4 else "SYS"),
    },
    # One NVSwitch domain of eight: every pair NV12 (HGX A100 8-GPU: six NVSwitches).
    "a100-nvswitch-8": lambda: {
        "gpus": _gpus(8, 4),
        "nics": ["mlx5_0"],
        "matrix": _matrix(8, lambda a, b: "NV12"),
    },
}
# Presets whose baseboard has NVSwitches, and how many (NVIDIA HGX A100 8-GPU: six).
NVSWITCHES = {"a100-nvswitch-8": 6}

# PCI ids as sysfs shows them: NVIDIA's vendor id; the A100 SXM4 80GB (device 0x20b2) is a
# 3D controller (class 0x030200); an NVSwitch of the A100 generation (0x1af1) is a bridge,
# class 0x068000 (the class go-nvlib's PCINvSwitchClass and deploy/facts/gpu.py test).
PCI_GPU = {"vendor": "0x10de", "device": "0x20b2", "class": "0x030200"}
PCI_NVSWITCH = {"vendor": "0x10de", "device": "0x1af1", "class": "0x068000"}


# What a node's network stack is as installed: the packages the lab puts into its root.
NETWORK_STACKS = {"ifupdown": (), "netplan": ("udev", "netplan.io")}


def _sidecar(cluster_path: Path) -> tuple[Path, dict]:
    sidecar = Path(cluster_path).with_name("lab-hardware.yaml")
    if not sidecar.exists():
        return sidecar, {}
    raw = yaml.safe_load(sidecar.read_text()) or {}
    return sidecar, raw.get("nodes") or {}


def node_packages(cluster_path: Path) -> dict[str, tuple[str, ...]]:
    """hostname -> Debian packages its root filesystem has before the first boot."""
    sidecar, nodes = _sidecar(cluster_path)
    packages = {}
    for hostname, spec in nodes.items():
        stack = spec.get("network", "ifupdown")
        if stack not in NETWORK_STACKS:
            raise ValueError(
                f"{sidecar}: nodes.{hostname}.network: {stack!r}: not one of {', '.join(NETWORK_STACKS)}"
            )
        packages[hostname] = NETWORK_STACKS[stack]
    return packages


def pci_devices(cluster_path: Path) -> dict[str, dict[str, dict[str, str]]]:
    """hostname -> {PCI address: {sysfs file: content}} for the nodes whose preset has NVSwitches."""
    _, nodes = _sidecar(cluster_path)
    trees = {}
    for hostname, spec in nodes.items():
        preset = spec.get("gpu_topology")
        switches = NVSWITCHES.get(preset, 0)
        if not switches:
            continue
        devices = {}
        for i, gpu in enumerate(PRESETS[preset]()["gpus"]):
            bus = gpu.get("bus_id") or DEFAULT_BUS_IDS[i]
            devices[bus[4:].lower()] = PCI_GPU  # 00000000:07:00.0 -> 0000:07:00.0
        for i in range(switches):
            devices[f"0000:{0xC4 + i:02x}:00.0"] = PCI_NVSWITCH
        trees[hostname] = devices
    return trees


def write_pci_tree(cluster_path: Path, hostname: str, dest: Path) -> Path | None:
    """The node's PCI device directories under `dest` (rewritten), or None: it has none."""
    devices = pci_devices(cluster_path).get(hostname)
    if not devices:
        return None
    if dest.exists():
        shutil.rmtree(dest)
    for address, files in devices.items():
        (dest / address).mkdir(parents=True)
        for name, content in files.items():
            (dest / address / name).write_text(content + "\n")
    return dest


def node_files(cluster_path: Path) -> dict[str, dict[str, str]]:
    """hostname -> {relative path under /etc/dtlab: content} for the nodes the sidecar names."""
    sidecar, nodes = _sidecar(cluster_path)
    files = {}
    for hostname, spec in nodes.items():
        if "gpu_topology" not in spec:
            continue
        preset = spec.get("gpu_topology")
        if preset not in PRESETS:
            raise ValueError(
                f"{sidecar}: nodes.{hostname}.gpu_topology: {preset!r}: not one of {', '.join(PRESETS)}"
            )
        files[hostname] = {"gpu-topology.json": json.dumps(PRESETS[preset](), indent=1) + "\n"}
    return files
