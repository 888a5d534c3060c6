"""python -m deploy.shards: the split, the order, the merged summary and the exit status."""

import json
import sys
from types import SimpleNamespace

import pytest

from deploy import shards, summary
from deploy.shards import Outcome, Shard, ShardError, merged_lines, parse_pyinfra_args, plan, split

GROUPS = {
    "master": ["m1"],
    "storage": ["s1"],
    "agents": [f"g{i}" for i in range(1, 8)],
}


def test_split_is_contiguous_balanced_and_never_empty():
    hosts = [f"h{i}" for i in range(7)]
    assert split(hosts, 3) == [["h0", "h1", "h2"], ["h3", "h4"], ["h5", "h6"]]
    assert split(hosts, 1) == [hosts]
    assert split(hosts[:2], 8) == [["h0"], ["h1"]]  # never more shards than hosts
    assert split([], 4) == []
    for n in range(1, 10):
        parts = split(hosts, n)
        assert sum(parts, []) == hosts
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_master_and_storage_first_then_the_agents_in_shards():
    phase1, phase2 = plan(GROUPS, 3, [], [])
    assert phase1 == Shard("master+storage", ("m1", "s1"))
    assert [s.hosts for s in phase2] == [("g1", "g2", "g3"), ("g4", "g5"), ("g6", "g7")]
    assert [s.label for s in phase2] == ["shard 1/3", "shard 2/3", "shard 3/3"]
    # A node that is master and agent is deployed in phase 1 only, once.
    both = {"master": ["m1"], "storage": ["m1"], "agents": ["m1", "g1"]}
    phase1, phase2 = plan(both, 2, [], [])
    assert phase1 is not None and phase1.hosts == ("m1",)
    assert [s.hosts for s in phase2] == [("g1",)]


def test_limit_and_exclude_select_like_pyinfra_before_the_split():
    phase1, phase2 = plan(GROUPS, 2, ["agents"], ["g7"])
    assert phase1 is None
    assert [s.hosts for s in phase2] == [("g1", "g2", "g3"), ("g4", "g5", "g6")]
    phase1, phase2 = plan(GROUPS, 2, ["m*", "g1"], [])
    assert phase1 is not None and phase1.hosts == ("m1",)
    assert [s.hosts for s in phase2] == [("g1",)]
    with pytest.raises(ShardError, match="no host matches"):
        plan(GROUPS, 2, ["nope"], [])


def test_pyinfra_args_pass_through_minus_selection_and_prompts():
    options, limit, exclude = parse_pyinfra_args(
        ["--limit", "agents", "--exclude=g2", "-y", "--debug", "--data", "x=1", "deploy.py"]
    )
    assert (options, limit, exclude) == (["--debug", "--data", "x=1"], ["agents"], ["g2"])
    for refused in ("--ssh-password-prompt", "--use-sudo-password", "--json"):
        with pytest.raises(ShardError, match=refused):
            parse_pyinfra_args([refused])
    with pytest.raises(ShardError, match="needs a value"):
        parse_pyinfra_args(["--limit"])
    argv = shards.pyinfra_argv("inv.py", ["--debug"], ("g1", "g2"))
    assert argv[1:] == [
        "-m",
        "pyinfra",
        "-y",
        "--debug",
        "inv.py",
        "deploy.py",
        "--limit",
        "g1",
        "--limit",
        "g2",
    ]


def outcome(label, hosts, rc, failed=None, rerun=None, last=""):
    plain = ["pyinfra", "-y", "inv.py", "deploy.py"]
    return Outcome(Shard(label, hosts), plain, rc, failed or {}, rerun or {}, last)


def test_one_merged_summary_in_the_plain_deploys_format():
    outcomes = [
        outcome("master+storage", ("m1",), 0),
        outcome(
            "shard 1/2",
            ("g1", "g2"),
            1,
            {"g2": "unreachable: SSH connection failed"},
            {"g2": "pyinfra -y inv.py deploy.py --limit g2"},
        ),
        # Every host of this process failed: pyinfra stopped with "No hosts remaining!"; its
        # summary file still names the host (written at exit).
        outcome(
            "shard 2/2",
            ("g3",),
            1,
            {"g3": "failed at 'X': boom"},
            {"g3": "pyinfra -y inv.py deploy.py --limit g3"},
        ),
    ]
    assert merged_lines(outcomes, [], ["inv.py"]) == [
        "--> 2 host(s) failed; the others finished:",
        "    g2: unreachable: SSH connection failed",
        "      re-run: pyinfra -y inv.py deploy.py --limit g2",
        "    g3: failed at 'X': boom",
        "      re-run: pyinfra -y inv.py deploy.py --limit g3",
    ]
    assert merged_lines([outcome("shard 1/1", ("g1",), 0)], [], ["inv.py"]) == []


