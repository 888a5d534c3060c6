"""What the master runs on a node's agents, asked once per deploy before any step that would
end it: restarting Docker (every container on the node dies with the daemon), restarting the
agent, or rebooting into a new driver.

Determined 0.38's GET /api/v1/tasks (master/internal/api_tasks.go GetTasks; proto
api.proto `GetTasks`) lists every allocation with its resources, each naming the agents
whose devices it holds (`agentDevices`); a trial's allocation is named "Trial <t>
(Experiment <e>)" (master/internal/trial.go). An agent belongs to a node by its id: the
hostname (agent_layout per_node) or `<hostname>-<i>` (per_domain).

A step that would end an allocation stops its host first, with one line naming the node, what
runs there and how to go on (drain the node's agents, then deploy again), unless the operator
accepts the loss: `pyinfra ... --data disruptive=yes` (pyinfra's own way to give every host a
value). When the master cannot be asked (a first deploy: it does not run yet; or it is down)
nothing is known to run through it, and the deploy goes on, saying so once.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra import logger

from deploy.cluster import Cluster, Node

ACCEPT_KEY = "disruptive"  # --data disruptive=yes
ACCEPTED = ("yes", "true", "1")

_ASKED: dict[str, dict[str, tuple[str, ...]] | None] = {}  # cluster file -> holders per node


@dataclass(frozen=True)
class Busy:
    """What the master runs on one node (allocation names), and whether its loss is accepted."""

    node: str
    holders: tuple[str, ...] = ()
    accepted: bool = False
    cluster_file: str = "FILE"  # named in the refusal's command

    @property
    def guarded(self) -> bool:
        """Whether a disruptive step must stop this host rather than run."""
        return bool(self.holders) and not self.accepted

    def refusal(self, step: str) -> str:
        """The one line that stops the host before `step`."""
        shown = ", ".join(self.holders)
        return (
            f"{self.node}: {step} would end what the master runs here: {shown}. Roll the change "
            f"through node by node instead, draining each first: python -m deploy upgrade "
            f"--cluster {shlex.quote(self.cluster_file)} -y (add --pause-experiments to pause "
            f"what does not finish); or "
            f"accept the loss: deploy with --data {ACCEPT_KEY}=yes"
        )


IDLE = Busy(node="")


def holders_by_node(cluster: Cluster, summaries: dict) -> dict[str, tuple[str, ...]]:
    """GET /api/v1/tasks's allocationIdToSummary -> {hostname: allocation names}."""
    found: dict[str, set[str]] = {}
    for summary in (summaries or {}).values():
        name = str(summary.get("name") or summary.get("allocationId") or "an allocation")
        for resources in summary.get("resources") or []:
            for agent_id in resources.get("agentDevices") or {}:
                for node in cluster.agents:
                    if node.owns_agent(str(agent_id)):
                        found.setdefault(node.hostname, set()).add(name)
    return {hostname: tuple(sorted(names)) for hostname, names in found.items()}


def _ask(cluster: Cluster) -> dict[str, tuple[str, ...]] | None:
    from deploy.rebuild import Master, MasterError, MasterRefused

    try:
        return Master(cluster, timeout=5).holders(cluster)
    except (MasterError, MasterRefused) as e:
        logger.warning(f"what runs on the agents is unknown (the master was not asked: {e})")
        return None


def busy(cluster: Cluster, node: Node, accept: object = None) -> Busy:
    """The node's Busy: the master is asked once per deploy (per cluster file), on first use."""
    key = str(cluster.path)
    if key not in _ASKED:
        _ASKED[key] = _ask(cluster)
    holders = (_ASKED[key] or {}).get(node.hostname, ())
    return Busy(
        node=node.hostname,
        holders=holders,
        accepted=str(accept or "").lower() in ACCEPTED,
        cluster_file=str(cluster.path),
    )
