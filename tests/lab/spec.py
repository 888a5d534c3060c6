"""The lab's view of a cluster.yaml: which machines to boot on which networks.

The lab reads the same file the deploy does, through the same model; the only thing it
does with the raw YAML is create the secret files that file refers to, since the model
refuses references that resolve to nothing.
"""

import hashlib
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from .paths import DISKS, NODES

# What the MinIO stand-in (tests/lab/standins/minio/minio) needs beyond python3 for its admin
# API: argon2id and AES-GCM to decrypt madmin's request bodies. The real MinIO is a static Go
# binary with both built in, so only the lab's storage node gets these, before its first boot.
MINIO_STANDIN_PACKAGES = ("python3-argon2", "python3-cryptography")


@dataclass(frozen=True)
class LabNode:
    hostname: str
    address: ipaddress.IPv4Address
    ipoib_address: ipaddress.IPv4Address
    prefixlen: int
    is_storage: bool
    # Debian packages the node has as installed (lab-hardware.yaml `network: netplan`).
    packages: tuple[str, ...] = ()

    @property
    def netns(self) -> str:
        return f"dt-{self.hostname}"

    def _ifname(self, kind: str) -> str:
        # Interface names are limited to 15 bytes; hostnames are not.
        return f"dt{kind}{hashlib.sha1(self.hostname.encode()).hexdigest()[:10]}"

    @property
    def veth_mgmt(self) -> str:
        return self._ifname("m")

    @property
    def veth_ib(self) -> str:
        return self._ifname("i")

    @property
    def dir(self) -> Path:
        return NODES / self.hostname

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def data_disk(self) -> Path:
        # A second disk that survives `recreate`, mounted where MinIO keeps its data.
        return DISKS / self.hostname / "data"


@dataclass(frozen=True)
class LabSpec:
    cluster_path: Path
    nodes: tuple[LabNode, ...]
    management: ipaddress.IPv4Network
    ipoib: ipaddress.IPv4Network
    ssh_key: Path
    storage_data_dir: str

    @property
    def controller_address(self) -> ipaddress.IPv4Address:
        return next(self.management.hosts())

    @property
    def bridge_mgmt(self) -> str:
        return f"dtbr{self.management.network_address.packed[2]}"

    @property
    def bridge_ib(self) -> str:
        return f"dtib{self.management.network_address.packed[2]}"

    def node(self, hostname: str) -> LabNode:
        for n in self.nodes:
            if n.hostname == hostname:
                return n
        names = ", ".join(n.hostname for n in self.nodes)
        raise KeyError(f"{hostname}: not a node of {self.cluster_path} ({names})")


def _secret_files(tree):
    if isinstance(tree, dict):
        if set(tree) == {"file"} and isinstance(tree["file"], str):
            yield Path(tree["file"])
        for value in tree.values():
            yield from _secret_files(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _secret_files(value)


def lab_password() -> str:
    # Satisfies Determined's admin password policy (upper, lower, digit, 8+).
    return "Lab" + secrets.token_hex(12) + "7"


def ensure_secrets(cluster_path: Path) -> list[Path]:
    """Create every {file: ...} secret the cluster file names, 0600, if missing."""
    made = []
    raw = yaml.safe_load(Path(cluster_path).read_text())
    for path in _secret_files(raw):
        if path.exists() and path.stat().st_size:
            continue
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(lab_password() + "\n")
        made.append(path)
    return made


def lab_ssh_key(cluster_path: Path) -> Path:
    """ssh.key_file, read from the file itself: the model refuses a key file that does not exist
    (deploy/cluster/ssh.py), and on a new machine the lab makes it before the model can load."""
    raw = yaml.safe_load(Path(cluster_path).read_text())
    key = (raw.get("ssh") or {}).get("key_file") if isinstance(raw, dict) else None
    if not isinstance(key, str) or not key.startswith("/"):
        raise SystemExit(f"{cluster_path}: ssh.key_file: {key!r}: a lab names its SSH key by absolute path")
    return Path(key)


def load_spec(cluster_path: Path) -> LabSpec:
    from deploy.cluster import load_cluster

    from .hardware import node_packages

    cluster = load_cluster(cluster_path)
    packages = node_packages(cluster_path)
    nodes = tuple(
        LabNode(
            hostname=n.hostname,
            address=n.address,
            ipoib_address=n.ipoib_address,
            prefixlen=cluster.network.management.prefixlen,
            is_storage=n.hostname == cluster.storage_node.hostname,
            packages=packages.get(n.hostname, ())
            + (MINIO_STANDIN_PACKAGES if n.hostname == cluster.storage_node.hostname else ()),
        )
        for n in cluster.nodes
    )
    return LabSpec(
        cluster_path=Path(cluster_path),
        nodes=nodes,
        management=cluster.network.management,
        ipoib=cluster.network.ipoib.subnet,
        ssh_key=Path(cluster.ssh.key_file),
        storage_data_dir=cluster.storage.data_dir,
    )