def test_a_process_that_named_nobody_has_each_of_its_hosts_named():
    lines = merged_lines(
        [outcome("shard 1/1", ("g1", "g2"), 1, last="--> pyinfra error: boom")],
        ["g5"],
        ["--shards", "2", "inv.py", "--password", "hunter2"],
    )
    assert lines[0] == "--> 2 host(s) failed; the others finished:"
    assert (
        "    g1: its pyinfra process (shard 1/1) exited 1 without naming a failed host: "
        "--> pyinfra error: boom" in lines
    )
    assert "      re-run: pyinfra -y inv.py deploy.py --limit g2" in lines
    assert lines[-2] == "--> 1 host(s) not deployed, phase 1 stopped: g5"
    assert lines[-1] == "      re-run: python -m deploy.shards --shards 2 inv.py --password '<hidden>'"


def test_a_host_that_never_connected_is_named_unreachable(tmp_path):
    """pyinfra connects before it loads deploy.py: a process whose every host failed to connect
    stops ("No hosts remaining!") before the summary exists; its output names them."""
    lines = [
        "--> Connecting to hosts...",
        "    [g3]   \x1b[31mCould not connect ([Errno None] Unable to connect to port 22 on 10.0.0.3)\x1b[0m",
        "--> pyinfra error: No hosts remaining!",
    ]
    o = shards.outcome(
        Shard("shard 2/2", ("g3",)), ["pyinfra", "inv.py", "deploy.py"], 1, tmp_path / "none", lines
    )
    assert o.failed == {"g3": "unreachable: SSH connection failed"}
    assert o.rerun == {"g3": "pyinfra inv.py deploy.py --limit g3"}
    assert o.last_line == "--> pyinfra error: No hosts remaining!"


def test_the_summary_file_replaces_the_printed_summary(tmp_path, monkeypatch, capsys):
    from pyinfra.api.state import StateStage

    class Host(SimpleNamespace):
        __hash__ = object.__hash__

    a, b, c = Host(name="a"), Host(name="b"), Host(name="c")
    path = tmp_path / "s.json"
    monkeypatch.setenv(summary.SUMMARY_FILE_ENV, str(path))
    monkeypatch.setattr(sys, "argv", ["/v/pyinfra/__main__.py", "-y", "inv.py", "deploy.py", "--limit", "a"])
    state = SimpleNamespace(current_stage=StateStage.Disconnect, activated_hosts={a, b}, failed_hosts={b, c})
    handler = summary.FailureSummary()
    handler.reasons["b"] = "failed at 'X'"
    for h in (a, b):
        handler.host_disconnect(state, h)
    assert capsys.readouterr().err == ""
    assert json.loads(path.read_text()) == {
        "failed": {"b": "failed at 'X'", "c": "unreachable: SSH connection failed"},
        "rerun": {
            "b": "pyinfra -y inv.py deploy.py --limit b",
            "c": "pyinfra -y inv.py deploy.py --limit c",
        },
    }


