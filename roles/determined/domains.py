"""The per-domain Determined agents of an agent node (agent_layout: per_domain), the half of
roles/determined/agent.py that runs one agent per NVLink domain:

determined-agent@<i>.service, a template unit this role installs (the package ships none),
reads /etc/determined/agent-<i>.yaml (`--config-file`): agent_id = <hostname>-<i>,
visible_gpus = the domain's GPUs. The package's plain unit is stopped and disabled.

The domains come from the node's own `nvidia-smi topo -m`, read when the operation RUNS
(`domain_agents` below): on a first deploy the driver is installed and loaded only by the
driver role's reboot, long after pyinfra prepared the plan, so deploy-level code would see no
GPU at all.

activate:   instances of domains that no longer exist stopped and removed; then one instance
            per domain, enabled and running, restarted only when its own config, the template,
            the package or the master's CA (determined.tls) changed. Stale agents go before
            new ones start, so no GPU is offered twice.
remove_all: on a per_node node, every instance stopped and disabled, its config, the
            template and an administrator's drop-ins for it removed.
"""

from __future__ import annotations

import io
import shlex
from collections.abc import Callable

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from deploy.cluster import Cluster, Node
from deploy.facts.determined import DomainAgents, Instance
from deploy.facts.gpu import GpuMigModes, GpuTopology
from deploy.facts.system import UnitState
from deploy.topology import OK, AgentSpec, Topology, agent_plan, domains
from roles.determined.common import CONFIG_DIR, agent_config
from roles.shared.ops import fail
from roles.shared.templates import files_path

TEMPLATE_UNIT = "/etc/systemd/system/determined-agent@.service"
# An administrator's drop-ins for the template go with it when a node returns to per_node.
TEMPLATE_DROP_INS = "/etc/systemd/system/determined-agent@.service.d"
UP_STATES = ("active", "activating", "deactivating", "reloading", "refreshing")


def domain_config(index: str | int) -> str:
    return f"{CONFIG_DIR}/agent-{index}.yaml"


def domain_unit(index: str | int) -> str:
    return f"determined-agent@{index}.service"


def domain_yaml(cluster: Cluster, index: str | int, spec: AgentSpec) -> str:
    """/etc/determined/agent-<index>.yaml: one NVLink domain's agent."""
    return agent_config(cluster, spec.agent_id, spec.visible_gpus, domain_config(index))


def domain_problem(node: Node, topology: Topology, mig_modes: dict[int, str]) -> str | None:
    """Why one agent per NVLink domain cannot be set up on this node from this topology."""
    where = f"{node.hostname}: agent_layout per_domain"
    if topology.status != OK:
        said = f": {topology.detail}" if topology.detail else ""
        return (
            f"{where} needs the GPU topology, but `nvidia-smi topo -m` gave no matrix "
            f"({topology.status}{said})"
        )
    mig = sorted(i for i, mode in mig_modes.items() if mode == "Enabled")
    if mig:
        return (
            f"{where}: MIG is enabled on GPU {', '.join(map(str, mig))}; MIG instances "
            "cannot use NVLink peer-to-peer, so NVLink domains mean nothing there. Disable "
            "MIG or set agent_layout: per_node for this node"
        )
    count = len(topology.gpus)
    if node.slots is not None and count != node.slots:
        return (
            f"{where}: `nvidia-smi topo -m` shows {count} GPUs but cluster.yaml says "
            f"slots: {node.slots}; a GPU may have fallen off the bus (`nvidia-smi -L`), "
            "or slots is wrong"
        )
    return None


@operation()
def unit_off(unit: str):
    """`unit` stopped and disabled, whatever it is doing (also while Restart= waits to start
    it again, which pyinfra's systemd.service counts as not running)."""
    active, enabled = host.get_fact(UnitState, unit=unit)
    if enabled == "enabled" or active in UP_STATES:
        yield StringCommand(f"systemctl disable --now {shlex.quote(unit)}")
    if active == "failed":
        yield StringCommand(f"systemctl reset-failed {shlex.quote(unit)}")


