"""The model of cluster.yaml: frozen dataclasses, one field per key.

Each field declares its key once: `name: Annotated[type, spec]`, where the spec (see
deploy/cluster/keys.py) holds the check, the default and the one-line description that the
docs' key table shows. A type is `| None` only where the key may stay unset after loading.
A `Cluster` exists only once every check passed: no other field is ever None.
"""

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from deploy.cluster import checks, credentials, hardware, images, master_tls, storage_keys, storage_tls
from deploy.cluster.hardware import Hardware
from deploy.cluster.keys import (
    ArtifactKey,
    Computed,
    Key,
    ListKey,
    Required,
    SecretKey,
    Section,
    default,
    defaults,
)
from deploy.secrets import Secret

ROLES = ("master", "storage", "agent")
AGENT_LAYOUTS = ("per_node", "per_domain")
SLOT_TYPES = ("auto", "cuda", "gpu", "rocm", "cpu", "none")
REBOOT_POLICIES = ("auto", "never")
ARTIFACT_KINDS = ("master", "agent")
SECURE_BOOT = ("refuse", "signed_modules")
IPOIB_MODES = ("datagram", "connected")


def _pinned(value: str, doc: str, pattern: str = r"\d+\.\d+\.\d+", rule: str = "`N.N.N`") -> Key:
    """A version key whose default is also the example in its problems."""
    return Key(checks.version(value, pattern, rule), value, doc)


@dataclass(frozen=True)
class Ssh:
    user: Annotated[
        str,
        Key(
            checks.matching(r"[a-z_][a-z0-9_.-]*", "a user name", rule="user name"),
            "root",
            "the user pyinfra logs in as",
        ),
    ]
    port: Annotated[int, Key(checks.port, 22, "the nodes' SSH port")]
    key_file: Annotated[str | None, Key(checks.text, None, "private key on the machine that runs pyinfra")]
    strict_host_key_checking: Annotated[
        bool,
        Key(
            checks.boolean,
            True,
            "`true` rejects unknown host keys: put the nodes' keys into known_hosts first "
            "(`ssh-keyscan`, then compare fingerprints on the consoles)",
        ),
    ]
    known_hosts_file: Annotated[
        str | None, Key(checks.text, None, "the known_hosts file to check host keys against")
    ]


# Linux caps interface names at 15 bytes (IFNAMSIZ 16); the characters are those a shell
# word and a YAML key carry unquoted.
INTERFACE_NAME = checks.matching(
    r"[A-Za-z0-9_.-]{1,15}",
    "a network interface name (1-15 characters)",
    rule="interface name, 1-15 characters",
)


@dataclass(frozen=True)
class IpoibNetwork:
    interface: Annotated[
        str,
        Key(
            INTERFACE_NAME,
            "ib0",
            "the IPoIB interface; a node's `ipoib_interface` overrides it",
        ),
    ]
    subnet: Annotated[
        ipaddress.IPv4Network,
        Key(
            checks.cidr,
            Required("the IPoIB subnet, like '10.10.0.0/24'"),
            "the IPoIB network; must not overlap `network.management`",
        ),
    ]
    mtu: Annotated[
        int,
        Key(
            checks.integer(576, 65520),
            2044,
            "2044 suits datagram mode on a 2K fabric; `datagram` allows up to 4092, `connected` 65520",
        ),
    ]
    # The kernel's two IPoIB transports (Documentation/infiniband/ipoib.rst).
    mode: Annotated[
        str,
        Key(
            checks.choice(IPOIB_MODES),
            "datagram",
            "the IPoIB mode set on InfiniBand links; ConnectX-4 and later (enhanced IPoIB) "
            "support `datagram` only",
        ),
    ]