def test_a_run_where_every_host_failed_still_has_its_summary(monkeypatch, capsys):
    """pyinfra raises "No hosts remaining!" before the final disconnects: the summary is
    printed at exit instead (atexit)."""
    from pyinfra.api.state import StateStage

    class Host(SimpleNamespace):
        __hash__ = object.__hash__

    a = Host(name="a")
    monkeypatch.delenv(summary.SUMMARY_FILE_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inv.py", "deploy.py", "--limit", "a"])
    state = SimpleNamespace(current_stage=StateStage.Execute, activated_hosts=set(), failed_hosts={a})
    handler = summary.FailureSummary()
    handler.at_exit(state)
    handler.at_exit(state)
    err = capsys.readouterr().err
    assert err.count("host(s) failed") == 1
    assert "    a: unreachable: SSH connection failed" in err
    # A run that finished well prints nothing at exit.
    quiet = summary.FailureSummary()
    quiet.at_exit(
        SimpleNamespace(current_stage=StateStage.Disconnect, activated_hosts={a}, failed_hosts=set())
    )
    assert capsys.readouterr().err == ""


FAKE_PYINFRA = """
import json, os, sys
limits = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--limit"]
with open(os.environ["ORDER_LOG"], "a") as f:
    f.write(" ".join(limits) + "\\n")
bad = [h for h in limits if h in os.environ.get("FAIL", "").split(",")]
failed = {h: "unreachable: SSH connection failed" for h in bad}
rerun = {h: "pyinfra -y inv.py deploy.py --limit " + h for h in bad}
with open(os.environ["GPU_CLUSTER_SUMMARY_FILE"], "w") as f:
    json.dump({"failed": failed, "rerun": rerun}, f)
print("fake pyinfra on", *limits)
sys.exit(1 if bad else 0)
"""


@pytest.fixture
def fake_pyinfra(tmp_path, monkeypatch):
    script = tmp_path / "fake_pyinfra.py"
    script.write_text(FAKE_PYINFRA)
    inventory = tmp_path / "inv.py"
    inventory.write_text("master = [('m1', {})]\nstorage = [('m1', {})]\nagents = ['g1', 'g2', 'g3']\n")
    order = tmp_path / "order.log"
    monkeypatch.setenv("ORDER_LOG", str(order))

    def argv(inv, options, hosts):
        return [sys.executable, str(script), *options, inv] + [x for h in hosts for x in ("--limit", h)]

    monkeypatch.setattr(shards, "pyinfra_argv", argv)
    return inventory, order


def test_main_runs_phase_one_first_then_the_shards(fake_pyinfra, capsys):
    inventory, order = fake_pyinfra
    assert shards.main(["--shards", "2", str(inventory)]) == 0
    lines = order.read_text().splitlines()
    assert lines[0] == "m1"  # phase 1 alone, before any agent
    assert sorted(lines[1:]) == ["g1 g2", "g3"]
    out = capsys.readouterr()
    assert "[master+storage] fake pyinfra on m1" in out.out
    assert "[shard 2/2] fake pyinfra on g3" in out.out
    assert out.err == ""


def test_main_names_the_failed_host_and_exits_non_zero(fake_pyinfra, monkeypatch, capsys):
    inventory, order = fake_pyinfra
    monkeypatch.setenv("FAIL", "m1,g3")
    assert shards.main(["--shards", "2", str(inventory)]) == 1
    # The master failed on its host: the agents are deployed all the same, as in one process.
    assert len(order.read_text().splitlines()) == 3
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "--> 2 host(s) failed; the others finished:",
        "    g3: unreachable: SSH connection failed",
        "      re-run: pyinfra -y inv.py deploy.py --limit g3",
        "    m1: unreachable: SSH connection failed",
        "      re-run: pyinfra -y inv.py deploy.py --limit m1",
    ]


def test_bad_input_is_one_line_before_any_process(fake_pyinfra, capsys):
    inventory, order = fake_pyinfra
    assert shards.main([str(inventory), "--json"]) == 2
    assert shards.main(["--shards", "0", str(inventory)]) == 2
    assert shards.main(["missing.py"]) == 2
    assert not order.exists()
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "deploy.shards: --json: would print one JSON document per process; run plain pyinfra for this",
        "--shards: 0: must be 1 or more",
        "missing.py: no such inventory file",
    ]


def test_a_file_that_is_no_inventory_module_and_misplaced_options_are_one_line(
    fake_pyinfra, tmp_path, capsys
):
    inventory, order = fake_pyinfra
    yaml_file = tmp_path / "cluster.yaml"
    yaml_file.write_text("nodes:\n  - name: a\n")
    assert shards.main([str(yaml_file)]) == 2
    assert shards.main([str(inventory), "--shards", "4"]) == 2
    assert not order.exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "Traceback" not in "".join(err)
    assert f"{yaml_file}: not a pyinfra inventory module (" in err[0], err[0]
    assert "--shards: give it before INVENTORY" in err[1]


def test_only_the_lines_outcome_reads_are_kept(capsys):
    import io
    import threading

    out = b"a\n    [g3]   Could not connect (refused)\nb\n\nlast\n"
    lines: list[str] = []
    shards._pump(io.BytesIO(out), "shard 1/1", lines, threading.Lock())
    assert lines == ["    [g3]   Could not connect (refused)", "last"]
    assert capsys.readouterr().out.splitlines()[0] == "[shard 1/1] a"