def _retire(index: str, instance: Instance):
    """Commands that stop, disable and forget one per-domain agent."""
    unit = domain_unit(index)
    if instance.enabled or instance.active in UP_STATES:
        yield StringCommand(f"systemctl disable --now {unit}")
    if instance.active == "failed":
        yield StringCommand(f"systemctl reset-failed {unit}")
    if instance.config:
        yield StringCommand(f"rm -f {domain_config(index)}")


@operation()
def domain_agents(
    cluster: Cluster, node: Node, template_changed: Callable[[], bool], package_changed: Callable[[], bool]
):
    """One determined-agent@<i> per NVLink domain, from the topology read as this runs.

    `template_changed` / `package_changed`: asked only while executing, saying whether every
    instance must restart (new unit file or a new agent binary).
    """
    executing = host.state.is_executing
    try:
        topology = host.get_fact(GpuTopology)
    except FactProcessError as e:  # a matrix deploy.topology cannot read: fail with it
        yield fail(f"{host.name}: {e}")
        return
    problem = domain_problem(node, topology, host.get_fact(GpuMigModes))
    if problem and not executing and topology.status != OK:
        # Preparing the plan on a node whose driver comes later in this run (first deploy).
        host.noop("GPU topology not readable yet: read again when this operation runs")
        return
    if problem:
        yield fail(problem)
        return
    plan = {str(i): spec for i, spec in enumerate(agent_plan(node.hostname, domains(topology), "per_domain"))}
    present = host.get_fact(DomainAgents, config_dir=CONFIG_DIR)

    # Agents of domains that are gone first: their GPUs may belong to a new domain below.
    for index in sorted(set(present) - set(plan), key=int):
        yield from _retire(index, present[index])

    restart_all = executing and (package_changed() or template_changed())
    if executing and template_changed():
        yield StringCommand("systemctl daemon-reload")
    for index, spec in plan.items():
        written = list(
            files.put._inner(
                src=io.StringIO(domain_yaml(cluster, index, spec)),
                dest=domain_config(index),
                user="root",
                group="root",
                mode="644",
            )
        )
        yield from written
        unit = domain_unit(index)
        instance = present.get(index, Instance())
        if not instance.enabled:
            yield StringCommand(f"systemctl enable {unit}")
        if written or restart_all:
            yield StringCommand(f"systemctl restart {unit}")
        elif instance.active not in ("active", "activating"):
            yield StringCommand(f"systemctl start {unit}")


@operation()
def no_domain_agents():
    """Every determined-agent@ instance stopped, disabled and its config removed."""
    present = host.get_fact(DomainAgents, config_dir=CONFIG_DIR)
    for index in sorted(present, key=int):
        yield from _retire(index, present[index])


def activate(
    cluster: Cluster, node: Node, plain_unit: str, package: OperationMeta, ca: list[OperationMeta]
) -> None:
    """The node's agents, one per NVLink domain, instead of the package's `plain_unit`; `ca`:
    the master's CA (or its removal), read by an agent only when it starts."""
    unit_off(name="Per-node agent stopped and disabled (one agent per domain here)", unit=plain_unit)
    template = files.put(
        name=f"Per-domain agent unit {TEMPLATE_UNIT}",
        src=str(files_path("determined/determined-agent@.service")),
        dest=TEMPLATE_UNIT,
        user="root",
        group="root",
        mode="644",
    )
    domain_agents(
        name="One agent per NVLink domain (nvidia-smi topo -m, read now)",
        cluster=cluster,
        node=node,
        template_changed=template.did_change,
        package_changed=lambda: package.did_change() or any(op.did_change() for op in ca),
    )


def remove_all() -> None:
    """No determined-agent@ instance, config or template left (agent_layout per_node)."""
    retired = no_domain_agents(name="No per-domain agents left (agent_layout per_node)")
    template = files.file(name=f"No {TEMPLATE_UNIT}", path=TEMPLATE_UNIT, present=False)
    drop_ins = files.directory(name=f"No {TEMPLATE_DROP_INS}", path=TEMPLATE_DROP_INS, present=False)
    systemd.daemon_reload(
        name="Reload systemd without the per-domain agents", _if=any_changed(retired, template, drop_ins)
    )
