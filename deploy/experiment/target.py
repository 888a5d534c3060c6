"""What this cluster offers an experiment, read from cluster.yaml alone (no node contacted).

The values are the deploy's own, read from the model: the checkpoint endpoint and bucket
master.yaml gives trials (Cluster.trial_endpoint), the task images the agents pulled
(Cluster.task_refs).
NVLink domains are not in cluster.yaml (the deploy reads them from each node's
`nvidia-smi topo -m`); `python -m deploy verify` prints the largest slots_per_trial that stays
inside one domain, and `--nvlink-slots N` hands that number in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deploy.cluster import Cluster, ClusterError, load_cluster


@dataclass(frozen=True)
class Target:
    path: str  # cluster.yaml as given
    bucket: str
    endpoint_url: str  # as trial containers reach MinIO
    prefix: str | None
    region: str
    image_gpu: str
    image_cpu: str
    driver: str  # the pinned NVIDIA driver version
    agent_slots: int  # the most slots one Determined agent offers
    nvlink_slots: int | None  # largest trial inside one NVLink domain on every node; None: unknown
    resource_pool: str
    fabric_interfaces: str  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for trials that span agents
    agent_sizes: tuple[int, ...] | None  # every agent's slots; None: a per_domain node's are unknown
    total_slots: int

    @property
    def max_single_slots(self) -> int:
        """The largest trial that stays on one agent and (when known) one NVLink domain."""
        return min(self.agent_slots, self.nvlink_slots or self.agent_slots)


class TargetError(Exception):
    """cluster.yaml cannot be read; `.lines` are its problems, one line each."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def agent_slots(cluster: Cluster) -> int:
    """One agent's slots: a node's `slots` for per_node; per_domain agents are at most that
    (each domain's size, known only on the node)."""
    return max((n.slots or 0 for n in cluster.agents), default=0)


def agent_sizes(cluster: Cluster) -> tuple[int, ...] | None:
    """Each Determined agent's slots, when cluster.yaml tells them: a per_node agent offers its
    node's `slots`; per_domain agents offer their domains' sizes, read on the node."""
    if any(n.agent_layout != "per_node" for n in cluster.agents):
        return None
    return tuple(sorted(n.slots or 0 for n in cluster.agents))


def load(path: str, nvlink_slots: int | None = None) -> Target:
    if not Path(path).is_file():
        raise TargetError([f"{path}: cannot read the cluster file (no such file)"])
    try:
        cluster = load_cluster(path, resolve_secrets=False)  # an experiment needs no secret
    except ClusterError as e:
        raise TargetError(list(e.problems)) from None
    return Target(
        path=path,
        bucket=cluster.storage.bucket,
        endpoint_url=cluster.trial_endpoint,
        prefix=cluster.storage.prefix,
        region=cluster.storage.region,
        image_gpu=cluster.task_refs.gpu,
        image_cpu=cluster.task_refs.cpu,
        driver=cluster.versions.nvidia_driver,
        agent_slots=agent_slots(cluster),
        agent_sizes=agent_sizes(cluster),
        total_slots=sum(n.slots or 0 for n in cluster.agents),
        nvlink_slots=nvlink_slots,
        resource_pool=cluster.determined.resource_pool,
        fabric_interfaces=",".join(cluster.fabric_interfaces),
    )