@dataclass(frozen=True)
class Network:
    management: Annotated[
        ipaddress.IPv4Network,
        Key(
            checks.cidr,
            Required("the management subnet, like '10.0.0.0/24'"),
            "the network pyinfra reaches the nodes on",
        ),
    ]
    ipoib: Annotated[IpoibNetwork, Section(required="at least its subnet")]
    # NCCL_IB_HCA's syntax (NCCL's environment-variable docs): `^` excludes, `=` exact names,
    # else prefixes; each HCA with an optional `:port`.
    nccl_ib_hca: Annotated[
        str | None,
        Key(
            checks.matching(
                r"\^?=?[A-Za-z0-9_]+(:[0-9]+)?(,[A-Za-z0-9_]+(:[0-9]+)?)*", "like mlx5_0:1,mlx5_1:1"
            ),
            None,
            "NCCL_IB_HCA for every trial (the fabric's HCAs, not a storage one); unset: NCCL uses every HCA",
        ),
    ]
    # One InfiniBand subnet needs one master SM (MLNX_OFED user manual, "OpenSM"); unset: the
    # switch or UFM runs it. Every node is on the fabric (each has an ipoib_address).
    subnet_manager: Annotated[
        str | None,
        Key(
            checks.hostname,
            None,
            "hostname of a declared node that runs MLNX_OFED's opensm (opensmd); unset: the "
            "fabric's subnet manager runs elsewhere (a managed switch, UFM)",
        ),
    ]


@dataclass(frozen=True)
class Preflight:
    # ("Ubuntu 20.04", ("5.4.0-*-generic",)) pairs: a tuple keeps the model immutable.
    # The kernel series of each release's GA kernel, the one MLNX_OFED 5.8 and driver 515
    # support there (docs/operations.md "Kernels"); the build is the operator's update.
    allowed_os: Annotated[
        tuple[tuple[str, tuple[str, ...]], ...],
        Key(
            checks.allowed_os,
            (("Ubuntu 20.04", ("5.4.0-*-generic",)), ("Ubuntu 22.04", ("5.15.0-*-generic",))),
            "the OS releases and kernel series preflight accepts on a node",
        ),
    ]
    certified_kernels: Annotated[
        tuple[str, ...],
        Key(
            checks.kernel_patterns,
            ("5.4.0-100-generic", "5.15.0-100-generic"),
            "the kernel builds the cluster was certified on: another allowed build only warns; "
            "`[]` turns the warning off",
        ),
    ]
    secure_boot: Annotated[
        str,
        Key(
            checks.choice(SECURE_BOOT),
            "refuse",
            "`refuse` a node booted with Secure Boot on, or `signed_modules`: you enrolled a "
            "Machine Owner Key that signs the DKMS modules (docs/operations.md)",
        ),
    ]
    min_free_disk_gb: Annotated[
        float, Key(checks.number_at_least(0), 50.0, "free space preflight demands on `disk_path`, in GB")
    ]
    disk_path: Annotated[str, Key(checks.abs_path, "/", "where preflight measures free space")]


@dataclass(frozen=True)
class Versions:
    nvidia_driver: Annotated[str, _pinned("515.65.01", "the NVIDIA driver")]
    cuda: Annotated[str, _pinned("11.7.1", "the CUDA toolkit")]
    nccl: Annotated[str, _pinned("2.14.3", "NCCL")]
    mofed: Annotated[str, _pinned("5.8-3.0.7.0", "MLNX_OFED", r"\d+\.\d+-[\d.]+", "`N.N-N.N…`")]


@dataclass(frozen=True)
class Artifact:
    """`{url, sha256}` of one download; its keys are checked per file (see Sources, rules.py)."""

    url: str  # may hold {version} / {distro} placeholders
    # One pin, or (for a url with {distro}: one file per distro) one per distro; `sha256` is
    # then "" and `pin_for` is what a role reads.
    sha256: str
    per_distro: tuple[tuple[str, str], ...] = ()

    def pin_for(self, distro: str) -> str | None:
        """The sha256 of the file for `distro` (the url's {distro}); None: not pinned for it."""
        if not self.per_distro:
            return self.sha256
        return dict(self.per_distro).get(distro)


def mofed_distro(os_id: str, os_version: str) -> str:
    """MLNX_OFED's name for a distro in its tarballs' names: ubuntu20.04, ubuntu22.04, debian12."""
    return os_id.lower() + os_version


