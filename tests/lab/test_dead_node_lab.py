"""verify with one node dead, and with one node cut off the IPoIB fabric: the blame lands on
that node alone (docs/verify.md "Who is to blame").

- One agent powered off (its systemd-nspawn stopped and its cables pulled: the host ends of
  its veths down, so its addresses stop answering ARP the way a server that is off does; with
  the cables in, the namespace would still answer with a refused connect): its column is SSH,
  every other cell green, the cross-node rows of the healthy nodes ok, the cluster-wide agent
  check ok with the dead node named as not asked, and the summary line names it first. It is
  then booted again (it starts its services itself) and verify must be green.
- One node's ib0 down: its own IPoIB cells red (cross-node included, by majority), every
  other node's cross-node cells ok; ib0 back up, verify green.

verify's wall time with and without the dead node is measured by the bench
(`python -m tests.lab.bench`), not asserted here; this test prints both.
"""

import time

import pytest

from . import nodes
from .conftest import LAB_CLUSTER, failing_cells, run_verify
from .spec import load_spec

CROSS = (
    "test_cross_node.py::test_reaches_peer_on_management",
    "test_cross_node.py::test_reaches_peer_on_ipoib",
)


def read_matrix(path) -> dict[tuple[str, str], str]:
    """{(check, node): status} from the Markdown report's "Checks x nodes" table."""
    lines = path.read_text().splitlines()
    start = lines.index("## Checks x nodes")
    header = next(line for line in lines[start:] if line.startswith("| check |"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    cells = {}
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("| `"):
            break
        values = [c.strip().strip("*") for c in line.strip("|").split("|")]
        check = values[0].strip("`")
        cells.update({(check, node): status for node, status in zip(columns, values[1:], strict=True)})
    return cells


def verify(tmp_path, name: str):
    junit, matrix = tmp_path / f"{name}.xml", tmp_path / f"{name}.md"
    started = time.monotonic()
    result = run_verify(
        "-n", "4", "-p", "tests.verify.matrix",
        f"--junitxml={junit}", f"--verify-matrix={matrix}",
    )  # fmt: skip
    wall = time.monotonic() - started
    print(f"verify ({name}): exit {result.returncode}, wall {wall:.1f}s")
    failing = failing_cells(junit)
    return result, read_matrix(matrix), matrix.read_text(), failing


@pytest.fixture(scope="module")
def before(deployed, tmp_path_factory):
    """verify's failing cells before anything is broken: green on a consistent tree (CI); the
    assertions below compare with it, so that a check being written elsewhere that is red
    everywhere does not hide what this test is about."""
    result, _, _, failing = verify(tmp_path_factory.mktemp("before"), "before")
    if result.returncode != 0:
        print(f"note: verify is not green before the test: {sorted(failing)}")
    return failing


def green_again(tmp_path, name: str, before: set[str], attempts: int = 3) -> None:
    """verify as green as before (green on a consistent tree); a node that just booted gets a
    few tries (its agent re-registers)."""
    for _ in range(attempts):
        result, _, _, failing = verify(tmp_path, name)
        if failing <= before:
            return
        time.sleep(10)
    raise AssertionError(
        f"verify not green after {name}: {sorted(failing - before)}\n{result.stdout[-4000:]}"
    )


@pytest.fixture
def powered_off(before, lab, tmp_path):
    spec = load_spec(LAB_CLUSTER)
    victim = spec.node(lab.agents[-1].hostname)
    nodes.stop(victim)
    nodes.pull_cables(victim)
    try:
        yield victim.hostname
    finally:
        nodes.pull_cables(victim, pulled=False)
        nodes.start(spec, victim)
        state = nodes.wait_ready(spec, victim)
    assert state in ("running", "degraded"), state
    green_again(tmp_path, "after-boot", before)


def test_dead_node_is_ssh_and_nobody_else_is_red(powered_off, before, lab, tmp_path):
    dead = powered_off
    result, cells, markdown, failing = verify(tmp_path, "dead")
    assert result.returncode != 0
    # The dead node's column: SSH wherever a check applies; no other column has SSH, nor a
    # FAIL that was not there before.
    for (check, node), status in cells.items():
        if node == dead:
            assert status in ("SSH", "n/a"), (check, status)
        else:
            assert status != "SSH", (check, node, result.stdout[-4000:])
    assert {c for c in failing if not c.endswith(f"[{dead}]")} <= before, sorted(failing - before)
    assert all(cells[check, dead] == "SSH" for check in CROSS)
    assert all(cells[check, n.hostname] == "ok" for check in CROSS for n in lab.nodes if n.hostname != dead)
    # The cluster-wide agent check ran on the others and says whom it could not ask.
    assert cells["test_topology_agents.py::test_no_unexpected_agent_enabled", "(cluster)"] == "ok"
    assert f"test_no_unexpected_agent_enabled ran without {dead}: not asked" in markdown
    # Blame and first step: the peers could not reach it either; the summary names it first.
    assert "none of the 3 nodes that answered reaches it on management" in markdown
    assert "first step: 3 of 4 nodes answered over SSH" in markdown
    summary = result.stdout.strip().splitlines()
    line = next(s for s in summary if "wall time" in s and "unreachable nodes" in s)
    assert line.startswith(f"UNREACHABLE {dead} (SSH to "), line
    assert "first: " in line.split(" -- wall time")[0], line


@pytest.fixture
def ib_down(before, lab, lab_ssh, tmp_path):
    victim = lab.agents[0].hostname
    interface = lab.node(victim).ipoib_interface
    lab_ssh(victim, f"ip link set {interface} down")
    try:
        yield victim
    finally:
        lab_ssh(victim, f"ip link set {interface} up")
    green_again(tmp_path, "ib0-up", before)


def test_node_cut_off_ipoib_is_red_on_its_own_cell(ib_down, before, lab, tmp_path):
    victim = ib_down
    result, cells, markdown, failing = verify(tmp_path, "ib0-down")
    assert result.returncode != 0
    ipoib = "test_cross_node.py::test_reaches_peer_on_ipoib"
    assert cells[ipoib, victim] == "FAIL"
    others = [n.hostname for n in lab.nodes if n.hostname != victim]
    assert all(cells[ipoib, n] == "ok" for n in others), [cells[ipoib, n] for n in others]
    assert all(
        cells["test_cross_node.py::test_reaches_peer_on_management", n.hostname] == "ok" for n in lab.nodes
    )
    # Only the victim's cells turned red, and none is SSH; the majority is said in the cell.
    assert "SSH" not in set(cells.values())
    assert {c for c in failing - before if not c.endswith(f"[{victim}]")} == set(), sorted(failing - before)
    assert {
        f"test_cross_node::test_reaches_peer_on_ipoib[{victim}]",
        f"test_node_base::test_ipoib_interface_static_and_up[{victim}]",
    } <= failing, sorted(failing)
    assert f"{victim} on IPoIB: cut off (majority: the fault is at this end" in markdown
    assert f"none of its {len(others)} peers reach {victim}-" in markdown
