"""Topology-aware agents: each node's agents match its NVLink domains (docs/topology.md).

Expected values come from two places: the node's `agent_layout` in cluster.yaml, and the
node's own `nvidia-smi topo -m`, grouped into domains by deploy.topology, the same code the
deploy uses. So a check fails when the deploy and the hardware disagree (a GPU gone, a
topology that changed since the deploy), not only when a file differs from a template.

Stale agents: a stopped agent closes its connection and the master keeps listing it, disabled,
for the resource pool's agent_reconnect_wait (25 s by default) before it drops it. The checks
judge ENABLED agents only, so they hold right after a deploy that switched a node's layout; a
disabled leftover is not a fault. An enabled agent nobody expects is one still running
somewhere (or one that did not say goodbye and has not timed out yet).

What each per-agent check reads of its node's topology also goes to the controller as a test
property (P_NVLINK, through xdist like every report): tests/verify/matrix.py prints the NVLink
domains and the largest trial that fits inside one on every agent node after the matrix.
"""

import json
import re

import pytest
import yaml

from deploy.topology import OK, agent_plan, domains, observe, parse_topo
from tests.verify.master_api import _slot_count
from tests.verify.matrix import P_NVLINK

AGENT_YAML = "/etc/determined/agent.yaml"
PLAIN_UNIT = "determined-agent.service"
_DOMAIN_CONFIG = re.compile(r"^/etc/determined/agent-([0-9]+)\.yaml$")


# --- what a node has and should have ---------------------------------------------------------


def node_domains(host, report=None) -> list[tuple[int, ...]]:
    """The node's NVLink domains from its own `nvidia-smi topo -m` (`report` sees what was read)."""
    topology = parse_topo(host.run("nvidia-smi topo -m").stdout)
    if report is not None:
        report(topology)
    assert topology.status == OK, f"nvidia-smi topo -m gave no matrix ({topology.status}: {topology.detail})"
    return domains(topology)


def expected_agents(host, node, report=None) -> dict[str, int]:
    """{agent_id: slots} the node should register, by its layout and its measured domains."""
    found = node_domains(host, report)
    return {a.agent_id: a.slots for a in agent_plan(node.hostname, found, node.agent_layout)}


def domain_config_paths(host) -> dict[str, str]:
    """{instance index: path} of the per-domain agent configs present on the node."""
    listed = host.run("ls -1d /etc/determined/agent-*.yaml 2>/dev/null").stdout.split()
    return {m.group(1): path for path in listed if (m := _DOMAIN_CONFIG.match(path))}


def agent_configs(host, node) -> dict[str, dict]:
    """{path: parsed YAML} of the configs of the agents the node's layout runs."""
    if node.agent_layout == "per_node":
        paths = [AGENT_YAML]
    else:
        paths = [domain_config_paths(host)[i] for i in sorted(domain_config_paths(host), key=int)]
    return {p: yaml.safe_load(host.file(p).content_string) or {} for p in paths}


def expected_agent_id(node, path: str) -> str:
    m = _DOMAIN_CONFIG.match(path)
    return node.hostname if m is None else f"{node.hostname}-{m.group(1)}"


def units_up(host, pattern: str) -> list[str]:
    """Loaded units matching `pattern` that run or are about to (Restart= pending)."""
    out = host.run(f"systemctl list-units --all --plain --no-legend --no-pager '{pattern}'")
    return sorted(
        line.split()[0]
        for line in out.stdout.splitlines()
        if line.split() and line.split()[2] in ("active", "activating", "reloading")
    )


def units_enabled(host, pattern: str) -> list[str]:
    out = host.run(f"ls -1 /etc/systemd/system/*.wants/{pattern} 2>/dev/null")
    return sorted(path.rsplit("/", 1)[-1] for path in out.stdout.split())


def belongs_to(agent_id: str, node) -> bool:
    """An id the deploy gives one of this node's agents: hostname or hostname-<i>."""
    return (
        agent_id == node.hostname or re.fullmatch(re.escape(node.hostname) + r"-[0-9]+", agent_id) is not None
    )


# --- the master's view -----------------------------------------------------------------------


def _enabled(agents: list[dict]) -> dict[str, int]:
    return {a["id"]: _slot_count(a.get("slots")) for a in agents if a.get("enabled", True)}


@pytest.fixture(scope="session")
def enabled_agents(registered_agents):
    """{agent_id: slots} of the ENABLED agents in GET /api/v1/agents, polled (test_determined's
    `registered_agents`) until every agent node's enabled agents offer its slots, or for
    REGISTRATION_WAIT seconds (an agent restarted by the deploy reconnects within a few seconds;
    a stale one still enabled makes a node offer too many). The same poll as the other
    registration checks, and no SSH: each node's expectation is its own check's business."""
    return _enabled(list(registered_agents.values()))