@dataclass(frozen=True)
class Sources:
    apt_proxy: Annotated[str | None, Key(checks.url(("http",)), None, "an apt proxy for the nodes")]
    apt_proxy_credentials: Annotated[Secret | None, credentials.APT_PROXY]
    cuda_repo: Annotated[
        str,
        Key(
            checks.url(("http", "https"), placeholders=("distro",), trailing_slash=True),
            "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/",
            "NVIDIA's CUDA apt repository; `{distro}` becomes NVIDIA's name for the node's OS "
            "(`ubuntu2004`, `ubuntu2204`, `debian12`)",
        ),
    ]
    mirror_credentials: Annotated[Secret | None, credentials.MIRROR]
    # NVIDIA's keyring .deb, the trust anchor of every package from cuda_repo: fetched from the
    # repo folder like any artifact, so pinned like one (it differs per folder).
    cuda_keyring: Annotated[
        tuple[tuple[str, str], ...] | None,
        Key(
            checks.keyring_pins,
            None,
            "sha256 of `cuda-keyring_1.1-1_all.deb` in each `cuda_repo` folder the nodes use, "
            "checked before it is installed and on every deploy; a node whose folder has no pin "
            "stops before the CUDA repository is trusted",
        ),
    ]
    mofed_tarball: Annotated[
        Artifact,
        ArtifactKey(
            "MLNX_OFED tarball",
            ("version", "distro"),
            "the MLNX_OFED tarball; `{distro}` becomes `ubuntu20.04`, `ubuntu22.04`, `debian12`; "
            "each distro's tarball is another file: `sha256` is one pin, or one per distro "
            "(`{ubuntu20.04: ..., ubuntu22.04: ...}`) for a cluster that mixes them",
        ),
    ]
    minio: Annotated[Artifact, ArtifactKey("MinIO server binary", (), "the MinIO server binary")]
    determined_master: Annotated[
        Artifact, ArtifactKey("determined-master package", ("version",), "the determined-master .deb")
    ]
    determined_agent: Annotated[
        Artifact, ArtifactKey("determined-agent package", ("version",), "the determined-agent .deb")
    ]
    # images.site_ref: the references pulled from it; no credentials (docs/cluster-yaml.md).
    registry: Annotated[
        str | None,
        Key(images.registry_host, None, "a site registry mirroring the task images: same path, tag, digest"),
    ]
    registry_ca: Annotated[
        str | None,
        Key(images.registry_ca_file, None, "`registry`'s CA, to /etc/docker/certs.d/<registry>/ca.crt"),
    ]

    def cuda_repo_for(self, os_id: str, os_version: str) -> str:
        """NVIDIA names its repos ubuntu2004, ubuntu2204, debian12."""
        return self.cuda_repo.format(distro=os_id.lower() + os_version.replace(".", ""))

    def cuda_keyring_sha256(self, os_id: str, os_version: str) -> str | None:
        """The pin of the keyring .deb in the node's repo folder, None if cluster.yaml has none."""
        return dict(self.cuda_keyring or ()).get(os_id.lower() + os_version.replace(".", ""))

    def mofed_url_for(self, os_id: str, os_version: str, mofed_version: str) -> str:
        """MLNX_OFED tarballs are named per distro as ubuntu20.04, ubuntu22.04, debian12."""
        return self.mofed_tarball.url.format(version=mofed_version, distro=mofed_distro(os_id, os_version))

    def mofed_sha256_for(self, os_id: str, os_version: str) -> str | None:
        """The pin of the node's distro's tarball (each distro's is another file)."""
        return self.mofed_tarball.pin_for(mofed_distro(os_id, os_version))

    def determined_url(self, kind: str, version: str) -> str:
        if kind not in ARTIFACT_KINDS:
            raise ValueError(f"kind must be one of {ARTIFACT_KINDS}, not {kind!r}")
        artifact = self.determined_master if kind == "master" else self.determined_agent
        return artifact.url.format(version=version)


