"""The Determined agent(s) on each agent node (after roles/docker: the units require Docker).

The node's `agent_layout` (cluster.yaml) picks how its GPUs are offered (docs/topology.md):

per_node    one agent, the package's determined-agent.service with /etc/determined/agent.yaml,
            agent_id = hostname, every GPU.
per_domain  one agent per NVLink domain: determined-agent@<i>.service (a template unit this
            role installs; the package ships none) with /etc/determined/agent-<i>.yaml
            (`--config-file`), agent_id = <hostname>-<i>, visible_gpus = the domain's GPUs.
            The package's plain unit is stopped and disabled, and agent.yaml holds no
            master_host, so starting that unit by mistake fails instead of offering the GPUs
            twice.

The domains come from the node's own `nvidia-smi topo -m`, read when the operation RUNS
(`domain_agents` below): on a first deploy the driver is installed and loaded only by the
driver role's reboot, long after pyinfra prepared the plan, so deploy-level code would see no
GPU at all. Each run's domains are recorded for the closing summary (deploy/summary.py: the
largest slots_per_trial that fits inside one domain on every agent node).

configure: agent.yaml (per_node: from agent.yaml.j2; per_domain: agent.per_domain.yaml) and a
           unit drop-in, written BEFORE the package (its postinst restarts an enabled agent;
           dpkg keeps an existing conffile)
install:   determined-agent <version> from sources.determined_agent, sha256-verified;
           skipped when that version is installed
activate:  per_node: every determined-agent@ instance stopped and disabled, its config and
           the template removed; then the plain unit enabled and running, restarted only when
           agent.yaml or its drop-in changed and the package did not.
           per_domain: the plain unit stopped and disabled; instances of domains that no
           longer exist stopped and removed; then one instance per domain, enabled and
           running, restarted only when its own config, the template or the package changed.
           Stale agents are stopped before new ones start, so no GPU is offered twice.
           The drop-in (and the same lines in the template) lift systemd's start limit: an
           agent started before its master is reachable keeps retrying every 5 s.

A stopped agent closes its connection; the master lists it as disabled for the resource
pool's agent_reconnect_wait (25 s by default) and then drops it. Registration with the master
is checked by tests/verify/test_determined.py and tests/verify/test_topology_agents.py.
"""

from __future__ import annotations

import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, StringCommand, deploy, operation
from pyinfra.api.exceptions import FactProcessError
from pyinfra.facts.files import Directory, File
from pyinfra.operations import files, systemd

from deploy.cluster import Cluster, Node
from deploy.topology import (
    OK,
    AgentSpec,
    GpuMigModes,
    GpuTopology,
    Topology,
    agent_plan,
    domains,
    record_domains,
)
from roles.determined_master import CONFIG_DIR, install_determined, render
from roles.shared_ops import packages

FILES = Path(__file__).resolve().parent.parent / "files" / "determined"
AGENT_YAML = f"{CONFIG_DIR}/agent.yaml"
DROP_IN = "/etc/systemd/system/determined-agent.service.d/10-restart.conf"
SERVICE = "determined-agent.service"
TEMPLATE_UNIT = "/etc/systemd/system/determined-agent@.service"
# An administrator's drop-ins for the template go with it when a node returns to per_node.
TEMPLATE_DROP_INS = "/etc/systemd/system/determined-agent@.service.d"
UP_STATES = ("active", "activating", "deactivating", "reloading", "refreshing")


def domain_config(index: str | int) -> str:
    return f"{CONFIG_DIR}/agent-{index}.yaml"


def domain_unit(index: str | int) -> str:
    return f"determined-agent@{index}.service"


def _render(cluster: Cluster, agent_id: str, visible_gpus: str | None, path: str) -> str:
    determined = cluster.determined
    return render(
        "agent.yaml.j2",
        path=path,
        master_host=cluster.master_host,
        master_port=cluster.master_port,
        container_master_host=str(cluster.master_node.address),
        agent_id=agent_id,
        resource_pool=determined.resource_pool,
        slot_type=determined.slot_type,
        visible_gpus=visible_gpus,
    )


