"""Topology-aware agents on the lab: one agent per NVLink domain, and layout switches.

The expected domains come from the lab's hardware sidecar (lab-hardware.yaml next to the
cluster file: which topology preset the nvidia-smi stand-in plays on each node), not from
deploy.topology, so the deploy's grouping is checked against what the hardware is.
On the default lab: lab-gpu1 (two domains of four) and lab-gpu2 (one NVSwitch domain of
eight) are per_domain, lab-gpu3 per_node.

A stopped agent stays listed by the master, disabled, for agent_reconnect_wait (25 s); the
checks here judge enabled agents at once and then wait for the stale ones to be dropped.

The NVLink lines (each node's domains, the largest trial inside one domain) are printed by
`python -m deploy verify` after its matrix, from what its topology checks read on the nodes.
"""

import subprocess
import sys
import time

import pytest
import yaml

from tests.verify.master_api import _slot_count, list_agents

from .conftest import LAB_CLUSTER, REPO, run_verify

pytestmark = pytest.mark.lab

# GPU counts per NVLink domain of each hardware preset (tests/lab/hardware.py PRESETS).
PRESET_DOMAINS = {"a100-2x4": (4, 4), "a100-nvswitch-8": (8,)}
DEFAULT_PRESET = "a100-2x4"  # the nvidia-smi stand-in's own topology
RECONNECT_WAIT = 25  # seconds: the resource pool's default agent_reconnect_wait
VERIFY_TOPOLOGY = ("-k", "test_topology_agents or test_determined")
SUMMARY = "--> largest slots_per_trial inside one NVLink domain on every agent node: {}"


def verify_command(*args, cluster=LAB_CLUSTER) -> subprocess.CompletedProcess:
    """`python -m deploy verify`: its matrix, then the NVLink lines (two workers: the lab host's cores)."""
    return subprocess.run(
        [sys.executable, "-m", "deploy", "verify", "--cluster", str(cluster), "-n", "2", *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def domain_sizes(hostname: str) -> tuple[int, ...]:
    sidecar = LAB_CLUSTER.with_name("lab-hardware.yaml")
    nodes = (yaml.safe_load(sidecar.read_text()) or {}).get("nodes") or {} if sidecar.exists() else {}
    preset = (nodes.get(hostname) or {}).get("gpu_topology", DEFAULT_PRESET)
    return PRESET_DOMAINS[preset]


def expected_agents(hostname: str, layout: str) -> dict[str, int]:
    sizes = domain_sizes(hostname)
    if layout == "per_node":
        return {hostname: sum(sizes)}
    return {f"{hostname}-{i}": size for i, size in enumerate(sizes)}


def expected_cluster(cluster, layouts: dict[str, str] | None = None) -> dict[str, int]:
    layouts = layouts or {}
    found: dict[str, int] = {}
    for node in cluster.agents:
        found.update(expected_agents(node.hostname, layouts.get(node.hostname, node.agent_layout)))
    return found


def listed_agents(cluster) -> dict[str, dict]:
    return {a["id"]: a for a in list_agents(cluster)}


def enabled(agents: dict[str, dict]) -> dict[str, int]:
    return {i: _slot_count(a.get("slots")) for i, a in agents.items() if a.get("enabled")}


def wait_for_agents(cluster, expected: dict[str, int], seconds: float = 40) -> dict[str, dict]:
    """The master's agents once the enabled ones are exactly `expected` (fails after
    `seconds` naming what is enabled)."""
    deadline = time.monotonic() + seconds
    while True:
        agents = listed_agents(cluster)
        if enabled(agents) == expected:
            return agents
        if time.monotonic() > deadline:
            raise AssertionError(f"enabled agents {enabled(agents)}, expected {expected}")
        time.sleep(2)


def wait_until_dropped(cluster, stale: set[str], seconds: float = RECONNECT_WAIT + 30) -> None:
    """Stale agents only ever listed as disabled, and gone after agent_reconnect_wait."""
    deadline = time.monotonic() + seconds
    while True:
        agents = listed_agents(cluster)
        still = stale & set(agents)
        assert not [i for i in still if agents[i].get("enabled")], (
            f"stale agents enabled again: {sorted(still)}"
        )
        if not still:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"stale agents still listed after {seconds} s: {sorted(still)}")
        time.sleep(3)


def node_units(lab_ssh, hostname: str) -> dict[str, object]:
    """What runs and is configured on the node, in the terms of the two layouts."""
    sh = lambda cmd: lab_ssh(hostname, cmd, check=False).stdout.split()  # noqa: E731
    return {
        "up": sorted(
            sh(
                "systemctl list-units --all --plain --no-legend --no-pager "
                '\'determined-agent*\' | awk \'$3 == "active" || $3 == "activating" '
                "{print $1}'"
            )
        ),
        "enabled": sorted(
            p.rsplit("/", 1)[-1]
            for p in sh("ls -1 /etc/systemd/system/*.wants/ 2>/dev/null | grep '^determined-agent'")
        ),
        "configs": sorted(sh("ls -1 /etc/determined/ | grep -E '^agent-[0-9]+[.]yaml$'")),
        "template": sh("ls /etc/systemd/system/determined-agent@.service 2>/dev/null"),
    }


def started_at(lab_ssh, hostname: str, unit: str) -> str:
    """When the unit last became active (changes on every (re)start)."""
    return lab_ssh(hostname, f"systemctl show -p ActiveEnterTimestampMonotonic {unit}").stdout


def agent_unit_starts(lab, lab_ssh, skip: str) -> dict[str, str]:
    starts = {}
    for node in lab.agents:
        if node.hostname == skip:
            continue
        units = (
            ["determined-agent.service"]
            if node.agent_layout == "per_node"
            else [f"determined-agent@{i}.service" for i in range(len(domain_sizes(node.hostname)))]
        )
        for unit in units:
            starts[f"{node.hostname}:{unit}"] = started_at(lab_ssh, node.hostname, unit)
    return starts


def per_domain_units(hostname: str) -> dict[str, object]:
    count = len(domain_sizes(hostname))
    units = [f"determined-agent@{i}.service" for i in range(count)]
    return {
        "up": units,
        "enabled": units,
        "configs": [f"agent-{i}.yaml" for i in range(count)],
        "template": ["/etc/systemd/system/determined-agent@.service"],
    }


PER_NODE_UNITS = {
    "up": ["determined-agent.service"],
    "enabled": ["determined-agent.service"],
    "configs": [],
    "template": [],
}


@pytest.fixture
def flip_node(lab):
    """The per_domain node with more than one domain (lab-gpu1 on the default lab)."""
    for node in lab.agents:
        if node.agent_layout == "per_domain" and len(domain_sizes(node.hostname)) > 1:
            return node.hostname
    pytest.skip("no per_domain node with several NVLink domains in this lab's cluster file")


@pytest.fixture
def per_node_copy(lab, tmp_path, flip_node):
    """(cluster, inventory) with flip_node set to agent_layout per_node."""
    raw = yaml.safe_load(lab.path.read_text())
    for entry in raw["nodes"]:
        if entry["hostname"] == flip_node:
            entry["agent_layout"] = "per_node"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(raw, sort_keys=False))
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(cluster)!r}))\n")
    return cluster, inventory