@dataclass(frozen=True)
class Storage:
    host: Annotated[
        str,
        Key(
            checks.hostname,
            Computed("`master_host`"),
            "hostname of a declared node; that node gets the `storage` role and runs MinIO",
        ),
    ]
    bucket: Annotated[
        str,
        Key(
            checks.bucket,
            Required("the S3 bucket for checkpoints"),
            "the bucket for Determined's checkpoints",
        ),
    ]
    region: Annotated[
        str,
        Key(
            checks.matching(
                r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", "a region name like 'us-east-1'", rule="region name"
            ),
            "us-east-1",
            "MinIO's site region and every S3 client's signing region (see below)",
        ),
    ]
    port: Annotated[int, Key(checks.port, 9000, "MinIO's S3 API port")]
    console_port: Annotated[int, Key(checks.port, 9001, "MinIO's console port; not `storage.port`")]
    console: Annotated[str, storage_keys.CONSOLE]
    data_dir: Annotated[str, Key(checks.abs_path, "/mnt/data", "where MinIO keeps the objects; not `/`")]
    data_on_root_disk: Annotated[
        bool,
        Key(
            checks.boolean,
            False,
            "`true` lets MinIO keep its objects on the root disk; `false`: `data_dir` must be a "
            "mount point (preflight refuses the storage node otherwise, and MinIO's unit will not "
            "start without that mount)",
        ),
    ]
    endpoint_url: Annotated[str, storage_keys.ENDPOINT_URL]
    prefix: Annotated[str | None, Key(checks.key_prefix, None, "object key prefix for checkpoints")]
    access_key: Annotated[
        Secret,
        SecretKey("MinIO's root user (S3 access key)", "MinIO's root user (S3 access key); ≥ 3 characters"),
    ]
    secret_key: Annotated[
        Secret,
        SecretKey(
            "MinIO's root password (S3 secret key)", "MinIO's root password (S3 secret key); ≥ 8 characters"
        ),
    ]
    determined_user: Annotated[str, storage_keys.DETERMINED_USER]
    backup_user: Annotated[str, storage_keys.BACKUP_USER]
    determined_secret_key: Annotated[Secret | None, storage_keys.DETERMINED_SECRET_KEY]
    backup_secret_key: Annotated[Secret | None, storage_keys.BACKUP_SECRET_KEY]
    tls: Annotated[storage_tls.StorageTls, storage_tls.SECTION]
    # Not keys: the secret keys of determined_user and backup_user, each the one given above or
    # derived from secret_key (storage_keys.user_secrets), once, here; every consumer reads these.
    determined_secret: Secret = field(init=False, repr=False, compare=False)
    backup_secret: Secret = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, secret in storage_keys.user_secrets(self).items():
            object.__setattr__(self, name, secret)  # frozen: set once, as __init__ sets a field


_IDENTIFIER = checks.matching(
    r"[A-Za-z_][A-Za-z0-9_]{0,62}",
    "a PostgreSQL identifier (letters, digits, '_')",
    rule="PostgreSQL identifier",
)


@dataclass(frozen=True)
class Database:
    name: Annotated[str, Key(_IDENTIFIER, "determined", "Determined's PostgreSQL database")]
    user: Annotated[str, Key(_IDENTIFIER, "determined", "Determined's PostgreSQL user")]
    port: Annotated[int, Key(checks.port, 5432, "PostgreSQL's port on the master host")]
    backup_keep: Annotated[
        int,
        Key(
            checks.integer(1, 3650),
            14,
            "how many nightly (and pre-upgrade) `pg_dump` backups stay in the bucket under "
            "`backups/postgresql/`; older ones are deleted after each backup",
        ),
    ]
    password: Annotated[
        Secret,
        SecretKey(
            "the PostgreSQL password of the Determined user",
            "the PostgreSQL password of that user; only letters, digits and "
            "`-._~!$&'()*+,;=:@` (it goes unescaped into Determined's database URL)",
        ),
    ]


@dataclass(frozen=True)
class TaskImage:
    # Determined 0.38's own default (determinedai/pytorch-ngc:0.38.0) is CUDA 12.4: driver 515
    # cannot run it. The defaults are Determined's CUDA 11.3 images, by tag (deploy/cluster/images.py).
    gpu: Annotated[
        str,
        Key(
            images.image_ref,
            images.DEFAULT_GPU_IMAGE,
            "the image of GPU trials (task_container_defaults.image.cuda); the default has no "
            "public digest: pin it, see below",
        ),
    ]
    cpu: Annotated[
        str,
        Key(
            images.image_ref,
            images.DEFAULT_CPU_IMAGE,
            "the image of CPU-only tasks (task_container_defaults.image.cpu); pin it likewise",
        ),
    ]


