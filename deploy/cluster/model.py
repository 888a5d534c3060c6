"""The model of cluster.yaml: frozen dataclasses, one field per key, each section in its own
module (deploy/cluster/<section>.py or <section>_keys.py: ssh, network, preflight_keys,
versions, sources, storage_keys, database, determined, nodes, hardware), composed here into `Cluster`.

Each field declares its key once: `name: Annotated[type, spec]`, where the spec (see
deploy/cluster/keys.py) holds the check, the default and the one-line description that the
docs' key table shows. A type is `| None` only where the key may stay unset after loading.
A `Cluster` exists only once every check passed: no other field is ever None.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from deploy.cluster import checks, images, storage_tls
from deploy.cluster.database import Database
from deploy.cluster.determined import AGENT_LAYOUTS, SLOT_TYPES, Determined, TaskImage
from deploy.cluster.hardware import Hardware
from deploy.cluster.keys import Key, ListKey, Required, Section, default, defaults
from deploy.cluster.network import INTERFACE_NAME, IPOIB_MODES, IpoibNetwork, Network
from deploy.cluster.nodes import ROLES, Node
from deploy.cluster.preflight_keys import SECURE_BOOT, Preflight
from deploy.cluster.sources import ARTIFACT_KINDS, Artifact, Sources, mofed_distro
from deploy.cluster.ssh import Ssh
from deploy.cluster.storage_keys import Storage
from deploy.cluster.versions import Versions

# The sections' names, re-exported: callers import them from here or from deploy.cluster.
__all__ = [
    "AGENT_LAYOUTS",
    "ARTIFACT_KINDS",
    "DEFAULT_DETERMINED_VERSION",
    "DEFAULT_VERSIONS",
    "INTERFACE_NAME",
    "IPOIB_MODES",
    "REBOOT_POLICIES",
    "ROLES",
    "SECURE_BOOT",
    "SLOT_TYPES",
    "Artifact",
    "Cluster",
    "Database",
    "Determined",
    "Hardware",
    "IpoibNetwork",
    "Network",
    "Node",
    "Preflight",
    "Sources",
    "Ssh",
    "Storage",
    "TaskImage",
    "Versions",
    "mofed_distro",
]

REBOOT_POLICIES = ("auto", "never")


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
    insecure_http: Annotated[
        bool,
        Key(
            checks.boolean,
            False,
            "`true` lets the master and MinIO answer plain HTTP: without `determined.tls` and "
            "`storage.tls` the admin password, session tokens and checkpoints cross the network "
            "in clear; `false`: both are required",
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