def test_lab_layout_one_agent_per_domain(deployed, lab, lab_ssh):
    agents = wait_for_agents(lab, expected_cluster(lab))
    for node in lab.agents:
        if node.agent_layout == "per_domain":
            assert node_units(lab_ssh, node.hostname) == per_domain_units(node.hostname)
        else:
            assert node_units(lab_ssh, node.hostname) == PER_NODE_UNITS
    verify = verify_command(*VERIFY_TOPOLOGY)
    assert verify.returncode == 0, verify.stdout[-4000:]
    largest = min(max(domain_sizes(n.hostname)) for n in lab.agents)
    assert SUMMARY.format(largest) in verify.stdout.splitlines(), verify.stdout[-2000:]
    sizes = {n.hostname: "+".join(str(size) for size in domain_sizes(n.hostname)) for n in lab.agents}
    domains_line = next(line for line in verify.stdout.splitlines() if line.startswith("--> NVLink domains"))
    for node in lab.agents:
        assert f"{node.hostname} {sizes[node.hostname]} ({node.agent_layout})" in domains_line
    assert sorted(enabled(agents)) == sorted(expected_cluster(lab))


def test_flip_to_per_node_and_back(deployed, deploy, lab, lab_ssh, flip_node, per_node_copy):
    cluster_copy, inventory_copy = per_node_copy
    per_domain_ids = set(expected_agents(flip_node, "per_domain"))
    others_before = agent_unit_starts(lab, lab_ssh, skip=flip_node)
    flipped_back = False
    try:
        # per_domain -> per_node: the instances go, the package's unit comes back.
        run = deploy(inventory=inventory_copy)
        assert run.returncode == 0, run.stderr[-4000:]
        assert node_units(lab_ssh, flip_node) == PER_NODE_UNITS
        wait_for_agents(lab, expected_cluster(lab, {flip_node: "per_node"}))
        wait_until_dropped(lab, per_domain_ids)
        verify = verify_command(*VERIFY_TOPOLOGY, cluster=cluster_copy)
        assert verify.returncode == 0, verify.stdout[-4000:]
        unenforced = [
            line for line in verify.stdout.splitlines() if line.strip().startswith("not enforced on ")
        ]
        assert len(unenforced) == 1 and flip_node in unenforced[0], verify.stdout[-2000:]
        again = deploy(inventory=inventory_copy)
        assert again.returncode == 0, again.stderr[-4000:]
        assert again.results["totals"]["success"] == 0, again.changed_operations()

        # per_node -> per_domain: back to one agent per domain, the plain unit off.
        back = deploy()
        flipped_back = True
        assert back.returncode == 0, back.stderr[-4000:]
        assert node_units(lab_ssh, flip_node) == per_domain_units(flip_node)
        wait_for_agents(lab, expected_cluster(lab))
        wait_until_dropped(lab, {flip_node})
        verify = run_verify(*VERIFY_TOPOLOGY)
        assert verify.returncode == 0, verify.stdout[-4000:]

        second = deploy()
        assert second.returncode == 0, second.stderr[-4000:]
        assert second.results["totals"]["success"] == 0, second.changed_operations()
        # Agents of the nodes whose layout did not change were never restarted.
        assert agent_unit_starts(lab, lab_ssh, skip=flip_node) == others_before
    finally:
        if not flipped_back:
            deploy()