@pytest.fixture
def report_domains(agent, record_property):
    """Hands the controller what this check reads of `agent`'s topology: JSON {"node", "layout"}
    before the read (so that a node whose topology could not be read is named as such), then
    with "domains" and "detail" once read (tests/verify/matrix.py nvlink_lines)."""
    node = {"node": agent.hostname, "layout": agent.agent_layout}
    record_property(P_NVLINK, json.dumps(node))

    def report(topology) -> None:
        seen = observe(agent.agent_layout, topology)
        record_property(P_NVLINK, json.dumps({**node, "domains": seen.domains, "detail": seen.detail}))

    return report


# --- checks ----------------------------------------------------------------------------------


def test_agents_registered_with_domain_slots(agent, host_of, enabled_agents, report_domains):
    """Exactly the node's planned agents are enabled in the master, each with its slots."""
    expected = expected_agents(host_of(agent), agent, report_domains)
    registered = {i: s for i, s in enabled_agents.items() if belongs_to(i, agent)}
    assert registered == expected, (
        f"{agent.hostname} ({agent.agent_layout}): enabled agents {registered}, expected "
        f"{expected} from nvidia-smi topo -m"
    )


def test_agent_configs_cover_each_gpu_once(agent, host_of, report_domains):
    """The visible_gpus of the node's agent configs are its domains (per_domain) or all of
    its GPUs (per_node), so that every GPU is offered by exactly one agent."""
    h = host_of(agent)
    found = node_domains(h, report_domains)
    every = sorted(g for d in found for g in d)
    configs = agent_configs(h, agent)
    assert configs, f"{agent.hostname}: no agent config for layout {agent.agent_layout}"
    offered: dict[str, tuple[int, ...]] = {}
    for path, config in configs.items():
        assert config.get("agent_id") == expected_agent_id(agent, path), path
        visible = config.get("visible_gpus")
        if visible is None or str(visible).strip() == "":
            offered[path] = tuple(every)  # the agent takes every GPU nvidia-smi lists
        else:
            offered[path] = tuple(sorted(int(g) for g in str(visible).split(",")))
    gpus = sorted(g for gs in offered.values() for g in gs)
    assert gpus == every, (
        f"{agent.hostname}: GPUs offered by the agents {offered} must cover {every} once each"
    )
    if agent.agent_layout == "per_domain":
        assert sorted(offered.values()) == sorted(found), (
            f"{agent.hostname}: agent GPU sets {sorted(offered.values())} are not the NVLink domains {found}"
        )


def test_agent_units_match_layout(agent, host_of):
    """per_node: the package's unit only; per_domain: one template instance per config and
    the package's unit off. Nothing else running or enabled."""
    h = host_of(agent)
    plain = h.service(PLAIN_UNIT)
    instances_up = units_up(h, "determined-agent@*.service")
    instances_enabled = units_enabled(h, "determined-agent@*.service")
    if agent.agent_layout == "per_node":
        assert plain.is_enabled and plain.is_running, f"{PLAIN_UNIT} not enabled and running"
        assert (instances_up, instances_enabled) == ([], []), (
            f"per-domain agents left on a per_node node: running {instances_up}, enabled {instances_enabled}"
        )
        assert domain_config_paths(h) == {}, "per-domain agent configs left behind"
        return
    assert not plain.is_enabled and not plain.is_running, (
        f"{PLAIN_UNIT} must be stopped and disabled on a per_domain node"
    )
    wanted = sorted(f"determined-agent@{i}.service" for i in domain_config_paths(h))
    assert wanted, "no /etc/determined/agent-<i>.yaml on a per_domain node"
    assert instances_enabled == wanted, f"enabled {instances_enabled}, configs for {wanted}"
    assert instances_up == wanted, f"running {instances_up}, configs for {wanted}"
    assert units_up(h, PLAIN_UNIT) == []


def test_no_unexpected_agent_enabled(cluster, answering, enabled_agents):
    """Cluster-wide: every enabled agent is one the cluster file and the topology expect
    (catches a stale agent from an earlier layout, or from a node no longer in cluster.yaml).
    Nodes found dead before the checks are not asked; their agents' ids are not judged."""
    expected: set[str] = set()
    asked = answering(cluster.agents)
    for node, h in asked:
        expected |= set(expected_agents(h, node))
    left_out = [n for n in cluster.agents if n.hostname not in {a.hostname for a, _ in asked}]
    unexpected = sorted(
        i for i in set(enabled_agents) - expected if not any(belongs_to(i, n) for n in left_out)
    )
    assert unexpected == [], f"enabled agents nobody expects: {unexpected}"