def agent_yaml(cluster: Cluster, node: Node) -> str:
    """/etc/determined/agent.yaml, the package unit's config: the node's one agent
    (agent_layout per_node: id = hostname, no visible_gpus: every GPU nvidia-smi lists), or
    on a per_domain node a file without master_host (see files/determined/)."""
    if node.agent_layout == "per_domain":
        return (FILES / "agent.per_domain.yaml").read_text()
    return _render(cluster, node.hostname, None, AGENT_YAML)


def domain_yaml(cluster: Cluster, index: str | int, spec: AgentSpec) -> str:
    """/etc/determined/agent-<index>.yaml: one NVLink domain's agent."""
    return _render(cluster, spec.agent_id, spec.visible_gpus, domain_config(index))


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


def _fail(message: str) -> StringCommand:
    """A command that fails this host with `message` (an operation must not raise)."""
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit 1")


# ---------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class Instance:
    config: bool = False  # /etc/determined/agent-<i>.yaml exists
    enabled: bool = False  # a *.wants/determined-agent@<i>.service link exists
    active: str = "inactive"  # systemd ActiveState ("active", "activating", "failed", ...)


_CONFIG_LINE = re.compile(r"^config .*/agent-([0-9]+)\.yaml$")
_WANTS_LINE = re.compile(r"^enabled determined-agent@([0-9]+)\.service$")
_UNIT_LINE = re.compile(r"^unit determined-agent@([0-9]+)\.service \S+ (\S+)")


class DomainAgents(FactBase):
    """{"0": Instance(...), ...}: every per-domain agent a node has, by instance index.

    From three places, so that nothing half-removed is missed: the configs, the enablement
    links, and the units systemd has loaded (running, restarting or failed).
    """

    def command(self):
        return (
            f'for f in {CONFIG_DIR}/agent-*.yaml; do [ -e "$f" ] && echo "config $f"; done; '
            "for f in /etc/systemd/system/*.wants/determined-agent@*.service; do "
            '[ -L "$f" ] || [ -e "$f" ] && echo "enabled ${f##*/}"; done; '
            "systemctl list-units --all --plain --no-legend --no-pager "
            "'determined-agent@*.service' 2>/dev/null | sed 's/^/unit /'; true"
        )

    @staticmethod
    def default():
        return {}

    def process(self, output):
        found: dict[str, dict] = {}
        for line in output:
            line = line.strip()
            for pattern, key in ((_CONFIG_LINE, "config"), (_WANTS_LINE, "enabled"), (_UNIT_LINE, "active")):
                m = pattern.match(line)
                if m:
                    value = m.group(2) if key == "active" else True
                    found.setdefault(m.group(1), {})[key] = value
        return {index: Instance(**fields) for index, fields in found.items()}


class UnitState(FactBase):
    """(ActiveState, UnitFileState) of one unit: ("active", "enabled"), ("inactive", "disabled"),
    ("activating", ...) while Restart= waits; ("inactive", "") when the unit does not exist."""

    def command(self, unit: str):
        return (
            f"systemctl show --property ActiveState --property UnitFileState "
            f"{shlex.quote(unit)} 2>/dev/null; true"
        )

    @staticmethod
    def default():
        return ("inactive", "")

    def process(self, output):
        values = dict(line.strip().partition("=")[::2] for line in output if "=" in line)
        return values.get("ActiveState") or "inactive", values.get("UnitFileState", "")


# ---------------------------------------------------------------------------- operations


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


def _read_topology() -> tuple[Topology | None, str | None]:
    try:
        return host.get_fact(GpuTopology), None
    except FactProcessError as e:  # a matrix deploy.topology cannot read: fail with it
        return None, f"{host.name}: {e}"


