"""deploy.inventory and the inventory modules, in-process and through pyinfra's own CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cluster import Cluster
from deploy.inventory import groups
from tests.unit.tls_material import ca_pem

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab" / "cluster.yaml"
PROD_ENV = ("DET_MINIO_ACCESS_KEY", "DET_MINIO_SECRET_KEY", "DET_DB_PASSWORD", "DET_ADMIN_PASSWORD")
# pyinfra's console script, run by this interpreter. -P keeps the working directory off the
# front of sys.path, as for the installed `pyinfra` command: there a deploy.py must not
# shadow the deploy package.
PYINFRA = [sys.executable, "-P", "-c", "import sys; from pyinfra_cli.main import main; sys.exit(main())"]

# A deploy that would run a command if pyinfra ever got as far as connecting.
DEPLOY = 'from pyinfra.operations import server\nserver.shell(name="x", commands=["true"])\n'


def lab_copy(directory: Path) -> tuple[Path, list[str]]:
    """The lab's cluster.yaml in `directory`, its secrets in files beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    secrets_dir = directory / "secrets"
    secrets_dir.mkdir()
    values = []
    for name in ("minio_access_key", "minio_secret_key", "db_password", "admin_password"):
        values.append(f"Inv-{name}-S3cret")
        (secrets_dir / name).write_text(values[-1] + "\n")
        (secrets_dir / name).chmod(0o600)  # deploy/secrets.py refuses group/world-readable files
    text = LAB.read_text().replace("/var/lib/dtlab/secrets/", f"{secrets_dir}/")
    # The lab registry's CA exists once the lab is built (tests/lab/registry.py): a stand-in.
    (directory / "ca.crt").write_text(ca_pem())
    text = text.replace("/var/lib/dtlab/registry/ca.crt", str(directory / "ca.crt"))
    path = directory / "cluster.yaml"
    path.write_text(text)
    return path, values


# A safety net for runs that must never connect: had the loader let a bad file through, any
# connection would go to a closed loopback port, never to the file's addresses.
NO_REAL_HOSTS = ["--data", "ssh_hostname=127.0.0.1", "--data", "ssh_port=1"]


def run_pyinfra(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*PYINFRA, *args, "-y"],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_groups_from_the_lab_file(tmp_path):
    path, _ = lab_copy(tmp_path)
    g = groups(path)
    assert set(g) == {"master", "storage", "agents"}
    assert [name for name, _ in g["master"]] == ["lab-master"]
    assert [name for name, _ in g["storage"]] == ["lab-master"]
    assert [name for name, _ in g["agents"]] == ["lab-gpu1", "lab-gpu2", "lab-gpu3"]
    name, data = g["agents"][1]
    assert isinstance(data["cluster"], Cluster)
    assert data["node"] is data["cluster"].node(name)
    assert {k: v for k, v in data.items() if k.startswith("ssh_")} == {
        "ssh_hostname": "10.77.0.12",
        "ssh_user": "root",
        "ssh_port": 22,
        "ssh_key": "/var/lib/dtlab/ssh/id_ed25519",
        "ssh_strict_host_key_checking": "no",
        "ssh_known_hosts_file": "/dev/null",
    }


def test_strict_host_key_checking_and_unset_keys(tmp_path):
    path, _ = lab_copy(tmp_path)
    text = path.read_text()
    for line in ("  key_file: /var/lib/dtlab/ssh/id_ed25519\n", "  known_hosts_file: /dev/null\n"):
        assert line in text
        text = text.replace(line, "")
    path.write_text(text.replace("strict_host_key_checking: false", "strict_host_key_checking: true"))
    _, data = groups(path)["master"][0]
    assert data["ssh_strict_host_key_checking"] == "yes"
    assert "ssh_key" not in data and "ssh_known_hosts_file" not in data


def test_broken_file_exits_2_with_every_problem(tmp_path, capsys):
    path, _ = lab_copy(tmp_path)
    path.write_text(
        path.read_text().replace("slots: 8", "slots: 0", 1).replace("master_port: 23457", "master_port: 0")
    )
    with pytest.raises(SystemExit) as e:
        groups(path)
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [
        f"{path}: master_port: 0: must be an integer from 1 to 65535",
        f"{path}: nodes[1].slots: 0: must be an integer of at least 1",
        f"{path}: 2 problem(s); stopped before connecting to any host",
    ]


# --- through pyinfra 3.10's CLI --------------------------------------------------------------


def test_pyinfra_stops_on_a_broken_file_before_connecting(tmp_path):
    """A copy of inventories/lab.py beside a broken cluster.yaml; addresses are loopback."""
    inventories = tmp_path / "inventories"
    path, _ = lab_copy(inventories / "broken")
    shutil.copy(REPO / "inventories" / "lab.py", inventories / "broken.py")
    text = path.read_text().replace("10.77.0.", "127.77.0.").replace("10.78.0.", "127.78.0.")
    path.write_text(
        text.replace("management: 10.77.0.0/24", "management: 127.77.0.0/24")
        .replace("subnet: 10.78.0.0/24", "subnet: 127.78.0.0/24")
        .replace("ipoib_address: 127.78.0.12", "ipoib_address: 127.77.0.99")
    )
    (tmp_path / "deploy.py").write_text(DEPLOY)

    run = run_pyinfra(
        ["inventories/broken.py", "deploy.py", *NO_REAL_HOSTS], cwd=tmp_path, env={"PYTHONPATH": str(REPO)}
    )
    output = run.stdout + run.stderr
    assert run.returncode == 2, output
    assert (
        "inventories/broken/cluster.yaml: nodes[2].ipoib_address: '127.77.0.99': is inside "
        "network.management (127.77.0.0/24): IPoIB addresses belong to "
        "network.ipoib.subnet"
    ) in run.stderr.splitlines()
    assert "Traceback" not in output
    assert "Connecting" not in output and "Connected" not in output


def test_pyinfra_with_prod_inventory_from_another_directory(tmp_path):
    """The real inventories/prod.py, run from elsewhere: it finds deploy/ by itself and, with
    no secrets in the environment and no pins, refuses before connecting."""
    (tmp_path / "deploy.py").write_text(DEPLOY)
    env = {k: v for k, v in os.environ.items() if k not in PROD_ENV and k != "PYTHONPATH"}
    run = subprocess.run(
        [*PYINFRA, str(REPO / "inventories" / "prod.py"), "deploy.py", "-y", *NO_REAL_HOSTS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 2, output
    problems = [
        line for line in run.stderr.splitlines() if line.startswith(f"{REPO}/inventories/prod/cluster.yaml: ")
    ]
    # 7 pins (2 keyrings, 2 OFED distros), 4 secrets, 6 TLS files, 2 image digests, the summary line
    assert len(problems) == 20
    assert "environment variable DET_ADMIN_PASSWORD is not set" in problems[13]
    assert "Traceback" not in output and "Connecting" not in output


def test_pyinfra_debug_inventory_on_a_valid_file(tmp_path):
    inventories = tmp_path / "inventories"
    _, values = lab_copy(inventories / "lab")
    shutil.copy(REPO / "inventories" / "lab.py", inventories / "lab.py")
    run = run_pyinfra(["inventories/lab.py", "debug-inventory"], cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    output = run.stdout + run.stderr  # pyinfra logs the inventory to stderr
    assert run.returncode == 0, output
    assert "[lab-master]" in output and "--> Groups: master, storage, lab" in output
    assert "--> Groups: agents, lab" in output
    assert '"ssh_hostname": "10.77.0.13"' in output
    for value in values:
        assert value not in output