@dataclass(frozen=True)
class Determined:
    version: Annotated[str, _pinned("0.38.0", "the Determined release")]
    admin_password: Annotated[
        Secret,
        SecretKey(
            "the password of Determined's admin user",
            "the password of Determined's admin user: the master's initial one, and set through its "
            "API by a later deploy when it changed (run that deploy with DET_USER/DET_PASS naming a "
            "login that works); Determined's policy: 8+ characters with an upper-case letter, a "
            "lower-case letter and a digit",
        ),
    ]
    agent_layout: Annotated[
        str,
        Key(
            checks.choice(AGENT_LAYOUTS),
            "per_node",
            "one agent per node, or `per_domain`: one agent per NVLink domain",
        ),
    ]
    resource_pool: Annotated[
        str,
        Key(
            checks.matching(r"[A-Za-z0-9][A-Za-z0-9_.-]*", "a resource pool name", rule="resource pool name"),
            "default",
            "the agents' resource pool",
        ),
    ]
    slot_type: Annotated[str, Key(checks.choice(SLOT_TYPES), "cuda", "what a slot of an agent is")]
    task_image: Annotated[TaskImage, Section()]
    # Determined's own default (DefaultTaskContainerDefaults); Docker's is 64 MiB.
    shm_size_bytes: Annotated[
        int,
        Key(
            checks.integer(67108864),
            4294967296,
            "/dev/shm of each trial container (task_container_defaults.shm_size_bytes)",
        ),
    ]
    # Docker's daemon.json default-ulimits (roles/determined/docker.py): RDMA locks its buffers.
    memlock_bytes: Annotated[
        int, Key(images.memlock, -1, "`ulimit -l` of every container on the agents, bytes; -1: unlimited")
    ]
    tls: Annotated[master_tls.DeterminedTls, master_tls.SECTION]


@dataclass(frozen=True)
class Node:
    hostname: Annotated[
        str, Key(checks.hostname, Required("the node's hostname"), "unique (case-insensitive)")
    ]
    address: Annotated[
        ipaddress.IPv4Address,
        Key(
            checks.ipv4,
            Required("the node's management address"),
            "in `network.management`, not its network or broadcast address; unique",
        ),
    ]
    ipoib_address: Annotated[
        ipaddress.IPv4Address,
        Key(
            checks.ipv4,
            Required("the node's IPoIB address"),
            "in `network.ipoib.subnet` (so never in the management network); unique, "
            "also against management addresses",
        ),
    ]
    ipoib_interface: Annotated[
        str,
        Key(
            INTERFACE_NAME,
            Computed("`network.ipoib.interface`"),
            "this node's IPoIB interface, where its name differs (like `ibp65s0`)",
        ),
    ]
    # The effective roles, in ROLES order: the declared ones plus master / storage for the
    # nodes named by master_host / storage.host.
    roles: Annotated[
        tuple[str, ...],
        Key(checks.role_list(ROLES), (), "the node's roles; see below for master and storage"),
    ]
    slots: Annotated[int | None, Key(checks.integer(1), 8, "the agent's GPU slots", agents_only=True)]
    agent_layout: Annotated[
        str | None,
        Key(
            checks.choice(AGENT_LAYOUTS),
            Computed("`determined.agent_layout`"),
            "overrides the cluster's layout for this node",
            agents_only=True,
        ),
    ]
    hardware: Annotated[
        Hardware | None,
        Key(
            hardware.node_keys,
            Computed("the cluster's `hardware`"),
            "this node's own `hardware.*` keys; a `preset` here fills what the node does not write",
            agents_only=True,
        ),
    ]

    @property
    def ipoib_name(self) -> str:
        """The node's name on the IPoIB network, in every node's /etc/hosts (roles/node/hosts.py)."""
        return f"{self.hostname}-{self.ipoib_interface}"

    def to_json(self) -> dict:
        return {
            "hostname": self.hostname,
            "address": str(self.address),
            "ipoib_address": str(self.ipoib_address),
            "ipoib_interface": self.ipoib_interface,
            "roles": list(self.roles),
            "slots": self.slots,
            "agent_layout": self.agent_layout,
        }


