"""Verify goes red exactly where the lab was broken on purpose, with the matching hints.

Four breakages on four nodes at once: an agent stopped, ufw re-enabled, ib0 down, MinIO's
root key changed. The failing cells must be exactly the ones those breakages explain; a deploy
then repairs all four and verify is green again.
"""

import pytest

from .conftest import failing_cells, run_verify


@pytest.fixture
def broken(deployed, lab, lab_ssh, deploy):
    agent_stopped, ufw_on, ib_down = (n.hostname for n in lab.agents[::-1][:3])
    master = lab.master_node.hostname
    lab_ssh(agent_stopped, "systemctl stop 'determined-agent*'")
    lab_ssh(
        ufw_on,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q ufw >/dev/null && "
        "ufw allow 22/tcp >/dev/null && ufw --force enable",
    )
    lab_ssh(ib_down, f"ip link set {lab.network.ipoib.interface} down")
    # A new root password, as if someone rotated it on the server only.
    lab_ssh(
        master,
        "sed -i 's/^MINIO_ROOT_PASSWORD=.*/MINIO_ROOT_PASSWORD=Rotated0nServer/' "
        "/etc/default/minio && systemctl restart minio",
    )
    yield {"agent_stopped": agent_stopped, "ufw_on": ufw_on, "ib_down": ib_down, "master": master}
    repair = deploy()
    assert repair.returncode == 0, repair.stderr[-3000:]


def expected_cells(lab, b) -> set[str]:
    ib_down = b["ib_down"]
    cells = {
        # the stopped agent
        f"test_determined::test_agent_service[{b['agent_stopped']}]",
        f"test_determined::test_agent_registered_with_its_slots[{b['agent_stopped']}]",
        f"test_topology_agents::test_agents_registered_with_domain_slots[{b['agent_stopped']}]",
        f"test_topology_agents::test_agent_units_match_layout[{b['agent_stopped']}]",
        # ufw back on
        f"test_node_base::test_no_firewall_rules[{b['ufw_on']}]",
        f"test_node_base::test_ufw_disabled[{b['ufw_on']}]",
        # ib0 down: the node's own checks, and the fabric, blamed on it by majority (its peers
        # reach each other: their cells stay ok)
        f"test_node_base::test_ipoib_interface_static_and_up[{ib_down}]",
        f"test_gpu_stack::test_ib_ports_active[{ib_down}]",
        f"test_health::test_ib_ports_rate_and_width[{ib_down}]",  # its port is Down
        f"test_cross_node::test_reaches_peer_on_ipoib[{ib_down}]",
        # MinIO no longer takes the root key cluster.yaml has: what the deploy does with it
        # (the bucket, the Determined user and its policy through the admin API) fails ...
        "test_storage::test_bucket_exists_in_region",
        "test_storage::test_determined_user_and_policy_as_deployed",
        # ... while the master, the backups and the trials sign with their own scoped user,
        # which rotating the root password leaves alone: their cells stay ok.
    }
    return cells


def test_each_breakage_turns_exactly_its_cells_red(broken, lab, tmp_path):
    junit = tmp_path / "verify.xml"
    matrix_md = tmp_path / "matrix.md"
    result = run_verify(
        "-n", "4", "-p", "tests.verify.matrix", f"--junitxml={junit}", f"--verify-matrix={matrix_md}"
    )
    assert result.returncode != 0
    assert failing_cells(junit) == expected_cells(lab, broken), result.stdout[-5000:]
    # the matrix names the symptom and the first thing to do for each
    matrix = matrix_md.read_text()
    for hint in ("ufw", "ibstat", "refuses cluster.yaml's root keys", "journalctl -u determined-agent"):
        assert hint in matrix, hint


def test_green_after_the_deploy_repaired_them(deployed):
    # The `broken` fixture's teardown re-deployed; that must have repaired all four.
    result = run_verify("-n", "4")
    assert result.returncode == 0, result.stdout[-5000:]
