"""Day two on the lab: drift seen by a dry run, apt's lock waited for, nodes rebuilt from
blank, an SSH loss mid-run, and no secret anywhere a rebuild prints or leaves behind.

- a dry run (`pyinfra --dry --json`, without -y so pyinfra checks for changes) of a drifted
  node lists exactly the drift as changes, and the real run changes exactly that;
- a dpkg lock held by another process (an fcntl lock, as apt and unattended-upgrades take it)
  is waited for, not failed on;
- `python -m deploy.rebuild` brings a blank GPU node back: verify green, changes only on that
  node, no service elsewhere restarted, MinIO objects intact, its agent registered and enabled;
- the same for the blank master/storage node: the objects on its data disk survive, the
  PostgreSQL metadata does not (docs/operations.md), the agents register again, and nothing
  the -vvv --debug rebuild printed or left on the nodes holds a secret;
- sshd stopped on one node mid-run: the others finish, the exit status is non-zero, and the
  last lines name that node and the command that re-runs it.
The second full deploy changing nothing is tests/lab/test_node_base_lab.py's.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
import time
import uuid

import pytest
from minio import Minio

from deploy.rebuild import Master, MasterError, agents_of

from .conftest import LAB_CLUSTER, LAB_INVENTORY, PYINFRA, DeployRun, run_verify
from .paths import REPO
from .test_scheduler_lab import SEARCHED, SECRET_FILES, run_on, secrets_of

pytestmark = pytest.mark.lab

# Units whose restart would interrupt users; compared before and after a rebuild elsewhere.
UNIT_PATTERNS = (
    "minio.service",
    "postgresql@*.service",
    "determined-master.service",
    "determined-agent*.service",
    "docker.service",
)


def lab_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.lab", "--cluster", str(LAB_CLUSTER), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def rebuild(hostname: str, *pyinfra_args: str) -> DeployRun:
    """The one command an operator runs; --json so the test can read per-host changes."""
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.rebuild", str(LAB_INVENTORY), hostname, "--json", *pyinfra_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return DeployRun(proc.returncode, proc.stdout, proc.stderr)


def expected_units(node) -> list[str]:
    """Patterns that must match at least one active unit on the node."""
    units = []
    if "storage" in node.roles:
        units.append("minio.service")
    if "master" in node.roles:
        units += ["postgresql@*.service", "determined-master.service"]
    if "agent" in node.roles:
        units += ["docker.service", "determined-agent*.service"]
    return units


def unit_states(cluster, node) -> dict[str, str]:
    """Active service units of interest -> 'MainPID=..|ActiveEnterTimestamp=..|NRestarts=..'."""
    patterns = " ".join(shlex.quote(p) for p in UNIT_PATTERNS)
    out = run_on(
        cluster,
        node.hostname,
        f"systemctl list-units --type=service --state=active --plain --no-legend {patterns}"
        " | awk '{print $1}' | xargs -r systemctl show -p Id -p MainPID "
        "-p ActiveEnterTimestamp -p NRestarts",
    ).stdout
    states = {}
    for block in out.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in fields:
            unit = fields.pop("Id")
            states[unit] = "|".join(f"{k}={fields[k]}" for k in sorted(fields))
    return states


def settled_states(cluster, nodes, timeout: float = 90) -> dict[tuple[str, str], str]:
    """unit_states of `nodes` once every expected unit is active (agents retry every 5 s
    while their master is away)."""
    from fnmatch import fnmatch

    deadline = time.monotonic() + timeout
    while True:
        states, missing = {}, []
        for node in nodes:
            found = unit_states(cluster, node)
            missing += [
                f"{node.hostname}:{p}" for p in expected_units(node) if not any(fnmatch(u, p) for u in found)
            ]
            states.update({(node.hostname, u): s for u, s in found.items()})
        if not missing:
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"not active after {timeout:.0f} s: {missing}")
        time.sleep(2)


def minio_client(cluster) -> Minio:
    s = cluster.storage
    return Minio(
        f"{cluster.storage_node.address}:{s.port}",
        access_key=s.access_key.value,
        secret_key=s.secret_key.value,
        secure=False,
        region=s.region,
    )


def put_probe(cluster) -> tuple[str, bytes]:
    name, data = f"day-two/{uuid.uuid4().hex}", uuid.uuid4().bytes * 1000
    minio_client(cluster).put_object(cluster.storage.bucket, name, io.BytesIO(data), len(data))
    return name, data


def get_object(cluster, name: str) -> bytes:
    resp = minio_client(cluster).get_object(cluster.storage.bucket, name)
    try:
        return resp.read()
    finally:
        resp.close()
        resp.release_conn()


def registered(cluster, node) -> list[dict]:
    """The node's agents as the master lists them (connected ones only)."""
    return [a for a in agents_of(node, Master(cluster).agents()) if a.get("addresses")]


