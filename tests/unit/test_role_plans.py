"""Each role's whole plan for one node: fresh-node facts give the cold deploy's commands,
as-deployed facts give no change.

tests/unit/optest.py `plan` runs a role's @deploy apply() under a real pyinfra State for one
host that never connects; the facts below are all it may read (a missing one fails the test by
name). "fresh" is a Debian 12 node as its installer leaves it; "deployed" is that node once the
cold plan ran, its facts derived from the cold plan itself (its uploads, mkdir/chmod/chown,
groupadd/useradd, fetch-verified files, apt installs) plus the pins, so a role whose second run
would differ from what its first one wrote shows up as a change.

What a plan here cannot show: facts are read once, so an operation sees the node as it was
before the run, not as the operations before it left it (pyinfra re-reads facts when it
executes). Where that matters the fresh case gives the facts an operation meets when it runs on
a cold deploy: the apt cache already lists the mirror's pins (the plan's own `apt-get update`
brings them), the GPU topology is readable (the driver's reboot came first). Services the
controller talks to (MinIO's admin API) are facts of the case too (Case.controller).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.docker import DockerImage
from pyinfra.facts.files import Block, Directory, File, FileContents, FindInFile, Link, Sha1File, Sha256File
from pyinfra.facts.postgres import PostgresDatabases
from pyinfra.facts.server import (
    Groups,
    Hostname,
    KernelVersion,
    LinuxDistribution,
    Os,
    Port,
    TmpDir,
    Users,
    Which,
)
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from deploy.cluster import load_cluster
from deploy.facts.apt import AptRepoVersions, HeldPackages
from deploy.facts.determined import DomainAgents, Instance
from deploy.facts.determined_users import MasterUsers
from deploy.facts.fabric import OfedRelease
from deploy.facts.gpu import GpuMigModes, GpuPersistence, GpuTopology, ModuleState, NvSwitches
from deploy.facts.keyring import KeptKeyring
from deploy.facts.postgresql import RoleVerifier
from deploy.facts.system import (
    DiskFreeGB,
    FirewallRules,
    IsMountPoint,
    ManagedFiles,
    NetDevice,
    NetLinkTypes,
    NetplanFeatures,
    ResolvedPath,
    SecureBootState,
    UnitState,
)
from deploy.facts.trust import SecretFileState
from deploy.pins import (
    CUDA_KEYRING_VERSION,
    CUDA_LINK,
    all_pins,
    cuda_home,
    fabricmanager_pins,
    ofed_release,
)
from deploy.training import Busy
from roles.apt import proxy as apt_proxy
from roles.determined import agent as determined_agent
from roles.determined import docker, task_images
from roles.determined import master as determined_master
from roles.determined import users as determined_users
from roles.fabric import ipoib, mofed, opensm
from roles.fabric.ipoib import ARPHRD_INFINIBAND
from roles.minio import server as minio
from roles.minio import tls as minio_tls
from roles.node import firewall, hosts, preflight
from roles.nvidia import cuda, gpu_services, nccl
from roles.nvidia import driver as nvidia_driver
from roles.postgresql import backup as pg_backup
from roles.postgresql import db_role as postgresql_role
from roles.postgresql import server as postgresql
from roles.shared import kernel
from tests.lab.standins.mofed.build import OPENSM_VERSION
from tests.unit.optest import Facts, Planned, changing, plan, shown
from tests.unit.test_cluster import lab_copy


@pytest.fixture(scope="module")
def lab_secrets(tmp_path_factory):
    path, secrets = lab_copy(tmp_path_factory.mktemp("lab"))
    return load_cluster(path), secrets


@pytest.fixture(scope="module")
def lab(lab_secrets):
    return lab_secrets[0]


@pytest.fixture(autouse=True)
def _no_operator_login(monkeypatch):
    # determined_users reads the operator's DET_USER/DET_PASS: a plan must not depend on the
    # shell the tests run from.
    monkeypatch.delenv("DET_USER", raising=False)
    monkeypatch.delenv("DET_PASS", raising=False)


DEBIAN_12 = {
    "name": "Debian",
    "major": 12,
    "minor": None,
    "release_meta": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"},
}
KERNEL = "6.1.0-18-amd64"
# What a Debian 12 installer leaves: these packages (its kernel among them), none of the cluster's.
BASE_PACKAGES = {
    "bash": ["5.2.15-2+b7"],
    "systemd": ["252.30-1~deb12u2"],
    "curl": ["7.88.1-10+deb12u8"],
    f"linux-image-{KERNEL}": ["6.1.76-1"],
    "linux-image-amd64": ["6.1.76-1"],
}


def no_file(**_):
    return None


def base_facts(more: dict) -> dict:
    """The facts every role reads the same way on a fresh node, with `more` over them."""
    return {
        LinuxDistribution: DEBIAN_12,
        Os: "Linux",
        TmpDir: "/tmp",  # where pyinfra puts its upload temp files
        DomainAgents: lambda **_: {},  # no per-NVLink-domain agents (determined_domains.py)
        Which: lambda command: f"/usr/bin/{command}",
        File: no_file,
        Directory: no_file,
        Link: no_file,
        DebPackages: dict(BASE_PACKAGES),
        FindInFile: find_in_file({}),
        **more,
    }


def find_in_file(found: dict[str, list[str]]):
    """FindInFile by path: the lines `found` gives for that path, none elsewhere."""

    def fact_value(path, pattern, **_):
        return found.get(path, [])

    return fact_value


# --- roles/node/hosts.py ---------------------------------------------------------------------------


def hosts_fresh(cluster, node) -> dict:
    return base_facts(
        {
            Hostname: "debian",
            FindInFile: find_in_file({"/etc/hosts": ["127.0.1.1\tdebian"]}),
            Block: [],  # /etc/hosts without our block
        }
    )


def hosts_deployed_after(cluster, node, cold) -> dict:
    return base_facts(
        {
            Hostname: node.hostname,
            Block: hosts.hosts_block(cluster).splitlines(),
        }
    )


# --- roles/node/firewall.py ------------------------------------------------------------------------

CLEAN_DUMP = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", "COMMIT"]


def firewall_fresh(cluster, node) -> dict:
    # A node someone firewalled: ufw enabled, firewalld running, a rule of theirs.
    return base_facts(
        {
            FindInFile: find_in_file({"/etc/ufw/ufw.conf": ["ENABLED=yes"]}),
            SystemdEnabled: lambda services, **_: dict.fromkeys(services, True),
            SystemdStatus: lambda services, **_: dict.fromkeys(services, True),
            FirewallRules: {"iptables": [*CLEAN_DUMP[:-1], "-A INPUT -p tcp --dport 22 -j ACCEPT", "COMMIT"]},
        }
    )


def firewall_deployed_after(cluster, node, cold) -> dict:
    return base_facts(
        {
            DebPackages: {**BASE_PACKAGES, "iptables": ["1.8.9-2"]},
            SystemdEnabled: lambda services, **_: dict.fromkeys(services, False),
            FirewallRules: {"iptables": CLEAN_DUMP, "ip6tables": CLEAN_DUMP},
        }
    )


# --- one fresh node, and the same node once deployed ------------------------------------------


def pins_of(cluster, fabric_manager: bool = True) -> dict[str, str]:
    """Every apt pin of a GPU node, package -> version (the fabric manager's: NVSwitch nodes)."""
    pinsets = [*all_pins(cluster.versions)]
    if fabric_manager:
        pinsets.append(fabricmanager_pins(cluster.versions.nvidia_driver))
    return {p: v for pinset in pinsets for p, v in pinset.packages}


def mirror_offers(cluster):
    """AptRepoVersions as apt-cache madison reads it once the CUDA repository's lists are in:
    every pin, from this node's repo folder. A fact is read once here (no re-read after the
    plan's own `apt-get update`), so the cold plan sees the lists its update brings."""
    repo = cluster.sources.cuda_repo_for("debian", "12").rstrip("/")
    pins = pins_of(cluster)

    def offered(packages, **_):
        return {p: {(pins[p], repo)} for p in packages if p in pins}

    return offered


def fresh(cluster, node) -> dict:
    """A Debian 12 node as its installer leaves it: none of the cluster's packages, files,
    units or kernel modules."""
    return base_facts(
        {
            Hostname: "debian",
            Groups: ["root", "daemon", "sudo", "users"],
            Users: {"root": {"home": "/root", "shell": "/bin/bash", "group": "root", "groups": [], "uid": 0}},
            KernelVersion: KERNEL,
            HeldPackages: [],
            AptRepoVersions: mirror_offers(cluster),
            KeptKeyring: lambda **_: {"deb": "", "keyring": False, "version": ""},
            FileContents: no_file,
            Sha1File: no_file,
            Sha256File: no_file,
            OfedRelease: None,
            UnitState: lambda **_: ("inactive", "disabled"),
            ResolvedPath: no_file,
            SecretFileState: no_file,
            SystemdEnabled: lambda services, **_: dict.fromkeys(services, False),
            SystemdStatus: lambda services, **_: dict.fromkeys(services, False),
        }
    )


def _content(command: FileUploadCommand) -> bytes:
    src = command.src
    if hasattr(src, "seek"):
        src.seek(0)
    data = src.read() if hasattr(src, "read") else Path(src).read_bytes()
    return data.encode() if isinstance(data, str) else data


def placed(cold: list[Planned]) -> dict[str, dict]:
    """The paths the cold plan leaves: path -> {"content" (None for a directory), "mode",
    "user", "group"}, from its uploads, mkdir -p, touch, chmod and chown (each part of an
    `a && b` command on its own)."""
    found: dict[str, dict] = {}

    def entry(path: str, content: bytes | None = None) -> dict:
        return found.setdefault(path, {"content": content, "mode": None, "user": "root", "group": "root"})

    for op in cold:
        for command in op.commands:
            if isinstance(command, FileUploadCommand):
                entry(str(command.dest))["content"] = _content(command)
                continue
            if not isinstance(command, StringCommand):
                continue
            for part in command.get_raw_value().split(" && "):
                try:
                    words = shlex.split(part)
                except ValueError:
                    continue
                if words[:2] == ["mkdir", "-p"]:
                    for w in words[2:]:
                        if w.startswith("/"):
                            entry(w)
                elif len(words) == 2 and words[0] == "touch":
                    entry(words[1], b"")
                elif len(words) == 3 and words[0] == "chmod" and words[2].startswith("/"):
                    entry(words[2])["mode"] = int(words[1])
                elif len(words) == 3 and words[0] == "chown" and words[2].startswith("/"):
                    user, _, group = words[1].partition(":")
                    entry(words[2]).update(user=user, group=group or user)
    return found


def accounts(cold: list[Planned]) -> tuple[list[str], dict[str, dict]]:
    """The groups and users the cold plan's groupadd and useradd make, as pyinfra's Groups and
    Users facts list them."""
    groups: list[str] = []
    users: dict[str, dict] = {}
    for op in cold:
        for command in op.commands:
            if not isinstance(command, StringCommand):
                continue
            words = shlex.split(command.get_raw_value())
            if words[:1] == ["groupadd"]:
                groups.append(words[-1])
            elif words[:1] == ["useradd"]:
                flags = dict(zip(words[1:-1:], words[2:-1], strict=False))
                users[words[-1]] = {
                    "home": flags.get("-d"),
                    "shell": flags.get("-s"),
                    "group": flags.get("-g"),
                    "groups": [g for g in flags.get("-G", "").split(",") if g],
                    "uid": 999,
                }
    return groups, users


def fetched_files(cold: list[Planned]) -> dict[str, str]:
    """dest -> sha256 of what the cold plan's fetch-verified.sh calls leave (the pinned file)."""
    fetched = {}
    for op in cold:
        for command in op.commands:
            line = shown(command)
            if isinstance(line, list) and line[:2] == ["script", "shared/fetch-verified.sh"]:
                fetched[line[3]] = line[5]
    return fetched


def verified_debs(fetched: dict[str, str]) -> dict[str, list[str]]:
    """The packages of the fetched <package>_<version>.verified.deb files, installed."""
    debs = {}
    for dest in fetched:
        name = Path(dest).name
        if name.endswith(".verified.deb"):
            package, _, version = name.removesuffix(".verified.deb").partition("_")
            debs[package] = [version]
    return debs


def apt_installed(cold: list[Planned]) -> list[str]:
    """The packages the cold plan's `apt-get ... install` commands name (pinned or not)."""
    names = []
    for op in cold:
        for command in op.commands:
            if isinstance(command, StringCommand) and "apt-get" in (text := command.get_raw_value()):
                words = shlex.split(text)
                if "install" in words:
                    after = words[words.index("install") + 1 :]
                    names += [w.split("=")[0] for w in after if not w.startswith("-") and "/" not in w]
    return names


def deployed(cluster, node, cold: list[Planned]) -> Facts:
    """The node after the cold plan ran: its packages at their pins, its files, directories,
    users and groups in place (get_file serves the files, as SFTP would)."""
    paths = placed(cold)
    files = {path: e for path, e in paths.items() if e["content"] is not None}
    dirs = {path: e for path, e in paths.items() if e["content"] is None}
    dirs.update({str(Path(path).parent): {"mode": 755, "user": "root", "group": "root"} for path in files})
    # The fabric manager only where the cold plan installed it: elsewhere the role removes it.
    fabric = fabricmanager_pins(cluster.versions.nvidia_driver).packages[0][0] in apt_installed(cold)
    pins = pins_of(cluster, fabric_manager=fabric)
    groups, users = accounts(cold)
    fetched = fetched_files(cold)

    def attributes(table: dict, default_mode: int):
        def fact_value(path, **_):
            e = table.get(path)
            return (
                None
                if e is None
                else {"mode": e["mode"] or default_mode, "user": e["user"], "group": e["group"]}
            )

        return fact_value

    def secret_state(path, **_):  # SecretFileState: the mode as `stat -c %a` prints it
        e = files.get(path)
        return None if e is None else {"user": e["user"], "group": e["group"], "mode": str(e["mode"] or 644)}

    def digest(name):
        def fact_value(path, **_):
            if name == "sha256" and path in fetched:
                return fetched[path]
            return hashlib.new(name, files[path]["content"]).hexdigest() if path in files else None

        return fact_value

    installed = {
        **BASE_PACKAGES,
        **{p: ["1.0-1"] for p in apt_installed(cold)},
        **{p: [v] for p, v in pins.items()},
        **verified_debs(fetched),
    }
    table = base_facts(
        {
            Hostname: node.hostname,
            KernelVersion: KERNEL,
            DebPackages: installed,
            # The pins, and the running kernel's packages: a deploy holds those it installs too
            # (its hold reads the packages when it runs; a plan's facts are read once).
            HeldPackages: sorted(pins) + [p for p in kernel.hold_candidates(KERNEL) if p in installed],
            AptRepoVersions: mirror_offers(cluster),
            File: attributes(files, 644),
            Directory: attributes(dirs, 755),
            SecretFileState: secret_state,
            Groups: ["root", "daemon", "sudo", "users", *groups],
            Users: {**fresh(cluster, node)[Users], **users},
            Sha1File: digest("sha1"),
            Sha256File: digest("sha256"),
            FileContents: lambda path, **_: (
                files[path]["content"].decode().splitlines() if path in files else None
            ),
            KeptKeyring: lambda **_: {
                "deb": cluster.sources.cuda_keyring_sha256("debian", "12"),
                "keyring": True,
                "version": CUDA_KEYRING_VERSION,
            },
            OfedRelease: ofed_release(cluster.versions.mofed),
            # The "cuda" alternative cuda-link.sh set: /usr/local/cuda leads to the pinned toolkit.
            ResolvedPath: lambda path, **_: cuda_home(cluster.versions.cuda) if path == CUDA_LINK else None,
            UnitState: lambda **_: ("active", "enabled"),
            SystemdEnabled: lambda services, **_: dict.fromkeys(services, True),
            SystemdStatus: lambda services, **_: dict.fromkeys(services, True),
        }
    )
    return Facts(table, files={path: e["content"] for path, e in files.items()})


# --- roles/fabric/opensm.py: a fresh node (MLNX_OFED, and with it opensm, comes later in the same
# deploy: the facts show no opensm), and one where opensmd runs


def opensm_installed(cluster, node) -> dict:
    facts = fresh(cluster, node)
    facts[DebPackages] = {**BASE_PACKAGES, "opensm": [OPENSM_VERSION]}
    return facts


def opensm_on(cluster, node, cold=None) -> Facts:
    return Facts(
        {
            **opensm_installed(cluster, node),
            UnitState: lambda **_: ("active", "enabled"),
            SystemdEnabled: lambda services, **_: dict.fromkeys(services, True),
            SystemdStatus: lambda services, **_: dict.fromkeys(services, True),
        }
    )


# --- roles/fabric/ipoib.py: ib0 there (MLNX_OFED loaded ib_ipoib), not configured -------------------

IB_FEATURES = ["dhcp-use-domains", "ipv6-mtu", "infiniband"]  # `netplan info` on Ubuntu 24.04


def ipoib_fresh(netplan: bool) -> Callable:
    def facts(cluster, node) -> dict:
        return {
            **fresh(cluster, node),
            NetLinkTypes: {"lo": 772, "eth0": 1, node.ipoib_interface: ARPHRD_INFINIBAND},
            NetplanFeatures: IB_FEATURES if netplan else None,
            NetDevice: lambda interface, **_: {"up": False, "addresses": [], "mtu": 4092},
            ManagedFiles: lambda **_: [],
            FindInFile: find_in_file({}),
        }

    return facts


def ipoib_deployed(netplan: bool) -> Callable:
    def facts(cluster, node, cold) -> Facts:
        cidr = f"{node.ipoib_address}/{cluster.network.ipoib.subnet.prefixlen}"
        facts = deployed(cluster, node, cold)
        facts.table.update(
            {
                NetLinkTypes: {"lo": 772, "eth0": 1, node.ipoib_interface: ARPHRD_INFINIBAND},
                NetplanFeatures: IB_FEATURES if netplan else None,
                NetDevice: lambda interface, **_: {
                    "up": True,
                    "addresses": [cidr],
                    "mtu": cluster.network.ipoib.mtu,
                },
                ManagedFiles: lambda directory, **_: [
                    p for p in placed(cold) if p.startswith(directory + "/")
                ],
                FindInFile: find_in_file({"/etc/network/interfaces": ["source /etc/network/interfaces.d/*"]}),
            }
        )
        return facts

    return facts


# --- roles/minio/server.py ---------------------------------------------------------------------------


def minio_controller(monkeypatch, deployed: bool) -> None:
    """MinIO as the controller finds it: not up yet on a fresh node; bucket and users as
    cluster.yaml says once deployed."""
    from deploy import minio_admin as iam
    from deploy import s3

    monkeypatch.setattr(s3, "bucket_problem", lambda cluster: None if deployed else "connection refused")

    def read_state(cluster, user=None, **_):
        if not deployed:
            raise iam.IamError("connection refused")
        return SimpleNamespace(problems=[])

    monkeypatch.setattr(iam, "read_state", read_state)


# --- roles/postgresql/server.py ----------------------------------------------------------------------


def postgresql_fresh(cluster, node) -> dict:
    return {**fresh(cluster, node), RoleVerifier: None, PostgresDatabases: {}}


def postgresql_deployed(cluster, node, cold) -> Facts:
    """The role made with the cold plan's verifier, as RoleVerifier reports it: its salt and a
    digest keyed with the node key the cold plan wrote."""
    facts = deployed(cluster, node, cold)
    paths = placed(cold)
    key = postgresql_role.hmac_key(paths[postgresql_role.DIGEST_KEY]["content"])
    [statement] = [e["content"] for e in paths.values() if e["content"] and b" ROLE " in e["content"]]
    found = re.search(rb"PASSWORD '([^']+)'", statement)
    assert key is not None and found is not None, "the cold plan wrote the node key and the role"
    verifier = found.group(1).decode()
    facts.table[RoleVerifier] = {
        "salt": verifier.split("$")[1],
        "digest": hmac.new(key, verifier.encode(), "sha256").hexdigest(),
    }
    db = cluster.database
    facts.table[PostgresDatabases] = {
        db.name: {"owner": db.user, "encoding": "UTF8", "lc_collate": "C.UTF-8"}
    }
    return facts


# --- roles/determined/docker.py --------------------------------------------------------------------------


def docker_deployed(cluster, node, cold) -> Facts:
    """daemon.json as nvidia-ctk (a command, not an upload: the cold plan cannot show what it
    wrote) and then the ulimits merge leave it."""
    facts = deployed(cluster, node, cold)
    ctk = ['{"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}']
    content = docker.merged(ctk, docker.daemon_settings(cluster.determined.memlock_bytes))
    assert content is not None  # the ulimits are not in nvidia-ctk's file: the merge adds them
    table = facts.table
    before = table[FileContents]
    table[FileContents] = lambda path, **_: (
        content.splitlines() if path == docker.DAEMON_JSON else before(path)
    )
    return facts


# --- roles/determined/users.py, roles/determined/task_images.py: what the master and Docker report -------

MASTER_STARTING = {"master": "down", "admin": "error", "determined": "unknown"}  # just installed
MASTER_SETTLED = {"master": "up", "admin": "ok", "determined": "inactive", "smoke": "ok"}


def users_fresh(cluster, node) -> dict:
    return {**fresh(cluster, node), MasterUsers: MASTER_STARTING}


def users_deployed(cluster, node, cold) -> Facts:
    facts = deployed(cluster, node, cold)
    facts.table[MasterUsers] = MASTER_SETTLED
    return facts


def images_fresh(cluster, node) -> dict:
    return {**fresh(cluster, node), DockerImage: lambda object_id, **_: []}


def images_deployed(cluster, node, cold) -> Facts:
    facts = deployed(cluster, node, cold)
    facts.table[DockerImage] = lambda object_id, **_: [
        {"Id": "sha256:" + "0" * 64, "RepoDigests": [object_id]}
    ]
    return facts


# --- roles/nvidia/gpu_services.py --------------------------------------------------------------------


def gpu_fresh(switches: list[str]) -> Callable:
    def facts(cluster, node) -> dict:
        # nvidia-smi has no driver yet: no GPU listed (the daemon's start sets persistence).
        # No nvidia-peermem in /sys/module: the driver's reboot loaded only what it had then.
        return {**fresh(cluster, node), GpuPersistence: {}, NvSwitches: switches, ModuleState: None}

    return facts


def gpu_deployed(switches: list[str]) -> Callable:
    def facts(cluster, node, cold) -> Facts:
        facts = deployed(cluster, node, cold)
        facts.table.update(
            {
                GpuPersistence: {0: "Enabled", 1: "Enabled"},
                NvSwitches: switches,
                Link: links(cold),
                ModuleState: "live",
            }
        )
        return facts

    return facts


def links(cold: list[Planned]):
    """pyinfra's Link fact for the symlinks the cold plan's `ln -s` made."""
    made = {}
    for op in cold:
        for command in op.commands:
            if isinstance(command, StringCommand):
                words = shlex.split(command.get_raw_value())
                if words[:1] == ["ln"] and "-s" in words:
                    made[words[-1]] = words[-2]
    return lambda path, **_: (
        {"link_target": made[path], "user": "root", "group": "root"} if path in made else None
    )


# --- roles/determined/domains.py: one agent per NVLink domain ---------------------------------

TOPOLOGY = Path(__file__).parent / "topology_data" / "dgx1_v100_hybrid_cube_mesh.txt"  # 2 x 4 GPUs


def domains_fresh(cluster, node) -> dict:
    # The topology as the operation reads it when it runs, after the driver's reboot.
    return {
        **fresh(cluster, node),
        GpuTopology: GpuTopology().process(TOPOLOGY.read_text().splitlines()),
        GpuMigModes: dict.fromkeys(range(8), "Disabled"),
    }


def domains_deployed(cluster, node, cold) -> Facts:
    facts = deployed(cluster, node, cold)
    running = Instance(config=True, enabled=True, active="active")
    facts.table.update(
        {
            GpuTopology: domains_fresh(cluster, node)[GpuTopology],
            GpuMigModes: dict.fromkeys(range(8), "Disabled"),
            DomainAgents: lambda **_: {"0": running, "1": running},
            UnitState: lambda unit, **_: ("inactive", "disabled"),  # the package's plain unit: off
        }
    )
    return facts


# --- roles/minio/tls.py without storage.tls: a CA an earlier cluster.yaml installed goes --------


def old_ca_fresh(cluster, node) -> dict:
    ca = minio_tls.SYSTEM_CA
    return {
        **fresh(cluster, node),
        File: lambda path, **_: {"mode": 644, "user": "root", "group": "root"} if path == ca else None,
    }


# --- the cases ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    role: Any  # the roles/ module: its apply() is planned
    node: str  # the lab node it runs on
    fresh: Callable  # (cluster, node) -> facts of a fresh node
    deployed: Callable  # (cluster, node, cold plan) -> facts of the node once deployed
    # The cold plan's operations that change something, in order: name -> parts of their
    # commands (shown as optest.shown writes them) that must be there; or (cluster) -> that.
    cold: dict[str, list[str]] | Callable
    # What the controller reads from the cluster's services (MinIO's admin API, Determined's
    # REST API) while planning: (monkeypatch, deployed) sets it up, no network involved.
    controller: Callable | None = None

    @property
    def id(self) -> str:
        return f"{self.role.__name__.rsplit('.', 1)[-1]}@{self.node}"


# The CUDA repository's two operations, in every role that installs from it.
CUDA_REPO = {
    "NVIDIA CUDA apt repository | Trust the CUDA repository (cuda-keyring_1.1-1_all.deb)": [
        "shared/fetch-verified.sh",
        "433030adae11733ec494586dcff6a1c6dccb15436aba4cb3ac56dec1a28bf150",
        "--reinstall",
    ],
    "NVIDIA CUDA apt repository | CUDA repository sources list": [
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "http://10.77.0.1:8077/cuda/repos/debian12/x86_64/ /",
        "/etc/apt/sources.list.d/cuda-debian12-x86_64.list",
    ],
}
HEADERS = {
    f"Refresh apt lists for headers of the running kernel {KERNEL}": ["shared/apt-update.sh"],
    f"Install headers of the running kernel {KERNEL}": ["install", f"linux-headers-{KERNEL}"],
}


def pinned_packages(name: str, install: str, *parts: str) -> dict[str, list[str]]:
    """apt_pins.pinned's operations for a pin set on a fresh node (the repo offers its pins)."""
    return {
        f"Pinned packages | apt-get update if the cache lacks {name}": ["shared/apt-update.sh"],
        f"Pinned packages | apt preferences for {name}": [f"/etc/apt/preferences.d/{name}.pref"],
        f"Pinned packages | Install {install}": ["--allow-downgrades", *parts],
        f"Pinned packages | Hold {name}": ["shared/apt-mark-hold.sh"],
    }


PERSISTENCED = {
    "nvidia-persistenced turns persistence mode on": [
        "/etc/systemd/system/nvidia-persistenced.service.d/10-persistence-mode.conf"
    ],
    "nvidia-persistenced starts at every boot": [
        "ln -s /lib/systemd/system/nvidia-persistenced.service /etc/systemd/system/multi-user.target.wants/"
    ],
    "Reload systemd for nvidia-persistenced": ["systemctl daemon-reload"],
    "Restart nvidia-persistenced with persistence mode": ["nvidia-persistenced.service"],
    "nvidia-persistenced running": ["systemctl start nvidia-persistenced.service"],
}
PEERMEM = {
    "nvidia-peermem loads at boot (GPUDirect RDMA)": ["/etc/modules-load.d/nvidia-peermem.conf"],
    "nvidia-peermem loaded (GPUDirect RDMA)": ["modprobe nvidia_peermem"],
}

CASES = [
    Case(
        minio_tls,
        "lab-gpu1",
        old_ca_fresh,
        deployed,  # the file is gone: the cold plan uploaded nothing there
        {
            f"No storage CA without storage.tls.ca_certificate ({minio_tls.SYSTEM_CA})": [
                f"rm -f {minio_tls.SYSTEM_CA}"
            ],
            "Rebuild the system trust store without the storage CA": ["update-ca-certificates"],
        },
    ),
    Case(
        determined_agent,
        "lab-gpu1",  # agent_layout per_domain, two 4-GPU NVLink domains
        domains_fresh,
        domains_deployed,
        {
            "Refresh apt lists for download tools": ["shared/apt-update.sh"],
            "Install download tools": ["install", "ca-certificates"],
            "/etc/determined": ["mkdir -p /etc/determined"],
            "/etc/determined/agent.yaml: unused on a per_domain node (no master_host)": [
                "agent_layout: per_domain"
            ],
            "Agent unit drop-in: keep retrying until the master answers": ["agent-10-restart.conf"],
            "Install determined-agent 0.38.0 (sha256-pinned)": ["determined-agent_0.38.0_linux_amd64.deb"],
            "Per-domain agent unit /etc/systemd/system/determined-agent@.service": [
                "/etc/systemd/system/determined-agent@.service"
            ],
            "One agent per NVLink domain (nvidia-smi topo -m, read now)": [
                "/etc/determined/agent-0.yaml",
                "/etc/determined/agent-1.yaml",
                "systemctl enable determined-agent@0.service",
                "systemctl restart determined-agent@1.service",
            ],
        },
    ),
    Case(gpu_services, "lab-gpu3", gpu_fresh([]), gpu_deployed([]), {**PERSISTENCED, **PEERMEM}),
    Case(
        gpu_services,
        "lab-gpu2",  # NVSwitches: the fabric manager at the driver's branch
        gpu_fresh(["0000:07:00.0", "0000:08:00.0"]),
        gpu_deployed(["0000:07:00.0", "0000:08:00.0"]),
        {
            **PERSISTENCED,
            **CUDA_REPO,
            **pinned_packages(
                "nvidia-fabricmanager", "nvidia-fabricmanager-515=515.65.01-1", "nvidia-fabricmanager-515="
            ),
            "The fabric manager starts before the agents": [
                "/etc/systemd/system/nvidia-fabricmanager.service.d/"
            ],
            "Reload systemd for the fabric manager": ["systemctl daemon-reload"],
            "Restart the fabric manager at its new version": ["nvidia-fabricmanager.service"],
            "Fabric manager enabled and running": ["systemctl enable nvidia-fabricmanager.service"],
            **PEERMEM,
        },
    ),
    Case(
        apt_proxy,
        "lab-gpu1",
        fresh,
        deployed,
        {
            "Apt proxy and lock timeout": [
                "/etc/apt/apt.conf.d/90gpu-cluster",
                'DPkg::Lock::Timeout \\"600\\"',
                'Acquire::http::Proxy \\"http://10.77.0.1:3142\\"',
            ],
        },
    ),
    Case(
        pg_backup,
        "lab-master",
        fresh,
        deployed,
        {
            "Refresh apt lists for the backup program's interpreter": ["shared/apt-update.sh"],
            "Install the backup program's interpreter": ["install", "python3"],
            "Backup program /usr/local/sbin/pg-backup": ["files/postgresql/pg-backup", "chmod 755"],
            "/etc/pg-backup": ["mkdir -p /etc/pg-backup"],
            "Backup settings /etc/pg-backup/pg-backup.conf": ["/etc/pg-backup/pg-backup.conf"],
            "Backup S3 keys /etc/pg-backup/s3.env": ["chmod 600 /etc/pg-backup/s3.env"],
            "Backup unit pg-backup.service": ["/etc/systemd/system/pg-backup.service"],
            "Backup unit pg-backup.timer": ["/etc/systemd/system/pg-backup.timer"],
            "Backup unit pg-backup-drill.service": ["/etc/systemd/system/pg-backup-drill.service"],
            "Backup unit pg-backup-drill.timer": ["/etc/systemd/system/pg-backup-drill.timer"],
            "Reload systemd for the backup units": ["systemctl daemon-reload"],
            "Nightly backup timer enabled and running": ["systemctl enable pg-backup.timer"],
            "Weekly restore drill timer enabled and running": ["systemctl enable pg-backup-drill.timer"],
        },
    ),
    Case(
        determined_users,
        "lab-master",
        users_fresh,
        users_deployed,
        {
            "Determined users: admin's password is determined.admin_password, `determined` inactive, "
            "cluster-smoke (verify's smoke) no admin": [
                "python3 -c",
                " apply 23457 /etc/determined/master.yaml",
            ]
        },
    ),
    Case(
        task_images,
        "lab-gpu3",
        images_fresh,
        images_deployed,
        # The images by digest as cluster.yaml pins them (tests.lab up rewrites the lab's pins).
        lambda cluster: {
            "Docker's CA directory for 10.77.0.1:5000": ["mkdir -p /etc/docker/certs.d/10.77.0.1:5000"],
            "Registry CA for 10.77.0.1:5000": ["/etc/docker/certs.d/10.77.0.1:5000/ca.crt"],
            **{f"Trial image {ref}": [f"docker image pull {ref}"] for ref in task_images.pulled(cluster)},
        },
    ),
    Case(
        docker,
        "lab-gpu1",
        fresh,
        docker_deployed,
        {
            "Refresh apt lists for Docker": ["shared/apt-update.sh"],
            "Install Docker": ["install", "docker.io"],
            **CUDA_REPO,
            **pinned_packages(
                "nvidia-container-toolkit",
                "libnvidia-container1=1.13.5-1 and 3 more",
                "nvidia-container-toolkit=1.13.5-1",
            ),
            "Docker knows the nvidia runtime (nvidia-ctk)": ["nvidia-ctk runtime configure --runtime=docker"],
            "Docker's default ulimits: memlock 8388608 bytes": ["/etc/docker/daemon.json", "8388608"],
            "Restart Docker for its new daemon.json": ["docker.service"],
            "Docker enabled and running": ["systemctl enable docker.service"],
        },
    ),
    Case(
        determined_agent,
        "lab-gpu3",  # one agent for the node (agent_layout per_node)
        fresh,
        deployed,
        {
            "Refresh apt lists for download tools": ["shared/apt-update.sh"],
            "Install download tools": ["install", "ca-certificates"],
            "/etc/determined": ["mkdir -p /etc/determined"],
            "Agent configuration /etc/determined/agent.yaml": [
                "/etc/determined/agent.yaml",
                "master_port: 23457",
                'container_master_host: \\"10.77.0.10\\"',  # JSON-quoted in the upload shown
                'agent_id: \\"lab-gpu3\\"',
            ],
            "Agent unit drop-in: keep retrying until the master answers": [
                "/etc/systemd/system/determined-agent.service.d/10-restart.conf"
            ],
            "Install determined-agent 0.38.0 (sha256-pinned)": [
                "determined-agent_0.38.0_linux_amd64.deb",
                "5173e3f630560f4a5799704d84a3d7e570c0d7c1cb1060d30a484b2008e3c831",
            ],
            "Agent enabled and running": ["systemctl enable determined-agent.service"],
        },
    ),
    Case(
        determined_master,
        "lab-master",
        fresh,
        deployed,
        {
            "Refresh apt lists for download and health-check tools": ["shared/apt-update.sh"],
            "Install download and health-check tools": ["install", "ca-certificates"],
            "/etc/determined": ["mkdir -p /etc/determined", "chmod 755"],
            "Master configuration /etc/determined/master.yaml": [
                "chmod 600 /etc/determined/master.yaml",
                "port: 23457",
            ],
            "Master S3 environment /etc/determined/master-s3.env": [
                "chmod 600 /etc/determined/master-s3.env"
            ],
            "Master unit drop-in loading the S3 environment": [
                "/etc/systemd/system/determined-master.service.d/10-s3.conf"
            ],
            "Install determined-master 0.38.0 (sha256-pinned)": [
                "shared/fetch-verified.sh",
                "determined-master_0.38.0_linux_amd64.deb",
                "63d535d7f7c9855d4c10d5ae868a6f22f8b8a235e002eed20be8cdcb4e55d418",
            ],
            # No "Restart the master for its new configuration": the install starts it anew.
            "Master enabled and running": ["systemctl enable determined-master.service"],
            "Wait until the Determined master is ready": ["http://127.0.0.1:23457/health"],
        },
    ),
    Case(
        postgresql,
        "lab-master",
        postgresql_fresh,
        postgresql_deployed,
        {
            "Refresh apt lists for PostgreSQL 15": ["shared/apt-update.sh"],
            "Install PostgreSQL 15": ["install", "postgresql-15"],
            "PostgreSQL settings for Determined (max_connections = 100)": [
                "/etc/postgresql/15/main/conf.d/50-determined.conf",
                "max_connections = 100",
            ],
            "Restart PostgreSQL for its new settings": ["postgresql@15-main.service"],
            "PostgreSQL enabled and running": ["systemctl enable postgresql.service"],
            "PostgreSQL cluster 15/main running": ["systemctl start postgresql@15-main.service"],
            "Node key for the keyed digest of the role's password": [
                "chmod 600 /var/lib/gpu-cluster/digest.key"
            ],
            "Database role determined (password from cluster.yaml)": [
                "install -m 600 /dev/null /tmp/",
                'CREATE ROLE \\"determined\\" WITH LOGIN PASSWORD \'SCRAM-SHA-256$4096:',
            ],
            "Database determined owned by determined": ['CREATE DATABASE "determined" OWNER "determined"'],
        },
    ),
    Case(
        minio,
        "lab-master",
        fresh,
        deployed,
        {
            "Refresh apt lists for download and health-check tools": ["shared/apt-update.sh"],
            "Install download and health-check tools": ["install", "ca-certificates"],
            "Install the MinIO server binary (sha256-pinned)": [
                "shared/fetch-verified.sh",
                "http://10.77.0.1:8077/minio/minio",
                "b0e1d4802f568f8fbfb223dbafe1598718cfe1af12463d142adfe87b16e250e1",
            ],
            "System group minio-user": ["groupadd -r minio-user"],
            "System user minio-user": ["useradd", "-s /usr/sbin/nologin", "-g minio-user", "-r"],
            "MinIO data directory /mnt/data": [
                "mkdir -p /mnt/data",
                "chmod 750",
                "chown minio-user:minio-user",
            ],
            # mode before content: the secret never sits in a world-readable file
            "MinIO settings and credentials /etc/default/minio": ["chmod 600 /etc/default/minio", "upload"],
            "MinIO systemd unit (official)": ["/etc/systemd/system/minio.service"],
            "MinIO unit drop-in directory": ["mkdir -p /etc/systemd/system/minio.service.d"],
            "MinIO starts only with /mnt/data mounted": ["RequiresMountsFor=/mnt/data"],
            "Restart MinIO for its new binary or settings": ["systemctl daemon-reload", "minio.service"],
            "MinIO enabled and running": ["systemctl enable minio.service"],
            "Wait until MinIO is ready": ["http://127.0.0.1:9000/minio/health/ready"],
            "Bucket det-checkpoints in region us-east-1 (from the controller)": ["run"],
            "MinIO user determined: bucket det-checkpoints except backups/ (from the controller)": ["run"],
            "MinIO user pg-backup: det-checkpoints/backups/postgresql/ only (from the controller)": ["run"],
        },
        controller=minio_controller,
    ),
    Case(
        ipoib,
        "lab-gpu1",
        ipoib_fresh(netplan=False),
        ipoib_deployed(netplan=False),
        {
            "Refresh apt lists for ifupdown": ["shared/apt-update.sh"],
            "Install ifupdown": ["install", "ifupdown"],
            "interfaces sources interfaces.d": [
                "source /etc/network/interfaces.d/*",
                "/etc/network/interfaces",
            ],
            "ib0 in ifupdown": ["address 10.78.0.11/24", "mtu 2044", "/etc/network/interfaces.d/"],
            "Bring ib0 up": ["ifup ib0"],
        },
    ),
    Case(
        ipoib,
        "lab-gpu2",
        ipoib_fresh(netplan=True),
        ipoib_deployed(netplan=True),
        {
            "ib0 in netplan": [
                "10.78.0.12/24",
                "mtu: 2044",
                "/etc/netplan/60-gpu-cluster-ib0.yaml",
                "chmod 600",
            ],
            "Apply netplan to ib0": ["netplan generate", "networkctl reconfigure ib0"],
        },
    ),
    Case(
        mofed,
        "lab-gpu1",
        fresh,
        deployed,
        {
            **HEADERS,
            "Download MLNX_OFED_LINUX-5.8-3.0.7.0-debian12-x86_64.tgz (sha256 checked)": [
                "shared/fetch-verified.sh",
                "http://10.77.0.1:8077/mofed/MLNX_OFED_LINUX-5.8-3.0.7.0-debian12-x86_64.tgz",
                "ec0b120a320b206076d8308b3198a31fa9055b91db3d9c19337163437523028a",
            ],
            "Refresh apt lists for MLNX_OFED prerequisites": ["shared/apt-update.sh"],
            "Install MLNX_OFED prerequisites": ["install", "python3", "pciutils"],
            "Install MLNX_OFED_LINUX-5.8-3.0.7.0 and restart openibd": [
                "fabric/install.sh",
                "/var/cache/mlnx-ofed/MLNX_OFED_LINUX-5.8-3.0.7.0-debian12-x86_64.tgz",
            ],
            f"Hold kernel {KERNEL} and the kernel meta packages": [
                "apt-mark-hold.sh",
                f"linux-image-{KERNEL}",
            ],
            "unattended-upgrades leaves the kernel alone": [
                "/etc/apt/apt.conf.d/51gpu-cluster-kernel",
                KERNEL,
            ],
        },
    ),
    Case(
        opensm,
        "lab-master",  # the lab's network.subnet_manager
        fresh,
        opensm_on,
        {
            "MLNX_OFED's opensm is installed": ["dpkg-query", "ii*) ;;", "exit 1"],
            "opensmd enabled and running (the fabric's subnet manager)": [
                "systemctl start opensmd.service",
                "systemctl enable opensmd.service",
            ],
        },
    ),
    Case(
        cuda,
        "lab-gpu1",
        fresh,
        deployed,
        {
            **CUDA_REPO,
            **pinned_packages("cuda-toolkit", "cuda-toolkit-11-7=11.7.1-1", "cuda-toolkit-11-7=11.7.1-1"),
            "/usr/local/cuda -> /usr/local/cuda-11.7": ["nvidia/cuda-link.sh", "/usr/local/cuda-11.7"],
            "CUDA paths for login shells": ["/etc/profile.d/", "CUDA 11.7.1"],
        },
    ),
    Case(
        nccl,
        "lab-gpu1",
        fresh,
        deployed,
        {
            **CUDA_REPO,
            **pinned_packages(
                "nccl", "libnccl2=2.14.3-1+cuda11.7 and 1 more", "libnccl2=2.14.3-1+cuda11.7", "libnccl-dev="
            ),
        },
    ),
    Case(
        nvidia_driver,
        "lab-gpu1",
        fresh,
        deployed,
        {
            "Refresh apt lists for headers of the running kernel 6.1.0-18-amd64": ["shared/apt-update.sh"],
            "Install headers of the running kernel 6.1.0-18-amd64": ["install", f"linux-headers-{KERNEL}"],
            "NVIDIA CUDA apt repository | Trust the CUDA repository (cuda-keyring_1.1-1_all.deb)": [
                "shared/fetch-verified.sh",
                "433030adae11733ec494586dcff6a1c6dccb15436aba4cb3ac56dec1a28bf150",
                "--reinstall",
            ],
            "NVIDIA CUDA apt repository | CUDA repository sources list": [
                "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                "http://10.77.0.1:8077/cuda/repos/debian12/x86_64/ /",
                "/etc/apt/sources.list.d/cuda-debian12-x86_64.list",
            ],
            "Blacklist nouveau": ["/etc/modprobe.d/blacklist-nouveau.conf", "chmod 644"],
            "Pinned packages | apt-get update if the cache lacks nvidia-driver": ["shared/apt-update.sh"],
            "Pinned packages | apt preferences for nvidia-driver": [
                "Package: cuda-drivers-515\\nPin: version 515.65.01-1",
                "/etc/apt/preferences.d/nvidia-driver.pref",
            ],
            "Pinned packages | Remember that the new driver needs a reboot": ["nvidia-dkms-515"],
            "Pinned packages | Install cuda-drivers-515=515.65.01-1 and 16 more": [
                "--no-install-recommends",
                "cuda-drivers-515=515.65.01-1",
                "nvidia-dkms-515=515.65.01-0ubuntu1",
            ],
            "Pinned packages | Hold nvidia-driver": ["shared/apt-mark-hold.sh", "nvidia-dkms-515"],
            "Rebuild the initramfs without nouveau": ["update-initramfs -u"],
            "Reboot into the new NVIDIA driver (confirmed by a new boot_id)": [
                "record_boot_id",
                "reboot",
                "wait_for_new_boot",
            ],
            "The new driver is loaded: nvidia-smi answers with the pin": [
                "nvidia/driver-loaded.sh",
                "515.65.01",
            ],
            "The units wanted at boot came up (one that failed is started once more)": [
                "nvidia/boot-units.sh",
                "openibd.service",
            ],
        },
    ),
    Case(
        hosts,
        "lab-gpu1",
        hosts_fresh,
        hosts_deployed_after,
        {
            "Hostname": ["hostnamectl set-hostname lab-gpu1"],
            "Drop the installer's 127.0.1.1 hostname line": [
                "sed -i",
                r"'/^127\.0\.1\.1\s.*$/d' /etc/hosts",
                "/etc/hosts",
            ],
            "Cluster hosts block": ["10.77.0.10\tlab-master", "10.78.0.12\tlab-gpu2-ib0", "/etc/hosts"],
        },
    ),
    Case(
        firewall,
        "lab-gpu1",
        firewall_fresh,
        firewall_deployed_after,
        {
            "Refresh apt lists for iptables (for the checks)": ["shared/apt-update.sh"],
            "Install iptables (for the checks)": ["install", "iptables"],
            "Disable ufw (also at boot)": ["ufw --force disable"],
            "Stop firewalld.service": [
                "systemctl stop firewalld.service",
                "systemctl disable firewalld.service",
            ],
            "Stop netfilter-persistent.service": ["systemctl stop netfilter-persistent.service"],
            "Flush firewall rules and chains": [
                "iptables -t filter -F",
                "iptables -P INPUT ACCEPT",
                "restart docker",
            ],
        },
    ),
]


def cold_plan(cluster, case: Case) -> list[Planned]:
    node = cluster.node(case.node)
    return plan(case.role.apply, case.fresh(cluster, node), cluster=cluster, node=node)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fresh_node_gets_the_cold_deploy(lab, case, monkeypatch):
    if case.controller:
        case.controller(monkeypatch, deployed=False)
    cold = cold_plan(lab, case)
    deploy_name = cold[0].name.split(" | ", 1)[0]
    changes = {p.name.removeprefix(f"{deploy_name} | "): p.text for p in cold if p.changes}
    expected = case.cold(lab) if callable(case.cold) else case.cold
    assert list(changes) == list(expected)
    for name, parts in expected.items():
        for part in parts:
            assert part in changes[name], (name, part)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_no_secret_on_a_command_line(lab_secrets, case, monkeypatch):
    """Commands are logged and show in `ps` on the node: secrets travel only in uploads."""
    lab, secrets = lab_secrets
    if case.controller:
        case.controller(monkeypatch, deployed=False)
    lines = [
        c.get_raw_value() for op in cold_plan(lab, case) for c in op.commands if isinstance(c, StringCommand)
    ]
    assert lines
    assert not [name for name, value in secrets.items() if any(value in line for line in lines)]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_as_deployed_node_gets_no_change(lab, case, monkeypatch):
    if case.controller:
        case.controller(monkeypatch, deployed=False)
    cold = cold_plan(lab, case)
    if case.controller:
        case.controller(monkeypatch, deployed=True)
    node = lab.node(case.node)
    again = plan(case.role.apply, case.deployed(lab, node, cold), cluster=lab, node=node)
    # Not always the same operations: some are added only where there is work (the driver's
    # "remember the reboot" before an install). Every one that is there is a no-op.
    assert again and changing(again) == []


# --- roles/node/preflight.py: no change when the node passes, one failing step when it does not ------


def preflight_facts(cluster, node) -> dict:
    return {
        **fresh(cluster, node),
        SecureBootState: ("disabled", "SecureBoot disabled"),
        DiskFreeGB: 120.0,
        IsMountPoint: True,  # storage.data_dir is the data disk
        Port: None,  # nothing listens on the master's port yet
    }


@pytest.mark.parametrize(
    "over, problem",
    [
        ({}, None),
        ({DiskFreeGB: 1.5}, "/ has 1.5 GB free, needs 2.0 GB"),
        ({IsMountPoint: False}, "storage.data_dir /mnt/data is not a mount point"),
        ({SecureBootState: ("enabled", "SecureBoot enabled")}, "Secure Boot is on (SecureBoot enabled)"),
        (
            {KernelVersion: "5.10.0-28-amd64"},
            "kernel 5.10.0-28-amd64 is not allowed on Debian 12 (allowed: 6.*)",
        ),
    ],
)
def test_preflight_passes_a_fit_node_and_stops_an_unfit_one(lab, over, problem):
    node = lab.node("lab-master")
    [check] = plan(preflight.apply, {**preflight_facts(lab, node), **over}, cluster=lab, node=node)
    if problem is None:
        assert not check.changes and check.noops == ["preflight passed"]
    else:
        assert check.changes and "exit 1" in check.text
        assert f"preflight failed on lab-master: {problem}" in check.text


# --- drift: the as-deployed test has teeth ------------------------------------------------------


def drifted_nccl(cluster, node, cold) -> Facts:
    facts = deployed(cluster, node, cold)
    facts.table[DebPackages] = {**facts.table[DebPackages], "libnccl2": ["2.18.1-1+cuda12.1"]}
    return facts


def drifted_hosts(cluster, node, cold) -> dict:
    facts = hosts_deployed_after(cluster, node, cold)
    return {**facts, Block: hosts.hosts_block(cluster).splitlines()[1:]}  # a node's line lost


def drifted_minio_env(cluster, node, cold) -> Facts:
    facts = deployed(cluster, node, cold)
    facts.files["/etc/default/minio"] = b"MINIO_ROOT_USER=someone-else\n"
    return facts


@pytest.mark.parametrize(
    "role, node, fresh_facts, drifted, repaired",
    [
        (
            nccl,
            "lab-gpu1",
            fresh,
            drifted_nccl,
            ["NCCL | Pinned packages | Install libnccl2=2.14.3-1+cuda11.7 and 1 more"],
        ),
        (hosts, "lab-gpu1", hosts_fresh, drifted_hosts, ["Hosts | Cluster hosts block"]),
        (
            minio,
            "lab-master",
            fresh,
            drifted_minio_env,
            [
                "MinIO object storage | MinIO settings and credentials /etc/default/minio",
                "MinIO object storage | Restart MinIO for its new binary or settings",
                "MinIO object storage | Wait until MinIO is ready",
            ],
        ),
    ],
)
def test_a_drifted_node_gets_only_the_repair(lab, monkeypatch, role, node, fresh_facts, drifted, repaired):
    minio_controller(monkeypatch, deployed=True)  # minio: MinIO itself as cluster.yaml says
    n = lab.node(node)
    cold = plan(role.apply, fresh_facts(lab, n), cluster=lab, node=n)
    assert changing(plan(role.apply, drifted(lab, n, cold), cluster=lab, node=n)) == repaired


# --- roles/fabric/opensm.py off the subnet manager's node, and without its package -----------------


def test_opensm_stays_off_elsewhere_and_is_stopped_where_left_on(lab):
    node = lab.node("lab-gpu1")
    assert changing(plan(opensm.apply, fresh(lab, node), cluster=lab, node=node)) == []
    assert changing(plan(opensm.apply, opensm_installed(lab, node), cluster=lab, node=node)) == []
    left_on = [p for p in plan(opensm.apply, opensm_on(lab, node), cluster=lab, node=node) if p.changes]
    [op] = left_on
    assert "lab-master runs the subnet manager" in op.name
    assert "systemctl stop opensmd.service" in op.text and "systemctl disable opensmd.service" in op.text


def test_opensm_without_mlnx_ofeds_package_stops_the_host_when_the_step_runs(lab, tmp_path):
    """The check runs on the node, after MLNX_OFED's installer: a real shell with a dpkg-query
    that knows no opensm stops the host with the message; one that has it goes on."""
    node = lab.node("lab-master")
    [check, _start] = [p for p in plan(opensm.apply, fresh(lab, node), cluster=lab, node=node) if p.changes]
    assert "opensm package is not installed" in check.text
    fake = tmp_path / "dpkg-query"
    for status, rc in (("", 1), ("un ", 1), ("ii ", 0)):
        fake.write_text(f"#!/bin/sh\nprintf '{status}'\n")
        fake.chmod(0o755)
        env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
        proc = subprocess.run(["sh", "-c", check.text], env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == rc, (status, proc)
        assert ("opensm package is not installed" in proc.stderr) == (rc == 1)


def test_opensm_unset_changes_nothing(lab):
    unset = dataclasses.replace(lab, network=dataclasses.replace(lab.network, subnet_manager=None))
    node = unset.node("lab-master")
    assert changing(plan(opensm.apply, opensm_on(unset, node), cluster=unset, node=node)) == []


# --- the training guard (deploy/training.py): no Docker restart, no reboot under running trials ----

BUSY = Busy(node="lab-gpu1", holders=("Trial 7 (Experiment 5)",))


def test_docker_refuses_a_new_daemon_json_while_trials_run(lab):
    node = lab.node("lab-gpu1")
    cold = cold_plan(lab, next(c for c in CASES if c.role is docker))
    more = dataclasses.replace(lab.determined, memlock_bytes=16777216)
    changed = dataclasses.replace(lab, determined=more)
    steps = plan(docker.apply, docker_deployed(lab, node, cold), cluster=changed, node=node, busy=BUSY)
    # The stop comes before anything is written: pyinfra ends the host there, so daemon.json
    # and Docker stay as they are (the plan shows what would follow, as the harness completes
    # every operation).
    stop, *after = [p for p in steps if p.changes]
    assert [p.name.split(" | ", 1)[1] for p in after] == [
        "Docker's default ulimits: memlock 16777216 bytes",
        "Restart Docker for its new daemon.json",
    ]
    assert stop.name.endswith("Docker's daemon.json unchanged while trials run here")
    assert "restarting Docker for a new daemon.json would end what the master runs here" in stop.text
    assert "Trial 7 (Experiment 5)" in stop.text and "--data disruptive=yes" in stop.text
    assert stop.text.endswith("exit 1")
    # The same settings: no stop, no change, however busy the node.
    same = plan(docker.apply, docker_deployed(lab, node, cold), cluster=lab, node=node, busy=BUSY)
    assert changing(same) == []
    # Accepted: the change and the restart, as on an idle node.
    accepted = dataclasses.replace(BUSY, accepted=True)
    steps = plan(docker.apply, docker_deployed(lab, node, cold), cluster=changed, node=node, busy=accepted)
    names = [n.split(" | ", 1)[1] for n in changing(steps)]
    assert names == [
        "Docker's default ulimits: memlock 16777216 bytes",
        "Restart Docker for its new daemon.json",
    ]


def test_no_reboot_into_a_new_driver_while_trials_run(lab):
    node = lab.node("lab-gpu1")
    steps = plan(nvidia_driver.apply, fresh(lab, node), cluster=lab, node=node, busy=BUSY)
    names = [p.name.split(" | ", 1)[1] for p in steps if p.changes]
    stop = names.index("No reboot while trials run here")
    assert names[stop + 1].startswith("Reboot into the new NVIDIA driver")  # pyinfra stops there
    [guard] = [p for p in steps if p.name.endswith("No reboot while trials run here")]
    assert "rebooting into the new NVIDIA driver would end what the master runs here" in guard.text
    # As deployed (nothing installed, no reboot owed): the guard has nothing to stop.
    cold = plan(nvidia_driver.apply, fresh(lab, node), cluster=lab, node=node)
    assert (
        changing(plan(nvidia_driver.apply, deployed(lab, node, cold), cluster=lab, node=node, busy=BUSY))
        == []
    )


def test_the_agent_is_not_restarted_while_trials_run(lab):
    """A per_node agent whose agent.yaml would change (here determined.slot_type) stops the host
    before the file is written; the same settings pass with nothing to do."""
    node = lab.node("lab-gpu3")
    case = next(c for c in CASES if c.role is determined_agent and c.node == "lab-gpu3")
    cold = cold_plan(lab, case)
    busy = dataclasses.replace(BUSY, node="lab-gpu3")
    changed = dataclasses.replace(lab, determined=dataclasses.replace(lab.determined, slot_type="cpu"))
    steps = plan(determined_agent.apply, deployed(lab, node, cold), cluster=changed, node=node, busy=busy)
    stop, *after = [p for p in steps if p.changes]
    assert stop.name.endswith("The agent is not restarted while trials run here")
    assert (
        "lab-gpu3: restarting the agent for a changed /etc/determined/agent.yaml would end what the "
        "master runs here: Trial 7 (Experiment 5)"
    ) in stop.text
    assert [p.name.split(" | ", 1)[1] for p in after] == [
        "Agent configuration /etc/determined/agent.yaml",
        "Restart the agent for its new configuration",
    ]
    same = plan(determined_agent.apply, deployed(lab, node, cold), cluster=lab, node=node, busy=busy)
    assert changing(same) == []
    accepted = dataclasses.replace(busy, accepted=True)
    steps = plan(determined_agent.apply, deployed(lab, node, cold), cluster=changed, node=node, busy=accepted)
    assert [n.split(" | ", 1)[1] for n in changing(steps)] == [
        "Agent configuration /etc/determined/agent.yaml",
        "Restart the agent for its new configuration",
    ]