@operation()
def domain_agents(cluster: Cluster, node: Node, template_changed, package_changed):
    """One determined-agent@<i> per NVLink domain, from the topology read as this runs.

    `template_changed` / `package_changed`: callables, asked only while executing, saying
    whether every instance must restart (new unit file or a new agent binary).
    """
    executing = host.state.is_executing
    topology, unreadable = _read_topology()
    if unreadable:
        yield _fail(unreadable)
        return
    problem = domain_problem(node, topology, host.get_fact(GpuMigModes))
    if problem and not executing and topology.status != OK:
        # Preparing the plan on a node whose driver comes later in this run (first deploy).
        host.noop("GPU topology not readable yet: read again when this operation runs")
        return
    if problem:
        yield _fail(problem)
        return
    if executing:
        record_domains(host.state, node.hostname, "per_domain", topology)
    plan = {str(i): spec for i, spec in enumerate(agent_plan(node.hostname, domains(topology), "per_domain"))}
    present = host.get_fact(DomainAgents)

    # Agents of domains that are gone first: their GPUs may belong to a new domain below.
    for index in sorted(set(present) - set(plan), key=int):
        yield from _retire(index, present[index])

    restart_all = executing and (package_changed() or template_changed())
    if executing and template_changed():
        yield StringCommand("systemctl daemon-reload")
    for index, spec in plan.items():
        path = domain_config(index)
        written = list(
            files.put._inner(
                src=io.StringIO(domain_yaml(cluster, index, spec)),
                dest=path,
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
    """No determined-agent@ instance, config or template left (agent_layout per_node)."""
    present = host.get_fact(DomainAgents)
    changed = False
    for index in sorted(present, key=int):
        for command in _retire(index, present[index]):
            changed = True
            yield command
    if host.get_fact(File, path=TEMPLATE_UNIT):
        changed = True
        yield StringCommand(f"rm -f {TEMPLATE_UNIT}")
    if host.get_fact(Directory, path=TEMPLATE_DROP_INS):
        changed = True
        yield StringCommand(f"rm -rf {TEMPLATE_DROP_INS}")
    if changed:
        yield StringCommand("systemctl daemon-reload")


@operation(is_idempotent=True)
def note_domains(node: Node):
    """Record this per_node node's domains for the run's summary; no command, no change.

    Without a readable topology the summary says so; the per_node agent does not need one.
    """
    if not host.state.is_executing:
        return
    topology, unreadable = _read_topology()
    if topology is None:
        host.noop(unreadable)
        return
    record_domains(host.state, node.hostname, "per_node", topology)
    return
    yield


# ---------------------------------------------------------------------------- role


@deploy("Determined agent")
def apply():
    cluster: Cluster = host.data.cluster
    node: Node = host.data.node
    per_domain = node.agent_layout == "per_domain"

    packages(["curl", "ca-certificates"], "download tools")

    # configure (before the package: see the module docstring)
    files.directory(name=CONFIG_DIR, path=CONFIG_DIR, user="root", group="root", mode="755")
    config = files.put(
        name=(
            f"{AGENT_YAML}: unused on a per_domain node (no master_host)"
            if per_domain
            else f"Agent configuration {AGENT_YAML}"
        ),
        src=io.StringIO(agent_yaml(cluster, node)),
        dest=AGENT_YAML,
        user="root",
        group="root",
        mode="644",
    )
    drop_in = files.put(
        name="Agent unit drop-in: keep retrying until the master answers",
        src=str(FILES / "agent-10-restart.conf"),
        dest=DROP_IN,
        user="root",
        group="root",
        mode="644",
    )

    # install
    package = install_determined(cluster, "agent")

    # activate
    if per_domain:
        unit_off(name="Per-node agent stopped and disabled (one agent per domain here)", unit=SERVICE)
        template = files.put(
            name=f"Per-domain agent unit {TEMPLATE_UNIT}",
            src=str(FILES / "determined-agent@.service"),
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
            package_changed=package.did_change,
        )
        return

    no_domain_agents(name="No per-domain agents left (agent_layout per_node)")
    systemd.service(
        name="Restart the agent for its new configuration",
        service=SERVICE,
        running=True,
        restarted=True,
        daemon_reload=True,
        _if=lambda: (config.did_change() or drop_in.did_change()) and not package.did_change(),
    )
    systemd.service(name="Agent enabled and running", service=SERVICE, running=True, enabled=True)
    note_domains(name="Read the GPU topology for the run summary", node=node)
