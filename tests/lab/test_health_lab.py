"""Health rows go red exactly where the lab injected hardware faults, and --drain-unhealthy takes
exactly those nodes' agents out of scheduling, then puts them back once the faults are cleared.

Faults are written to /etc/dtlab/faults.json on a node, which the nvidia-smi and InfiniBand
diagnostics stand-ins read (tests/lab/standins/nvidia/nvidia_smi.py, mofed/ib_diags.py): GPU
faults on the first agent node, PCIe and fabric faults on the second, the third stays healthy.
Xid events cannot be injected: they are kernel log lines, and a lab node has no kernel log of
its own (docs/verify.md, "Health"); tests/unit/test_health.py covers their parsing.
"""

import json
import shlex

import pytest

from tests.verify.drain import set_agent_enabled
from tests.verify.master_api import _agents_of, admin_token, list_agents

from .conftest import failing_cells, run_verify

FAULTS_FILE = "/etc/dtlab/faults.json"
GPU_FAULTS = {
    "gpus": {
        "2": {"ecc_uncorrectable": 3},
        "5": {"remap_pending": True},
        "6": {"throttle": ["hw_thermal_slowdown"]},
    }
}
FABRIC_FAULTS = {
    "gpus": {"4": {"pcie_width": 8}},
    "ib": {"rate": 100, "width": "2X", "link_downed_per_read": 1},
}


def _agents(lab) -> dict[str, dict]:
    return {a["id"]: a for a in list_agents(lab)}


def _enabled(lab, node) -> dict[str, bool]:
    return {i: a.get("enabled", True) for i, a in _agents_of(node, _agents(lab)).items()}


@pytest.fixture
def faulty(deployed, lab, lab_ssh):
    gpu_node, fabric_node, healthy = lab.agents[:3]
    for node, faults in ((gpu_node, GPU_FAULTS), (fabric_node, FABRIC_FAULTS)):
        lab_ssh(
            node.hostname,
            f"mkdir -p /etc/dtlab && printf '%s\\n' {shlex.quote(json.dumps(faults))} > {FAULTS_FILE}",
        )
    yield gpu_node, fabric_node, healthy
    # Whatever happened: no fault left, every agent of the lab enabled again.
    for node in (gpu_node, fabric_node):
        lab_ssh(node.hostname, f"rm -f {FAULTS_FILE}", check=False)
    token = admin_token(lab)
    for agent_id, agent in _agents(lab).items():
        if not agent.get("enabled", True):
            set_agent_enabled(lab, token, agent_id, True)


def expected_cells(gpu_node, fabric_node) -> set[str]:
    gpu, fabric = gpu_node.hostname, fabric_node.hostname
    return {
        f"test_health::test_no_uncorrectable_ecc_errors[{gpu}]",
        f"test_health::test_no_pending_remaps_or_retirements[{gpu}]",
        f"test_health::test_no_hardware_clock_throttling[{gpu}]",
        f"test_health::test_pcie_links_at_max[{fabric}]",
        f"test_health::test_ib_ports_rate_and_width[{fabric}]",
        f"test_health::test_ib_links_not_flapping[{fabric}]",
    }


def test_faults_turn_their_cells_red_and_drain_their_nodes(faulty, lab, lab_ssh, tmp_path):
    gpu_node, fabric_node, healthy = faulty
    junit, state, log = tmp_path / "verify.xml", tmp_path / "drained.json", tmp_path / "drain.log"
    drain_args = (
        "-p",
        "tests.verify.drain",
        "--drain-unhealthy",
        f"--drain-state={state}",
        f"--drain-log={log}",
    )
    # The faults change what nvidia-smi and the InfiniBand tools print: every check that reads
    # them (health, GPU stack, topology) runs, and exactly the expected cells may be red.
    readers = ("-k", "test_health or test_gpu_stack or test_topology_agents")
    result = run_verify("-n", "4", *readers, "-p", "tests.verify.matrix", f"--junitxml={junit}", *drain_args)
    assert result.returncode != 0
    assert failing_cells(junit) == expected_cells(gpu_node, fabric_node), result.stdout[-5000:]

    # Exactly the two faulty nodes' agents are disabled, each with its reason in the log.
    for node in (gpu_node, fabric_node):
        enabled = _enabled(lab, node)
        assert enabled and not any(enabled.values()), (node.hostname, enabled)
    assert all(_enabled(lab, healthy).values())
    actions = log.read_text()
    assert f"disable agent {gpu_node.hostname}-0 of {gpu_node.hostname}: done" in actions, actions
    # A node's reasons are its failed checks in the order they finished (xdist's): any order.
    reasons = {
        line.split(" of ")[1].split(":")[0]: line.split("; reason: ", 1)[1]
        for line in actions.splitlines()
        if "; reason: " in line
    }
    assert "test_no_uncorrectable_ecc_errors: volatile uncorrectable ECC errors" in reasons[gpu_node.hostname]
    assert "test_pcie_links_at_max: PCIe link trained down: GPU 4: x8 of x16" in reasons[fabric_node.hostname]
    assert healthy.hostname not in actions, actions
    assert set(json.loads(state.read_text())) == set(_enabled(lab, gpu_node)) | set(
        _enabled(lab, fabric_node)
    )

    # Faults cleared: the health rows are green, and the drained agents come back.
    for node in (gpu_node, fabric_node):
        lab_ssh(node.hostname, f"rm -f {FAULTS_FILE}")
    result = run_verify("-n", "4", "-k", "test_health", *drain_args)
    assert result.returncode == 0, result.stdout[-5000:]
    for node in (gpu_node, fabric_node):
        assert all(_enabled(lab, node).values()), node.hostname
        assert f"enable agent {node.hostname}" in log.read_text()
    assert json.loads(state.read_text()) == []
