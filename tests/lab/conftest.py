"""Lab fixtures: one lab per test session, pyinfra and testinfra against it over SSH."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from .paths import DEFAULT_CLUSTER, REPO

# DTLAB_CLUSTER runs the lab tests on another lab (its own cluster.yaml, subnet, hostnames).
LAB_CLUSTER = Path(os.environ.get("DTLAB_CLUSTER", DEFAULT_CLUSTER))


def _inventory_for(cluster: Path) -> Path:
    if cluster == DEFAULT_CLUSTER:
        return REPO / "inventories" / "lab.py"
    inventory = cluster.with_name("inventory_dtlab.py")
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(cluster)!r}))\n")
    return inventory


LAB_INVENTORY = _inventory_for(LAB_CLUSTER)
# The pyinfra of the interpreter running the tests (the project's .venv in CI).
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.lab)


@dataclass
class DeployRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def results(self) -> dict:
        return json.loads(self.stdout)["results"] if self.stdout.strip() else {}

    def changes_by_host(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.results.get("operations", []):
            for hostname in op["success"]:
                counts[hostname] = counts.get(hostname, 0) + 1
        return counts

    def changed_operations(self) -> list[str]:
        return [
            f"{op['name']} on {', '.join(op['success'])}"
            for op in self.results.get("operations", [])
            if op["success"]
        ]


def run_deploy(inventory=LAB_INVENTORY, limit=None, args=(), timeout=3600) -> DeployRun:
    argv = [PYINFRA, "-y", "--json", str(inventory), "deploy.py", *args]
    if limit:
        argv[1:1] = ["--limit", limit]
    proc = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return DeployRun(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    from deploy.cluster import load_cluster

    from . import lifecycle

    lifecycle.up(LAB_CLUSTER)
    yield load_cluster(LAB_CLUSTER)
    if not os.environ.get("DTLAB_KEEP"):
        lifecycle.down(LAB_CLUSTER)


@pytest.fixture(scope="session")
def deploy(lab):
    return run_deploy


@pytest.fixture(scope="session")
def deployed(lab):
    """The lab after one full deploy (first use in a session pays for it)."""
    run = run_deploy()
    assert run.returncode == 0, run.stderr[-4000:]
    return run


@pytest.fixture(scope="session")
def lab_ssh(lab):
    """Run a shell command on a lab node as root; returns CompletedProcess."""
    from . import nodes
    from .spec import load_spec

    spec = load_spec(LAB_CLUSTER)

    def ssh(hostname: str, command: str, check: bool = True, timeout: float = 300):
        proc = subprocess.run(
            nodes.ssh_argv(spec, spec.node(hostname), command),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{hostname}: {command}: {proc.stderr or proc.stdout}")
        return proc

    return ssh


def run_verify(*args, cluster=LAB_CLUSTER, smoke=False) -> subprocess.CompletedProcess:
    """verify's checks on the lab; without its smoke experiment unless `smoke` (its own lab test,
    tests/lab/test_smoke_lab.py: the other tests' expected cells and times stay theirs)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/verify",
            "--cluster",
            str(cluster),
            *([] if smoke else ["--no-smoke"]),
            # Each node's checks on one worker, as verify's front door runs them
            # (tests/verify/__main__.py): its trial-container checks share one container.
            *(["--dist", "loadgroup"] if "-n" in args else []),
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def failing_cells(junit_path) -> set[str]:
    """The verify cells ("module::test[node]") a JUnit report of `run_verify` marks failed or
    errored: what the lab tests that break something on purpose compare with what they broke.
    Under --dist loadgroup a test's name ends with "@<xdist group>": dropped."""
    cells = set()
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname").rsplit(".", 1)[-1]
            cells.add(f"{module}::{case.get('name').split('@', 1)[0]}")
    return cells
