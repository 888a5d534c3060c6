"""python -m deploy: every verb listed, each handing its module the right argv, inventories derived
from --cluster, bad input one line; verify's reports outside the checkout, its first line the
cluster file. Nothing here runs pytest on nodes or pyinfra against a host."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import deploy.cluster.cli
import deploy.experiment.__main__
import deploy.rebuild
import deploy.shards
import deploy.short_yaml
import tests.verify.__main__ as verify_main
from deploy import cli, inventory, state
from tests.unit.test_cluster import lab_copy
from tests.unit.test_inventory import NO_REAL_HOSTS, PYINFRA

REPO = Path(__file__).resolve().parents[2]
VERBS = ["check", "verify", "rebuild", "shards", "experiment", "short-yaml", "restore-drill"]
BROKEN = REPO / "tests" / "unit" / "broken" / "syntax-error.yaml"


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    """Generated inventories and reports go to the test's own directory, never the user's."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home / "gpu-cluster"


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def recorder(monkeypatch, module, status: int = 0) -> list:
    """Replace `module.main`; the calls it gets: (argv, keyword arguments)."""
    calls: list = []

    def main(argv=None, **kwargs):
        calls.append((argv, kwargs))
        return status

    monkeypatch.setattr(module, "main", main)
    return calls


# --- the listing -------------------------------------------------------------------------------


