"""What the lab pretends each node's hardware and installed system are, from a sidecar file.

`<cluster dir>/lab-hardware.yaml` sits next to the lab's cluster.yaml; the deploy never reads
it (only cluster.yaml differs between lab and production). The lab writes each node's
topology to /etc/dtlab/gpu-topology.json before boot, where the nvidia-smi stand-in reads it.
`network: netplan` makes a node what an Ubuntu server is as installed: netplan.io (Debian's
real package) in its root filesystem before its first boot (tests/lab/nodes.py preinstall).

    nodes:
      lab-gpu2: {gpu_topology: a100-nvswitch-8}
      lab-gpu3: {network: netplan}
"""

import json
from pathlib import Path

import yaml

A100 = "NVIDIA A100-SXM4-80GB"


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
    # One NVSwitch domain of eight: every pair NV12.
    "a100-nvswitch-8": lambda: {
        "gpus": _gpus(8, 4),
        "nics": ["mlx5_0"],
        "matrix": _matrix(8, lambda a, b: "NV12"),
    },
}


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