def wait_registered(cluster, node, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = registered(cluster, node)
        except MasterError:  # the master may still be starting
            found = []
        if found and all(a["enabled"] for a in found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.hostname}: no enabled agent registered: {found}")
        time.sleep(2)


def assert_blank(cluster, hostname: str) -> None:
    probe = run_on(
        cluster,
        hostname,
        "ls /etc/determined /usr/bin/determined-master "
        "/usr/bin/determined-agent /usr/local/bin/minio 2>/dev/null | wc -l",
    ).stdout
    assert probe.strip() == "0", f"{hostname} is not blank after recreate"


def assert_verify_green() -> None:
    verify = run_verify("-n", "4")
    assert verify.returncode == 0, verify.stdout[-6000:]


# --------------------------------------------------------------------------- dry run


def dry_run(hostname: str) -> dict:
    """`pyinfra --dry --json` without -y: with -y pyinfra skips change detection."""
    proc = subprocess.run(
        [PYINFRA, "--dry", "--json", "--limit", hostname, str(LAB_INVENTORY), "deploy.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def planned(plan: dict, key: str) -> set[str]:
    return {op["name"] for op in plan["plan"] if op[key]}


@pytest.fixture(scope="module")
def drift(deployed, deploy, lab):
    """One agent drifted three ways; its dry-run plan before and after, then the repair run."""
    node = lab.agents[1]
    clean = dry_run(node.hostname)
    other = lab.agents[0]
    # Inside the managed block: another node's address changed by hand.
    run_on(
        lab,
        node.hostname,
        f"sed -i 's/^{other.address}\\t{other.hostname}$/192.0.2.7\\t{other.hostname}/' /etc/hosts",
    )
    run_on(lab, node.hostname, f"grep -q '^192.0.2.7\t{other.hostname}$' /etc/hosts")
    mtu = lab.network.ipoib.mtu
    run_on(lab, node.hostname, f"ip link set {lab.network.ipoib.interface} mtu {mtu - 500}")
    run_on(lab, node.hostname, "apt-mark unhold libnccl2")
    drifted = dry_run(node.hostname)
    repair = deploy(limit=node.hostname)
    return node, clean, drifted, repair


def is_hosts_block(name: str) -> bool:
    return name.startswith("Hosts |") and "block" in name


def is_ib0(name: str) -> bool:
    return name.startswith("IPoIB |") and "ib0" in name


def is_nccl_hold(name: str) -> bool:
    return name.startswith("NCCL |") and "Hold" in name


def test_dry_run_of_a_clean_node_shows_no_change(drift):
    _, clean, _, _ = drift
    assert planned(clean, "hosts_with_change") == set()
    assert clean["results"] is None  # nothing ran


def test_dry_run_shows_the_hosts_block_and_the_unheld_package(drift):
    _, clean, drifted, _ = drift
    changes = planned(drifted, "hosts_with_change")
    assert sum(map(is_hosts_block, changes)) == 1, changes
    assert sum(map(is_nccl_hold, changes)) == 1, changes
    unexpected = {n for n in changes if not (is_hosts_block(n) or is_nccl_hold(n) or is_ib0(n))}
    assert unexpected == set(), f"the dry run shows changes that are no drift: {unexpected}"
    # A conditional step (one that runs only if an earlier one changes something) is no drift.
    assert planned(drifted, "hosts_with_conditional_change") <= (
        planned(clean, "hosts_with_conditional_change") | {n for n in changes if is_ib0(n)}
    )


def test_dry_run_shows_the_ib0_mtu(drift):
    _, clean, drifted, _ = drift
    changes = planned(drifted, "hosts_with_change")
    assert any(map(is_ib0, changes)), (
        "the ib0 MTU drift is not a change in the dry-run plan "
        f"(conditional on a clean node: {sorted(planned(clean, 'hosts_with_conditional_change'))})"
    )


def test_the_real_run_changes_exactly_the_drift(drift, lab):
    node, _, _, repair = drift
    assert repair.returncode == 0, repair.stderr[-4000:]
    changed = {op["name"] for op in repair.results["operations"] if op["success"]}
    assert sum(map(is_hosts_block, changed)) == 1, changed
    assert sum(map(is_ib0, changed)) == 1, changed
    assert sum(map(is_nccl_hold, changed)) == 1, changed
    assert len(changed) == 3, changed
    other = lab.agents[0]
    assert f"{other.address}\t{other.hostname}" in run_on(lab, node.hostname, "cat /etc/hosts").stdout
    ib0 = run_on(lab, node.hostname, f"cat /sys/class/net/{lab.network.ipoib.interface}/mtu").stdout
    assert int(ib0) == lab.network.ipoib.mtu
    assert "libnccl2" in run_on(lab, node.hostname, "apt-mark showhold").stdout.split()


# --------------------------------------------------------------------------- apt lock

LOCK_UNIT = "dtlab-apt-lock"
LOCK_SECONDS = 20
RELEASED = "/run/dtlab-apt-lock-released"
# apt and dpkg lock with fcntl (F_SETLK), which flock(1) does not conflict with: holding the
# lock the way unattended-upgrades does needs an fcntl lock.
HOLD_LOCK = (
    "import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'w'); "
    "fcntl.lockf(f, fcntl.LOCK_EX); open('/run/dtlab-apt-lock-held', 'w').close(); "
    f"time.sleep({LOCK_SECONDS}); f.close(); "
    f"open('{RELEASED}', 'w').write(repr(time.time()))"
)


def test_a_held_dpkg_lock_is_waited_for(deployed, deploy, lab):
    node = lab.agents[-1].hostname
    conf = run_on(lab, node, "apt-config dump DPkg::Lock::Timeout").stdout
    assert 'DPkg::Lock::Timeout "600";' in conf, conf
    # Something the deploy has to install again (it needs curl only where it downloads).
    run_on(lab, node, "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q curl >/dev/null")
    run_on(
        lab,
        node,
        f"rm -f /run/dtlab-apt-lock-held {RELEASED}; "
        f"systemd-run -q --unit={LOCK_UNIT} python3 -c {shlex.quote(HOLD_LOCK)}; "
        "for i in $(seq 50); do [ -e /run/dtlab-apt-lock-held ] && exit 0; "
        "sleep 0.1; done; exit 1",
    )
    try:
        started = time.time()
        run = deploy(limit=node)
        assert run.returncode == 0, run.stderr[-4000:]
        released = float(run_on(lab, node, f"cat {RELEASED}").stdout)
        assert started < released, "the lock was released before the deploy began"
        installed = run_on(lab, node, "grep ' install curl:' /var/log/dpkg.log | tail -1").stdout
        assert installed, "the deploy did not install curl again"
        # dpkg.log is in the node's local time: the node converts it.
        when = shlex.quote(" ".join(installed.split()[:2]))
        stamp = int(run_on(lab, node, f"date -d {when} +%s").stdout)
        # dpkg.log has whole seconds: the install began after the lock was let go.
        assert stamp >= int(released), (installed, released)
        assert any("curl" in op or "download tools" in op for op in run.changed_operations()), (
            run.changed_operations()
        )
    finally:
        run_on(
            lab,
            node,
            f"systemctl stop {LOCK_UNIT} 2>/dev/null; systemctl reset-failed {LOCK_UNIT} 2>/dev/null; true",
            check=False,
        )
    run_on(lab, node, "command -v curl")


# --------------------------------------------------------------------------- rebuilds


def test_rebuild_a_blank_gpu_node(deployed, deploy, lab):
    node = lab.agents[0]
    others = [n for n in lab.nodes if n.hostname != node.hostname]
    name, data = put_probe(lab)
    before = settled_states(lab, others)

    recreate = lab_cli("recreate", node.hostname)
    assert recreate.returncode == 0, recreate.stderr
    assert_blank(lab, node.hostname)
    # A bare node has no IPoIB interface until MLNX_OFED's openibd loads ib_ipoib: the deploy
    # must configure it after the fabric's role (deploy/site.py), in the same run.
    interface = node.ipoib_interface
    assert run_on(lab, node.hostname, f"ip link show {interface}", check=False).returncode != 0
    # The site's own repository that no longer answers (port 9: refused): not one the deploy
    # installs from, so a warning, not a failed host (files/shared/apt-update.sh).
    stale = "/etc/apt/sources.list.d/site-stale.list"
    run_on(lab, node.hostname, f"echo 'deb [trusted=yes] http://127.0.0.1:9/ stale main' > {stale}")

    run = rebuild(node.hostname)
    assert run.returncode == 0, run.stderr[-4000:]
    run_on(lab, node.hostname, f"test -f {stale} && rm {stale}")  # there all along, and gone now
    assert f"{node.ipoib_address}/" in run_on(lab, node.hostname, f"ip -br addr show {interface}").stdout
    assert set(run.changes_by_host()) == {node.hostname}, run.changes_by_host()
    assert f"--> rebuild: {node.hostname} rebuilt" in run.stderr

    # The whole cluster converged: a full deploy changes nothing anywhere.
    again = deploy()
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.results["totals"]["success"] == 0, again.changed_operations()

    assert_verify_green()
    after = settled_states(lab, others)
    assert after == before, "a service on another node restarted"
    assert get_object(lab, name) == data
    agents = wait_registered(lab, node)
    assert all(a["slots"] for a in agents), agents


def test_rebuild_the_blank_master_and_storage_node(deployed, lab):
    master = lab.master_node
    assert master.hostname == lab.storage_node.hostname, "the lab puts MinIO on the master"
    name, data = put_probe(lab)
    cluster_id = Master(lab).request("GET", "/info", auth=False)["cluster_id"]

    recreate = lab_cli("recreate", master.hostname)  # the data disk is kept
    assert recreate.returncode == 0, recreate.stderr
    assert_blank(lab, master.hostname)

    run = rebuild(master.hostname, "-vvv", "--debug")
    assert run.returncode == 0, run.stderr[-4000:]
    assert set(run.changes_by_host()) == {master.hostname}, run.changes_by_host()
    assert_no_secret_leaked(lab, run.stdout + run.stderr)

    # What survives: the objects on the data disk. What does not: PostgreSQL (a new cluster id).
    assert get_object(lab, name) == data
    assert Master(lab).request("GET", "/info", auth=False)["cluster_id"] != cluster_id
    for node in lab.agents:
        assert wait_registered(lab, node), node.hostname
    assert_verify_green()


def assert_no_secret_leaked(cluster, output: str) -> None:
    """Nothing printed, logged or left readable on a node holds a secret value."""
    secrets = secrets_of(cluster)
    leaked = [i for i, s in enumerate(secrets) if s in output]
    assert leaked == [], f"secret #{leaked} appears in the rebuild's -vvv --debug output"
    debug_log = REPO / "pyinfra-debug.log"
    if debug_log.exists():
        assert not any(s in debug_log.read_text(errors="replace") for s in secrets), (
            "a secret appears in pyinfra-debug.log"
        )
    patterns_file = "/root/.day-two-patterns"
    patterns = "\n".join(secrets) + "\n"
    for node in cluster.nodes:
        host = node.hostname
        run_on(cluster, host, f"umask 077; cat > {patterns_file}", stdin=patterns)
        try:
            files = run_on(
                cluster,
                host,
                f"grep -rlsF -f {patterns_file} {' '.join(SEARCHED)} | grep -vxF {patterns_file} || true",
            ).stdout.split()
            assert sorted(set(files) - SECRET_FILES) == [], f"{host}: secrets in {files}"
            # So no world-readable file (under /etc or elsewhere searched) holds one.
            for path in files:
                mode = run_on(cluster, host, f"stat -c '%U:%G %a' {shlex.quote(path)}").stdout.strip()
                assert mode == "root:root 600", f"{host}:{path} holds a secret but is {mode}"
            journal = run_on(
                cluster, host, f"journalctl --no-pager -o cat | grep -cF -f {patterns_file} || true"
            ).stdout.strip()
            assert journal == "0", f"{host}: {journal} journal lines hold a secret"
        finally:
            run_on(cluster, host, f"rm -f {patterns_file}", check=False)


# --------------------------------------------------------------------------- SSH lost mid-run

STOP_SSH = (
    "systemctl stop ssh.socket ssh.service 2>/dev/null; systemctl stop ssh.service || exit 1; "
    # The deploy's connection is an established session: end those sshd processes by pid
    # (a privilege-separated child may be gone already when its parent's turn comes).
    "for p in $(ss -Htnp state established '( sport = :22 )' | grep -o 'pid=[0-9]*' "
    "| cut -d= -f2 | sort -u); do kill $p 2>/dev/null; done; sleep 0.3; "
    "test -z \"$(ss -Htn state established '( sport = :22 )')\""
)


# A re-deploy reads its facts in one batch and needs SSH again only for what changed: the
# node must have work left when SSH goes, or it finishes without noticing. So its agent
# package is removed, and dpkg's lock is held (outside SSH) until the cut: the reinstall then
# waits in apt (DPkg::Lock::Timeout) whatever the timing.
HOLD_DPKG_LOCK = (
    "import fcntl, sys, time  # dtlab-hold-dpkg-lock\n"
    "f = open('/var/lib/dpkg/lock-frontend', 'w')\n"
    "fcntl.lockf(f, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "time.sleep(900)\n"
)


def hold_dpkg_lock(node: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.lab",
            "--cluster",
            str(LAB_CLUSTER),
            "exec",
            node,
            "python3",
            "-c",
            HOLD_DPKG_LOCK,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    line = holder.stdout.readline()
    assert line.strip() == "locked", holder.stderr.read() if holder.poll() is not None else line
    return holder


def release_dpkg_lock(node: str, holder: subprocess.Popen) -> None:
    lab_cli("exec", node, "pkill", "-f", "dtlab-hold-dpkg-lock")
    holder.kill()
    holder.wait()


def deploy_losing_ssh(node: str, out, err) -> int:
    """A full deploy in the background; sshd of `node` stopped once operations run."""
    argv = [PYINFRA, "-y", "--json", str(LAB_INVENTORY), "deploy.py"]
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            # Past its first operations: the plan is made and every host is connected.
            while err.read_text().count("--> Starting operation") < 2:
                assert proc.poll() is None, err.read_text()[-3000:]
                assert time.monotonic() < deadline, "the deploy never started its operations"
                time.sleep(0.05)
            cut = lab_cli("exec", node, "sh", "-c", STOP_SSH)
            assert cut.returncode == 0, cut.stderr
            return proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_ssh_lost_on_one_node_mid_run(deployed, deploy, lab, tmp_path):
    node = lab.agents[-1].hostname
    out, err = tmp_path / "deploy.json", tmp_path / "deploy.err"
    removed = lab_cli("exec", node, "dpkg", "-r", "determined-agent")
    assert removed.returncode == 0, removed.stderr
    holder = hold_dpkg_lock(node)
    try:
        rc = deploy_losing_ssh(node, out, err)
        run = DeployRun(rc, out.read_text(), err.read_text())
        assert run.returncode != 0
        assert run.stdout, f"no JSON: the run was aborted for every host\n{run.stderr[-3000:]}"
        assert run.results["failed_hosts"] == [node]
        # The other agents ran the plan to its last role (their last operations differ with
        # their agent_layout, so each one's own last operation is what counts).
        for other in {n.hostname for n in lab.agents} - {node}:
            ran = [op["name"] for op in run.results["operations"] if other in op["success"] + op["no_change"]]
            assert ran and ran[-1].startswith("Determined agent |"), (other, ran[-3:])
        tail = "\n".join(run.stderr.strip().splitlines()[-3:])
        assert re.search(rf"^\s+{re.escape(node)}: SSH connection lost at '", tail, re.M), tail
        assert f"re-run: pyinfra -y --json {LAB_INVENTORY} deploy.py --limit {node}" in tail, tail
    finally:
        release_dpkg_lock(node, holder)
        restore = lab_cli("exec", node, "systemctl", "start", "ssh.service")
        assert restore.returncode == 0, restore.stderr
    again = deploy(limit=node)
    assert again.returncode == 0, again.stderr[-4000:]
