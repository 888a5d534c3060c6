"""deploy/rolling.py's pure parts: the plan read from pyinfra's own dry-run JSON, the order of
the rollout, the experiments named by the master's allocations, the record a stopped rollout
leaves, and the front door's refusals of bad options (one line, exit 2, no host touched). The
rollout itself runs on the lab (tests/lab/test_smoke_lab.py, the busy-cluster test)."""

from __future__ import annotations

import argparse

import pytest

from deploy import cli, rolling
from deploy.cluster import load_cluster
from tests.lab.paths import REPO

LAB = REPO / "inventories" / "lab" / "cluster.yaml"
MEMLOCK = "Docker and the NVIDIA Container Toolkit | Docker's default ulimits: memlock 4194304 bytes"
DRIVER = "NVIDIA driver | Install the pinned driver packages"


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(LAB, resolve_secrets=False)


def dry(*ops: tuple[str, list[str], list[str]]) -> dict:
    """A payload shaped as pyinfra 3.10's `--dry --json` prints it (pyinfra_cli/prints.py
    build_plan_json)."""
    return {
        "plan": [
            {"name": n, "names": [n], "hosts_with_change": h, "hosts_with_conditional_change": c}
            for n, h, c in ops
        ],
        "results": None,
    }


def test_the_plan_counts_only_unconditional_changes(cluster):
    payload = dry(
        (MEMLOCK, ["lab-gpu1", "lab-gpu3"], []),
        ("Docker and the NVIDIA Container Toolkit | Restart Docker", [], ["lab-gpu1", "lab-gpu3"]),
        (DRIVER, ["lab-gpu3"], []),
        ("Somewhere else | not a node of this cluster", ["other"], []),
    )
    plans = rolling.plan_from_dry_run(payload, cluster)
    assert plans["lab-gpu1"].changes == (MEMLOCK,) and not plans["lab-gpu1"].may_reboot
    assert plans["lab-gpu3"].changes == (MEMLOCK, DRIVER) and plans["lab-gpu3"].may_reboot
    assert plans["lab-master"].changes == () and plans["lab-gpu2"].changes == ()
    assert "other" not in plans


def order(cluster, changed, held=(), canary=None, n=1):
    plans = rolling.plan_from_dry_run(dry(("x | y", list(changed), [])), cluster)
    return [
        [node.hostname for node in batch] for batch in rolling.stages(cluster, plans, list(held), canary, n)
    ]


def test_the_master_goes_first_then_held_nodes_then_the_canary_then_batches(cluster):
    every = ["lab-master", "lab-gpu1", "lab-gpu2", "lab-gpu3"]
    assert order(cluster, every) == [["lab-master"], ["lab-gpu1"], ["lab-gpu2"], ["lab-gpu3"]]
    assert order(cluster, every, n=2) == [["lab-master"], ["lab-gpu1", "lab-gpu2"], ["lab-gpu3"]]
    assert order(cluster, every, canary="lab-gpu3", n=2) == [
        ["lab-master"], ["lab-gpu3"], ["lab-gpu1", "lab-gpu2"]
    ]  # fmt: skip
    # A node a stopped run left disabled comes first, although it has nothing left to change.
    assert order(cluster, ["lab-gpu3"], held=["lab-gpu2"]) == [["lab-gpu2"], ["lab-gpu3"]]
    assert order(cluster, []) == []


def test_experiments_come_from_the_allocation_names():
    names = ("Trial 12 (Experiment 7)", "Trial 13 (Experiment 7)", "Trial 2 (Experiment 10)", "Command x")
    assert rolling.experiments_of(names) == [7, 10]


def test_the_record_of_a_stopped_rollout_survives_a_new_process(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    record = rolling.Record.load(str(LAB))
    assert (record.held, record.paused) == (set(), set())
    record.held.add("lab-gpu2")
    record.paused.add(7)
    record.save()
    again = rolling.Record.load(str(LAB))
    assert (again.held, again.paused) == ({"lab-gpu2"}, {7})
    assert again.path == tmp_path / "gpu-cluster" / "rollout" / "lab.json"
    # The next run takes the held node up again (drain_batch adds it once more); once it is
    # back, it is no longer held: one discard clears it, however often it was added.
    again.held.add("lab-gpu2")
    again.held.discard("lab-gpu2")
    again.save()
    assert rolling.Record.load(str(LAB)).held == set()


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--max-unavailable", "0"], "--max-unavailable 0: must be at least 1"),
        (["--canary", "lab-master"], "--canary lab-master: not an agent node (lab-gpu1, lab-gpu2, lab-gpu3)"),
    ],
)
def test_bad_options_are_one_line_before_any_host(options, said, capsys, monkeypatch):
    monkeypatch.setattr(rolling.Rollout, "run", lambda self: pytest.fail("a host would be touched"))
    assert cli.main(["upgrade", "--cluster", str(LAB), *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"{LAB}: {said}", err


def test_the_resume_command_is_the_one_typed_with_yes(monkeypatch):
    seen = {}

    def main(inventory, args: argparse.Namespace, extra):
        seen["again"], seen["extra"] = args.again, extra
        return 0

    monkeypatch.setattr(rolling, "main", main)
    assert cli.main(["upgrade", "--cluster", str(LAB), "--canary", "lab-gpu2", "-v"]) == 0
    assert seen["again"] == f"python -m deploy upgrade --cluster {LAB} --canary lab-gpu2 -v -y"
    assert seen["extra"] == ["-v"]