def test_help_lists_every_verb_on_one_line():
    result = run("-m", "deploy", "--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    listed = [line.split()[0] for line in lines[lines.index("verbs:") + 1 :] if line.startswith("  ")]
    assert listed[: len(VERBS)] == VERBS
    for verb in VERBS:
        (line,) = [line for line in lines if line.startswith(f"  {verb} ")]
        assert line == f"  {verb:<15}{cli.HELP[verb]}" and len(line) <= 80


def test_no_verb_or_an_unknown_one_is_a_usage_error(capsys):
    for argv in ([], ["frob", "--cluster", "x"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "required: VERB" in err and "invalid choice: 'frob'" in err


# --- check, as an operator runs it --------------------------------------------------------------


def test_check_on_the_lab_file(tmp_path):
    """The lab's cluster.yaml, its secrets and CA moved into tmp_path (tests/unit/labfiles.py:
    a unit test never reads a running lab's state)."""
    path, _ = lab_copy(tmp_path)
    result = run("-m", "deploy", "check", "--cluster", str(path))
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{path}: ok (4 nodes)\n", "")


def test_check_on_a_broken_file_is_one_line():
    shown = BROKEN.relative_to(REPO)
    result = run("-m", "deploy", "check", "--cluster", str(shown))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{shown}:21: YAML syntax error: expected ',' or '}}', but got '<scalar>' (column 3)"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--cluster", "FILE"],
        ["short-yaml", "--cluster", "FILE"],
        ["rebuild", "--cluster", "FILE", "lab-gpu1"],
        ["shards", "--cluster", "FILE"],
        ["verify", "--cluster", "FILE"],
        ["experiment", "new", "--cluster", "FILE"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_missing_cluster_file_is_one_line_and_exit_2(argv, tmp_path, capsys, private_state):
    missing = tmp_path / "nowhere" / "cluster.yaml"
    assert cli.main([str(missing) if a == "FILE" else a for a in argv]) == 2
    out = capsys.readouterr()
    assert len(out.err.splitlines()) == 1 and str(missing) in out.err and "Traceback" not in out.err
    # verify's first line names the file; nothing else on stdout, and no inventory generated.
    assert out.out in ("", f"verify: cluster {missing}\n")
    assert not (private_state / "inventories").exists()


def test_a_broken_file_through_rebuild_is_its_problems_not_a_traceback(capsys):
    """Where the inventory reads the file (rebuild, shards): deploy.inventory's lines, exit 2."""
    with pytest.raises(SystemExit) as e:
        cli.main(["rebuild", "--cluster", str(BROKEN), "m1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-2].startswith(f"{BROKEN}:21: YAML syntax error")
    assert err[-1] == f"{BROKEN}: 1 problem(s); stopped before connecting to any host"


# --- each verb's module and argv ---------------------------------------------------------------


def test_check_and_short_yaml_dispatch(monkeypatch):
    check = recorder(monkeypatch, deploy.cluster.cli)
    short = recorder(monkeypatch, deploy.short_yaml)
    lab = "inventories/lab/cluster.yaml"
    monkeypatch.chdir(REPO)
    assert cli.main(["check", "--cluster", lab]) == 0
    assert cli.main(["short-yaml", "--cluster", lab]) == 0
    assert check == [(["check", lab], {})]
    assert short == [([lab], {"prog": "python -m deploy short-yaml"})]


def test_check_takes_nothing_else(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["check", "--cluster", "inventories/lab/cluster.yaml", "-v"])
    assert e.value.code == 2 and "unrecognized arguments: -v" in capsys.readouterr().err


def test_verify_and_experiment_get_their_arguments_untouched(monkeypatch):
    verify = recorder(monkeypatch, verify_main)
    experiment = recorder(monkeypatch, deploy.experiment.__main__, status=1)
    argv = ["--cluster", "c.yaml", "--reports", "r", "-n", "8", "-k", "gpu_stack", "--", "-x"]
    assert cli.main(["verify", *argv]) == 0
    assert verify == [(argv, {"prog": "python -m deploy verify", "require_cluster": True})]
    lint = ["lint", "--strict", "--cluster", "c.yaml", "exp.yaml", "model"]
    assert cli.main(["experiment", *lint]) == 1
    assert experiment == [(lint, {"prog": "python -m deploy experiment"})]


def test_rebuild_uses_the_inventory_beside_the_cluster_file(monkeypatch, capsys, private_state):
    calls = recorder(monkeypatch, deploy.rebuild)
    monkeypatch.chdir(REPO)
    lab = "inventories/lab/cluster.yaml"
    assert cli.main(["rebuild", "--cluster", lab, "lab-gpu1", "--timeout", "30", "-v", "--data", "k=v"]) == 0
    assert calls == [
        (
            ["inventories/lab.py", "lab-gpu1", "--timeout", "30.0", "-v", "--data", "k=v"],
            {"prog": "python -m deploy rebuild", "cluster_args": ["--cluster", lab]},
        )
    ]
    assert capsys.readouterr().err == ""  # nothing generated, nothing to say
    assert not (private_state / "inventories").exists()


def test_restore_drill_runs_pg_backup_on_the_master_through_pyinfra_exec(monkeypatch, capsys, tmp_path):
    import deploy.restore_drill

    ran = []
    monkeypatch.setattr(
        deploy.restore_drill.subprocess,
        "run",
        lambda argv, **kw: ran.append((argv, kw)) or subprocess.CompletedProcess(argv, 0),
    )
    monkeypatch.chdir(REPO)
    lab = "inventories/lab/cluster.yaml"
    assert cli.main(["restore-drill", "--cluster", lab, "-v"]) == 0
    assert cli.main(["restore-drill", "--cluster", lab, "--backup-first"]) == 0
    (first, kw), (second, _) = ran
    exe = deploy.rebuild.pyinfra_executable()
    master = "lab-master"  # cluster.yaml's master_host
    assert first == [exe, "-y", "inventories/lab.py", "--limit", master, "-v", "exec", "--"] + [
        "/usr/local/sbin/pg-backup", "drill", "latest",
    ]  # fmt: skip
    assert kw["cwd"] == REPO and kw["stdin"] == subprocess.DEVNULL
    assert second[-4:] == [
        "--", "sh", "-c",
        "/usr/local/sbin/pg-backup backup --reason drill && /usr/local/sbin/pg-backup drill latest",
    ]  # fmt: skip
    assert f"--> restore-drill: on {master}:" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("master_host: m1\nnodes: 3\n")
    assert deploy.restore_drill.main("inv.py", str(bad), False, []) == 2
    assert len(ran) == 2 and capsys.readouterr().err.startswith(str(bad))


def test_shards_generates_an_inventory_where_none_is_beside(monkeypatch, tmp_path, capsys, private_state):
    calls = recorder(monkeypatch, deploy.shards)
    cluster = tmp_path / "h4.yaml"
    cluster.write_text("master_host: m1\n")  # read by the generated inventory, not here
    argv = ["--cluster", str(cluster), "--shards", "3", "--limit", "agents", "-v"]
    assert cli.main(["shards", *argv]) == 0
    generated = inventory.generated_inventory_path(cluster)
    assert generated.parent == private_state / "inventories" and generated.name.startswith("h4-")
    assert calls == [
        (
            ["--shards", "3", str(generated), "--limit", "agents", "-v"],
            {"prog": "python -m deploy shards", "shown_argv": argv},
        )
    ]
    assert capsys.readouterr().err == (
        f"--> python -m deploy: no inventory module beside {cluster}: using {generated} (generated)\n"
    )


def test_an_unknown_node_is_one_line_through_the_generated_inventory(tmp_path, capsys):
    """The real rebuild.main on a generated inventory (run with runpy, as rebuild reads it)."""
    cluster, _ = lab_copy(tmp_path)
    assert cli.main(["rebuild", "--cluster", str(cluster), "gpu-node99"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"python -m deploy rebuild: gpu-node99: not a node of {cluster} "
        "(lab-master, lab-gpu1, lab-gpu2, lab-gpu3)"
    )
    assert len(err) == 2 and "(generated)" in err[0]  # the notice, then the one line


def test_a_failed_rebuild_says_to_run_the_front_door_again(monkeypatch, tmp_path, capsys):
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text("")
    # No agent role: the master is not asked.
    node = SimpleNamespace(hostname="gpu-node1", roles=("storage",), agent_layout="per_node")
    cluster = SimpleNamespace(node=lambda name: node, nodes=[node], path=cluster_file)
    monkeypatch.setattr(deploy.rebuild, "cluster_of", lambda path: cluster)
    monkeypatch.setattr(deploy.rebuild, "Master", lambda c: None)
    monkeypatch.setattr(deploy.rebuild.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=1))
    argv = ["rebuild", "--cluster", str(cluster_file), "gpu-node1", "--password", "hunter2"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"re-run: python -m deploy rebuild --cluster {cluster_file} gpu-node1\n" in err
    assert "--password <hidden>" in err and "hunter2" not in err


def test_shards_repeats_the_front_door_for_hosts_phase_one_kept_back():
    lines = deploy.shards.merged_lines(
        [], ["g5"], ["--cluster", "c.yaml", "--password", "hunter2"], ("python", "-m", "deploy", "shards")
    )
    assert lines[-1] == "      re-run: python -m deploy shards --cluster c.yaml --password '<hidden>'"


# --- inventory derivation ----------------------------------------------------------------------


@pytest.mark.parametrize("env", ["lab", "prod"])
def test_the_repositorys_inventories_are_the_siblings(env):
    assert inventory.inventory_for(REPO / "inventories" / env / "cluster.yaml") == (
        REPO / "inventories" / f"{env}.py",
        False,
    )


def test_a_python_file_that_is_no_inventory_is_not_taken(tmp_path):
    (tmp_path / "site").mkdir()
    cluster = tmp_path / "site" / "cluster.yaml"
    cluster.write_text("")
    (tmp_path / "site.py").write_text("print('not an inventory')\n")
    assert inventory.sibling_inventory(cluster) is None
    assert inventory.sibling_inventory(tmp_path / "site.yaml") is None  # not named cluster.yaml


def test_the_generated_inventory_is_private_and_names_the_file(tmp_path, private_state):
    cluster = tmp_path / "odd name" / "cluster.yaml"
    cluster.parent.mkdir()
    cluster.write_text("")
    path, generated = inventory.inventory_for(cluster)
    assert generated and path.parent == private_state / "inventories"
    assert path.name.startswith("odd_name-")  # the directory's name, made a file name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    assert f"globals().update(groups({str(cluster)!r}))" in text
    assert f"_root = {str(REPO)!r}" in text
    # Another file of the same name elsewhere gets its own; the same file the same one again.
    other = tmp_path / "x" / "odd name" / "cluster.yaml"
    assert inventory.generated_inventory_path(other) != path
    assert inventory.inventory_for(cluster) == (path, True)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_a_directory_loosened_by_hand_is_made_private_again(tmp_path, private_state):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("")
    (private_state / "inventories").mkdir(parents=True)
    (private_state / "inventories").chmod(0o777)
    path, _ = inventory.inventory_for(cluster)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_path_with_a_newline_stays_inside_the_strings(tmp_path):
    """The cluster path is written into code pyinfra executes: repr(), never raw."""
    cluster = tmp_path / "a\nimport os; os.system('x')\n" / "cluster.yaml"
    cluster.parent.mkdir()
    cluster.write_text("")
    path, _ = inventory.inventory_for(cluster)
    compile(path.read_text(), str(path), "exec")
    assert "\nimport os" not in path.read_text()


def test_pyinfra_reads_the_generated_inventory_from_another_directory(tmp_path):
    """pyinfra run outside the checkout, without PYTHONPATH: the generated module finds deploy/
    by its own sys.path line and gives pyinfra the cluster's groups (debug-inventory: no host
    is connected to)."""
    cluster, values = lab_copy(tmp_path)
    named = tmp_path / "lab-copy.yaml"
    cluster.rename(named)
    path, generated = inventory.inventory_for(named)
    assert generated
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [*PYINFRA, str(path), "debug-inventory", *NO_REAL_HOSTS],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[lab-master]" in output and "--> Groups: agents" in output
    for value in values.values():
        assert value not in output


# --- verify: its reports and its first line -----------------------------------------------------


def test_the_reports_default_is_outside_the_checkout(tmp_path, monkeypatch):
    lab = REPO / "inventories" / "lab" / "cluster.yaml"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state.reports_dir(lab) == tmp_path / "xdg" / "gpu-cluster" / "reports" / "lab"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert (
        state.reports_dir(lab) == tmp_path / "home" / ".local" / "state" / "gpu-cluster" / "reports" / "lab"
    )
    monkeypatch.setenv("XDG_STATE_HOME", "relative/dir")  # not absolute: ignored, as the spec says
    assert state.reports_dir("/root/h4.yaml") == tmp_path / "home" / ".local/state/gpu-cluster/reports/h4"
    assert REPO not in state.reports_dir(lab).parents


@pytest.fixture
def no_pytest(monkeypatch):
    """verify's pytest run, recorded instead of run."""
    commands: list = []

    def call(command, cwd=None):
        commands.append((command, cwd))
        return 0

    monkeypatch.setattr(verify_main.subprocess, "call", call)
    return commands


def test_verify_prints_the_cluster_first_and_reports_outside_the_checkout(
    tmp_path, capsys, no_pytest, private_state
):
    cluster, _ = lab_copy(tmp_path)
    assert cli.main(["verify", "--cluster", str(cluster), "-k", "gpu_stack"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"verify: cluster {cluster}"
    assert out[1].startswith("verify: smoke experiment ON")
    reports = private_state / "reports" / state.cluster_name(cluster)
    assert reports.is_dir() and REPO not in reports.parents
    assert out[-1].startswith(f"verify {cluster}: all checks passed;")
    assert out[-1].endswith(f"matrix: {reports / 'verify-matrix.md'}")
    ((command, cwd),) = no_pytest
    assert cwd == verify_main.REPO
    assert f"--verify-matrix={reports / 'verify-matrix.md'}" in command
    assert f"--junitxml={reports / 'verify-junit.xml'}" in command
    assert f"--drain-log={reports / 'drain.log'}" in command
    assert command[command.index("--cluster") + 1] == str(cluster)
    assert command[-2:] == ["-k", "gpu_stack"]


def test_verify_reports_option(tmp_path, capsys, no_pytest, monkeypatch):
    cluster, _ = lab_copy(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert verify_main.main(["--cluster", str(cluster), "--reports", "out", "--drain-log=mine.log"]) == 0
    ((command, _),) = no_pytest
    assert f"--verify-matrix={tmp_path / 'out' / 'verify-matrix.md'}" in command  # from where typed
    assert command[-1] == "--drain-log=mine.log"  # after verify's own: the user's wins
    assert (tmp_path / "out").is_dir()


def test_the_alias_names_the_lab_default_and_the_front_door_has_none(
    tmp_path, capsys, no_pytest, monkeypatch
):
    cluster, _ = lab_copy(tmp_path)
    monkeypatch.setattr(verify_main, "LAB_CLUSTER", cluster)  # the lab's file, its secrets here
    assert verify_main.main([]) == 0
    assert (
        capsys.readouterr().out.splitlines()[0]
        == f"verify: cluster {cluster} (no --cluster given: the lab's)"
    )
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "-k", "smoke"])
    assert e.value.code == 2
    assert "required: --cluster" in capsys.readouterr().err
    assert len(no_pytest) == 1


def test_verify_stops_on_a_broken_file_before_pytest(capsys, no_pytest):
    assert cli.main(["verify", "--cluster", str(BROKEN)]) == 2
    out = capsys.readouterr()
    assert out.out == f"verify: cluster {BROKEN}\n"
    assert out.err.splitlines() == [
        f"{BROKEN}:21: YAML syntax error: expected ',' or '}}', but got '<scalar>' (column 3)"
    ]
    assert no_pytest == []


def test_verify_refuses_showlocals_after_naming_the_cluster(capsys, no_pytest):
    assert cli.main(["verify", "--cluster", str(BROKEN), "-l"]) == 2
    out = capsys.readouterr()
    assert out.out == f"verify: cluster {BROKEN}\n"
    assert out.err.startswith("python -m deploy verify: -l/--showlocals") and no_pytest == []


# --- the old commands: aliases for one release --------------------------------------------------


@pytest.mark.parametrize(
    "module, args, status",
    [
        ("deploy.rebuild", ["--help"], 0),
        ("deploy.shards", ["--help"], 0),
        ("deploy.experiment", ["--help"], 0),
        ("tests.verify", ["--help"], 0),
        ("deploy.cluster", [], 2),  # no --help: their usage line
        ("deploy.article", [], 2),
    ],
)
def test_the_old_commands_still_answer(module, args, status):
    result = run("-m", module, *args)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    assert ("usage:" in result.stdout) if status == 0 else ("usage:" in result.stderr)
    # Each says, first, which command replaces it (stderr: its own output is unchanged).
    note = result.stderr.splitlines()[0]
    assert note.startswith(f"note: `python -m {module}") and "use `python -m deploy " in note, note