@dataclass(frozen=True)
class Cluster:
    path: Path  # the file it was loaded from; not a key
    master_host: Annotated[
        str,
        Key(
            checks.hostname,
            Required("the hostname of the master node"),
            "hostname of a declared node; that node gets the `master` role",
        ),
    ]
    master_port: Annotated[
        int, Key(checks.port, 23457, "the Determined master's port (the article moved off 8080)")
    ]
    ssh: Annotated[Ssh, Section()]
    network: Annotated[Network, Section(required="the management and IPoIB subnets")]
    preflight: Annotated[Preflight, Section()]
    nodes: Annotated[
        tuple[Node, ...],
        ListKey("non-empty list", "the list of nodes", "every machine of the cluster, see below"),
    ]
    versions: Annotated[Versions, Section()]
    sources: Annotated[
        Sources,
        Section(required="where the MLNX_OFED, MinIO and Determined files come from, each pinned by sha256"),
    ]
    storage: Annotated[
        Storage,
        Section(required="bucket, access_key and secret_key of the checkpoint store", holds_secrets=True),
    ]
    database: Annotated[Database, Section(required="at least password", holds_secrets=True)]
    determined: Annotated[Determined, Section(required="at least admin_password", holds_secrets=True)]
    hardware: Annotated[Hardware, Section(doc="the agents' expected hardware; see below")]
    reboot: Annotated[
        str,
        Key(
            checks.choice(REBOOT_POLICIES),
            "auto",
            "`auto` reboots a node when a driver change needs it; an unquoted `no` is a YAML "
            "boolean and is refused",
        ),
    ]
    # Not keys: values derived from the keys above, once, when rules.py builds the model (and on
    # dataclasses.replace); the roles, verify and `experiment` read them, none computes them.
    trial_endpoint: str = field(init=False, compare=False)  # storage.endpoint_url as trials reach it
    task_refs: images.TaskRefs = field(init=False, compare=False)  # the task images as pulled

    def __post_init__(self) -> None:
        endpoint = storage_tls.trial_endpoint(self.storage, self.storage_node)
        object.__setattr__(self, "trial_endpoint", endpoint)  # frozen: set once, as __init__ would
        object.__setattr__(self, "task_refs", images.task_refs(self))

    def node(self, hostname: str) -> Node:
        for n in self.nodes:
            if n.hostname == hostname:
                return n
        raise KeyError(f"{hostname!r} is not a node of {self.path}")

    def nodes_with(self, role: str) -> tuple[Node, ...]:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        return tuple(n for n in self.nodes if role in n.roles)

    @property
    def master_node(self) -> Node:
        return self.node(self.master_host)

    @property
    def storage_node(self) -> Node:
        return self.node(self.storage.host)

    @property
    def agents(self) -> tuple[Node, ...]:
        return self.nodes_with("agent")

    @property
    def fabric_interfaces(self) -> tuple[str, ...]:  # NCCL_/GLOO_SOCKET_IFNAME take comma lists
        return tuple(sorted({a.ipoib_interface for a in self.agents})) or (self.network.ipoib.interface,)

    @property
    def dtrain_interface(self) -> str | None:  # one name: only when every agent's port has it
        return self.fabric_interfaces[0] if len(self.fabric_interfaces) == 1 else None

    def to_json(self) -> dict:  # pyinfra's JSON output (debug-inventory, --json): keep it short
        return {
            "file": str(self.path),
            "master_host": self.master_host,
            "nodes": [n.hostname for n in self.nodes],
        }


# The pins tests/lab builds its package mirror for (from the table above).
DEFAULT_VERSIONS: dict[str, str] = defaults(Versions)
DEFAULT_DETERMINED_VERSION: str = default(Determined, "version")
