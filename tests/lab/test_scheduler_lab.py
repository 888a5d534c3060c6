"""Checkpoint storage and the scheduler on the lab: MinIO, PostgreSQL, master, Docker, agents.

- a full deploy brings them up and tests/verify's storage and scheduler checks pass;
- a second deploy changes nothing and restarts nothing (MainPID / ActiveEnterTimestamp / NRestarts
  of every service compared before and after);
- a changed input restarts its own service only;
- no secret value appears in pyinfra's output at -vvv --debug, in any node file outside the
  0600 ones, in the journal or in a process command line;
- the database password really opens the database over TCP (SCRAM verifier computed by the
  deploy on the controller).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.lab.paths import REPO

pytestmark = pytest.mark.lab

# The files that may hold a secret, each 0600 root (and nothing else may).
SECRET_FILES = {
    "/etc/default/minio",
    "/etc/determined/master.yaml",
    "/etc/determined/master-s3.env",
    "/etc/pg-backup/s3.env",
}
# Where a leaked secret would land on a node besides the journal and process list.
SEARCHED = (
    "/etc",
    "/var/log",
    "/root",
    "/tmp",
    "/var/tmp",
    "/run",
    "/usr/local",
    "/var/cache/apt/archives",
    "/var/lib/dpkg",
)
PATTERNS = "/root/.scheduler-lab-patterns"  # removed again by every test that writes it


def secrets_of(cluster) -> list[str]:
    return [
        cluster.storage.access_key.value,
        cluster.storage.secret_key.value,
        cluster.storage.determined_secret.value,  # Determined's MinIO user (deploy/minio_admin.py)
        cluster.storage.backup_secret.value,  # pg-backup's MinIO user
        cluster.database.password.value,
        cluster.determined.admin_password.value,
    ]


def run_on(
    cluster, hostname: str, command: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """ssh to a lab node of `cluster` (any lab, not only the default one); stdin carries data
    that must not appear on a command line."""
    from tests.lab import nodes
    from tests.lab.spec import load_spec

    spec = load_spec(cluster.path)
    proc = subprocess.run(
        nodes.ssh_argv(spec, spec.node(hostname), command),
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{hostname}: {command}: {proc.stderr or proc.stdout}")
    return proc


def services(cluster, node) -> list[str]:
    units = []
    if "storage" in node.roles:
        units.append("minio.service")
    if "master" in node.roles:
        major = run_on(cluster, node.hostname, "ls /etc/postgresql").stdout.split()[-1]
        units += [f"postgresql@{major}-main.service", "determined-master.service"]
    if "agent" in node.roles:
        units.append("docker.service")
        if node.agent_layout == "per_domain":  # one agent instance per NVLink domain
            configs = run_on(cluster, node.hostname, "ls /etc/determined").stdout.split()
            units += sorted(
                f"determined-agent@{c[len('agent-') : -len('.yaml')]}.service"
                for c in configs
                if c.startswith("agent-") and c.endswith(".yaml")
            )
        else:
            units.append("determined-agent.service")
    return units


def snapshot(cluster) -> dict[tuple[str, str], str]:
    """(node, unit) -> 'MainPID=..|ActiveEnterTimestamp=..|NRestarts=..|ActiveState=..'."""
    state = {}
    for node in cluster.nodes:
        for unit in services(cluster, node):
            out = run_on(
                cluster,
                node.hostname,
                f"systemctl show -p MainPID -p ActiveState -p ActiveEnterTimestamp -p NRestarts {unit}",
            ).stdout
            state[(node.hostname, unit)] = "|".join(sorted(out.split()))
    return state


def settled(cluster, timeout: float = 60) -> dict[tuple[str, str], str]:
    """snapshot() once every service is active. Agents started before their master (the
    deploy does not order hosts against each other) retry every 5 s until it answers."""
    deadline = time.monotonic() + timeout
    while True:
        state = snapshot(cluster)
        waiting = {k: v for k, v in state.items() if "ActiveState=active" not in v}
        if not waiting:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"not active after {timeout:.0f} s: {waiting}")
        time.sleep(2)


def test_services_up_and_verify_green(deployed, lab):
    settled(lab)
    with urllib.request.urlopen(
        f"http://{lab.master_node.address}:{lab.master_port}/health", timeout=10
    ) as r:
        assert r.status == 200
    verify = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/verify/test_storage.py",
            "tests/verify/test_determined.py",
            "--cluster",
            str(lab.path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout[-6000:]


def test_second_deploy_changes_and_restarts_nothing(deployed, deploy, lab):
    before = settled(lab)
    again = deploy()
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.results["totals"]["success"] == 0, again.changed_operations()
    assert snapshot(lab) == before


def test_changed_minio_settings_restart_minio_only(deployed, deploy, lab):
    storage = lab.storage_node.hostname
    before = settled(lab)
    # Drift on the node: the deploy puts its own file back, and only MinIO restarts for it.
    run_on(lab, storage, "echo '# edited by hand' >> /etc/default/minio")
    run = deploy(limit=storage)
    assert run.returncode == 0, run.stderr[-4000:]
    changed = set(run.changed_operations())
    assert any("MinIO settings and credentials" in op for op in changed), changed
    assert any("Restart MinIO" in op for op in changed), changed
    assert not any("Bucket" in op for op in changed), changed
    after = snapshot(lab)
    assert after[(storage, "minio.service")] != before[(storage, "minio.service")]
    others = {k for k in before if k != (storage, "minio.service")}
    assert {k: after[k] for k in others} == {k: before[k] for k in others}
    assert "# edited by hand" not in run_on(lab, storage, "cat /etc/default/minio").stdout


def test_no_secret_in_output_node_files_journal_or_processes(deployed, deploy, lab):
    secrets = secrets_of(lab)
    run = deploy(args=("-vvv", "--debug"))
    assert run.returncode == 0, run.stderr[-4000:]
    output = run.stdout + run.stderr
    leaked = [i for i, s in enumerate(secrets) if s in output]
    assert leaked == [], f"secret #{leaked} appears in pyinfra's -vvv --debug output"
    debug_log = REPO / "pyinfra-debug.log"
    if debug_log.exists():
        text = debug_log.read_text(errors="replace")
        assert not any(s in text for s in secrets), "a secret appears in pyinfra-debug.log"

    patterns = "\n".join(secrets) + "\n"
    for node in lab.nodes:
        host = node.hostname
        # The patterns travel on stdin into a 0600 file: never on a command line.
        run_on(lab, host, f"umask 077; cat > {PATTERNS}", stdin=patterns)
        try:
            files = run_on(
                lab, host, f"grep -rlsF -f {PATTERNS} {' '.join(SEARCHED)} | grep -vxF {PATTERNS} || true"
            ).stdout.split()
            unexpected = sorted(set(files) - SECRET_FILES)
            assert unexpected == [], f"{host}: secrets in {unexpected}"
            for path in files:
                mode = run_on(lab, host, f"stat -c '%U:%G %a' {shlex.quote(path)}").stdout.strip()
                assert mode == "root:root 600", f"{host}:{path} holds a secret but is {mode}"
            journal = run_on(
                lab, host, f"journalctl --no-pager -o cat | grep -cF -f {PATTERNS} || true"
            ).stdout.strip()
            assert journal == "0", f"{host}: {journal} journal lines hold a secret"
            commands = run_on(
                lab, host, f"ps -eo args | grep -vF {PATTERNS} | grep -cF -f {PATTERNS} || true"
            ).stdout.strip()
            assert commands == "0", f"{host}: a process command line holds a secret"
        finally:
            run_on(lab, host, f"rm -f {PATTERNS}", check=False)


def test_database_password_opens_the_database_over_tcp(deployed, lab):
    master = lab.master_node.hostname
    db = lab.database
    pgpass = f"localhost:{db.port}:{db.name}:{db.user}:{db.password.value}\n"
    path = "/root/.scheduler-lab-pgpass"
    run_on(lab, master, f"umask 077; cat > {path}", stdin=pgpass)
    try:
        login = run_on(
            lab,
            master,
            f"PGPASSFILE={path} psql -X -w -h localhost -p {db.port} "
            f"-U {db.user} -d {db.name} -Atc 'SELECT current_user'",
            check=False,
        )
        assert login.returncode == 0, login.stderr
        assert login.stdout.strip() == db.user
        wrong = run_on(
            lab,
            master,
            f"PGPASSFILE=/dev/null psql -X -w -h localhost -p {db.port} "
            f"-U {db.user} -d {db.name} -Atc 'SELECT 1'",
            check=False,
        )
        assert wrong.returncode != 0
    finally:
        run_on(lab, master, f"rm -f {path}", check=False)
