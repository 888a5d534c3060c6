"""Attacks on what the toolkit trusts, tried on the lab and refused.

- verify against an impostor: a known_hosts file whose key for one node is wrong, with strict
  host key checking (a modified copy of the lab's cluster.yaml; the lab itself opts out, its
  node keys change on every rebuild): that node's column is SSH with the host-key reason, the
  others run their checks as usual.
- a forged cuda-keyring on the mirror (another .deb at the same path, same name and version):
  the node that has to fetch it refuses it (sha256 pin, sources.cuda_keyring) and installs
  nothing; with the mirror repaired, the next deploy installs the pinned one.
- PGDG's keyring with a second key planted beside the pinned one (the role's operation alone,
  against a lab key on the mirror: the lab's Debian 12 nodes never need PGDG): replaced by the
  one-key file, then left alone; when the key URL itself serves two keys, refused and the
  planted keyring removed.
- a deploy at -vvv prints no secret of cluster.yaml and no plain hash (md5, sha1, sha256,
  sha512) of a secret or of a secret file, and the fact cache keeps none; the secret files are
  still left alone when right and written again when they differ.
- a mirror that wants a login (HTTP Basic, every path): apt (auth.conf.d) and curl (netrc) get
  through with sources.mirror_credentials, from root 0600 files; the password is in no
  sources list, apt.conf file or deploy output.
- a rogue agent registered from inside a task container (the agent protocol has no login):
  verify's master row names it and where it connects from.
"""

import base64
import dataclasses
import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from deploy.pins import CUDA_KEYRING_DEB, CUDA_KEYRING_FILE
from deploy.secrets import Secret
from roles.apt.cuda_repo import KEPT_KEYRING
from roles.determined.master import MASTER_YAML, S3_ENV
from roles.minio.server import ENV_FILE as MINIO_ENV

from . import debs
from .aptrepo import throwaway_keys
from .conftest import (
    LAB_CLUSTER,
    LAB_INVENTORY,
    PYINFRA,
    DeployRun,
    _inventory_for,
    failing_cells,
    run_verify,
)
from .paths import MIRROR, REPO
from .pins import LAB_DISTRO


@pytest.fixture
def impostor_cluster(lab, tmp_path):
    """(cluster.yaml copy checking host keys, hostname whose known key is wrong)."""
    victim = lab.agents[0]
    lines = []
    for node in lab.nodes:
        if node is victim:
            key = tmp_path / "impostor"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            kind, blob = key.with_suffix(".pub").read_text().split()[:2]
            name = str(node.address) if lab.ssh.port == 22 else f"[{node.address}]:{lab.ssh.port}"
            lines.append(f"{name} {kind} {blob}\n")
            continue
        scan = subprocess.run(
            ["ssh-keyscan", "-T", "5", "-p", str(lab.ssh.port), "-t", "ed25519", str(node.address)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert scan.stdout.strip(), f"no host key from {node.hostname}: {scan.stderr}"
        lines.append(scan.stdout)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("".join(lines))
    raw = yaml.safe_load(LAB_CLUSTER.read_text())
    text = LAB_CLUSTER.read_text()
    assert raw["ssh"]["strict_host_key_checking"] is False  # the lab's documented opt-out
    text = re.sub(r"(?m)^  strict_host_key_checking: false$", "  strict_host_key_checking: true", text)
    text = re.sub(r"(?m)^  known_hosts_file: .*$", f"  known_hosts_file: {known_hosts}", text)
    copy = tmp_path / "cluster.yaml"
    copy.write_text(text)
    return copy, victim.hostname, known_hosts


def node_rows(matrix: str) -> dict[str, str]:
    rows = {}
    for line in matrix.split("## Nodes", 1)[1].split("## Checks", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0] not in ("node", "---"):  # node status ok FAIL SSH n/p skip why
            rows[cells[0]] = line
    return rows


def test_verify_refuses_a_node_whose_host_key_does_not_match(lab, impostor_cluster, tmp_path):
    cluster, victim, known_hosts = impostor_cluster
    matrix_md = tmp_path / "matrix.md"
    result = run_verify(
        "-n",
        "4",
        "-p",
        "tests.verify.matrix",
        f"--verify-matrix={matrix_md}",
        cluster=cluster,
    )
    assert result.returncode != 0
    header = f"host keys: checked against {known_hosts}; unknown or different keys refused"
    assert header in result.stdout
    matrix = matrix_md.read_text()
    assert header in matrix
    rows = node_rows(matrix)
    assert "UNREACHABLE" in rows[victim] and "host key does not match known_hosts" in rows[victim], matrix
    others = {name: row for name, row in rows.items() if name not in (victim, "(cluster)")}
    assert others and not [row for row in others.values() if "UNREACHABLE" in row], matrix
    # The other nodes were checked (the lab as deployed, or not: the point is who verify talks
    # to): at least one check passed on each, none was cut by SSH.
    for row in others.values():
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[2]) > 0 and cells[4] == "0", row


def node_keyring_state(lab_ssh, hostname: str) -> str:
    return lab_ssh(
        hostname,
        f"sha256sum {CUDA_KEYRING_FILE}; dpkg-query -W -f='${{Status}} ${{Version}}\\n' cuda-keyring; "
        f"ls {KEPT_KEYRING}.part 2>/dev/null || true",
    ).stdout


@pytest.fixture
def forged_keyring(lab, tmp_path):
    """The mirror's keyring .deb for the lab's folder replaced by another one: same package,
    same version, a key the pin never saw. Put back afterwards."""
    served = MIRROR / "cuda" / "repos" / LAB_DISTRO / "x86_64" / CUDA_KEYRING_DEB
    saved = tmp_path / "saved.deb"
    shutil.copy2(served, saved)
    forged = debs.build_deb(
        tmp_path / "forged",
        "cuda-keyring",
        "1.1-1",
        {CUDA_KEYRING_FILE.lstrip("/"): (b"an attacker's keyring", 0o644)},
        arch="all",
    )
    try:
        shutil.copyfile(forged, served)
        yield served
    finally:
        shutil.copyfile(saved, served)


def test_a_forged_keyring_on_the_mirror_is_refused(deployed, lab, lab_ssh, deploy, forged_keyring):
    victim = lab.agents[-1].hostname
    # The node must fetch: as a freshly installed node would, it has no verified copy yet.
    lab_ssh(victim, f"rm -f {KEPT_KEYRING}")
    before = node_keyring_state(lab_ssh, victim)
    run = deploy(limit=victim)
    assert run.returncode != 0
    assert f"{CUDA_KEYRING_DEB}: sha256 mismatch" in run.stderr, run.stderr[-3000:]
    assert "nothing was installed" in run.stderr
    assert node_keyring_state(lab_ssh, victim) == before  # same keyring file, same package
    assert lab_ssh(victim, f"test -e {KEPT_KEYRING}", check=False).returncode != 0


def test_the_pinned_keyring_is_restored_and_then_left_alone(lab, lab_ssh, deploy):
    victim = lab.agents[-1].hostname
    lab_ssh(victim, f"rm -f {KEPT_KEYRING}")
    first = deploy(limit=victim)
    assert first.returncode == 0, first.stderr[-3000:]
    assert any("Trust the CUDA repository" in op for op in first.changed_operations())
    again = deploy(limit=victim)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not [op for op in again.changed_operations() if "Trust the CUDA repository" in op]


# --- PGDG's keyring holds exactly the pinned key ------------------------------------------------

PGDG_DIR = "/var/lib/dtlab-test/pgdg"
PGDG_DEST = f"{PGDG_DIR}/apt.postgresql.org.asc"


@pytest.fixture(scope="module")
def openpgp_keys(tmp_path_factory):
    """Two throwaway keys, [(fingerprint, armored), ...]: the "pinned" one and an intruder."""
    keys = throwaway_keys(tmp_path_factory.mktemp("gnupg"), ("pinned", "intruder"))
    return [keys["pinned"], keys["intruder"]]


@pytest.fixture
def served_pgdg_key(lab, lab_ssh):
    """(URL, file) of a key file on the lab mirror, standing in for PGDG's key URL; the mirror
    and the nodes are cleaned up afterwards."""
    folder = MIRROR / "dtlab-test-pgdg"
    folder.mkdir(exist_ok=True)
    mirror = lab.sources.cuda_repo.split("/cuda/", 1)[0]  # the lab mirror's base URL
    try:
        yield f"{mirror}/dtlab-test-pgdg/key.asc", folder / "key.asc"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for node in lab.nodes:
            lab_ssh(node.hostname, f"rm -rf {PGDG_DIR}", check=False)


def run_pgdg_key(victim: str, url: str, fingerprint: str) -> DeployRun:
    env = {
        **os.environ,
        "DTLAB_PGDG_URL": url,
        "DTLAB_PGDG_FINGERPRINT": fingerprint,
        "DTLAB_PGDG_DEST": PGDG_DEST,
    }
    argv = [PYINFRA, "-y", "--json", "--limit", victim, str(LAB_INVENTORY), "tests/lab/pgdg_key_deploy.py"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    return DeployRun(proc.returncode, proc.stdout, proc.stderr)


def plant(lab_ssh, hostname: str, path: str, data: bytes) -> None:
    lab_ssh(hostname, f"mkdir -p {PGDG_DIR} && echo {base64.b64encode(data).decode()} | base64 -d > {path}")


def test_a_pgdg_keyring_with_an_extra_key_is_replaced_or_removed(lab, lab_ssh, openpgp_keys, served_pgdg_key):
    (pinned, key), (_, intruder) = openpgp_keys
    url, served = served_pgdg_key
    victim = lab.agents[0].hostname
    served.write_bytes(key)
    plant(lab_ssh, victim, PGDG_DEST, key + intruder)  # an extra key beside the pinned one
    repaired = run_pgdg_key(victim, url, pinned)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert any("PGDG signing key" in op for op in repaired.changed_operations())
    on_node = lab_ssh(victim, f"base64 -w0 {PGDG_DEST}").stdout.strip()
    assert base64.b64decode(on_node) == key  # replaced whole, the intruder gone
    again = run_pgdg_key(victim, url, pinned)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not again.changed_operations()  # re-checked, and exactly the pinned key: no change
    # The key URL itself serves two keys: refused, and the planted keyring is not left for apt.
    served.write_bytes(key + intruder)
    plant(lab_ssh, victim, PGDG_DEST, key + intruder)
    refused = run_pgdg_key(victim, url, pinned)
    assert refused.returncode != 0
    assert f"holds 2 key(s), not exactly the one with fingerprint {pinned}: refused" in refused.stderr
    assert f"{PGDG_DEST} held other keys and was removed" in refused.stderr
    assert lab_ssh(victim, f"test -e {PGDG_DEST}", check=False).returncode != 0


# --- secrets at -vvv: no value, no plain hash of one ----------------------------------------------


def secret_values(model) -> list[str]:
    found = []
    for f in dataclasses.fields(model):
        value = getattr(model, f.name)
        if isinstance(value, Secret):
            found.append(value.value)
        elif dataclasses.is_dataclass(value):
            found += secret_values(value)
    return found


def plain_digests(data: bytes) -> set[str]:
    return {hashlib.new(name, data).hexdigest() for name in ("md5", "sha1", "sha256", "sha512")}


# Decided without a plain hash: the secret files (read back) and the database role (keyed digest).
SECRET_FILE_OPS = (
    "MinIO settings and credentials",
    "Master configuration",
    "Master S3 environment",
    "Backup S3 keys",
    "Node key for the keyed digest",
    "Database role",
)


def test_deploy_at_vvv_shows_no_secret_nor_a_plain_hash_of_one(lab, lab_ssh, deploy):
    master = lab.master_host
    values = secret_values(lab)
    assert len(values) >= 4
    files = [MASTER_YAML, S3_ENV] + ([MINIO_ENV] if lab.storage.host == master else [])
    contents = [base64.b64decode(lab_ssh(master, f"base64 -w0 {f}").stdout) for f in files]
    # Without the fact cache every fact is read, and printed, one by one (the worst case).
    cache = Path.home() / ".cache/gpu-cluster/facts"
    for entry in cache.glob(f"{master}@*.json"):
        entry.unlink()
    argv = [PYINFRA, "-y", "-vvv", "--limit", master, str(LAB_INVENTORY), "deploy.py"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = (run.stdout + run.stderr).lower()
    assert "stat -c" in shown  # -vvv did print the facts' commands and output
    for value in values:
        assert value.lower() not in shown
        assert not [d for d in plain_digests(value.encode()) if d in shown]
    for content in contents:
        assert not [d for d in plain_digests(content) if d in shown]
    # Nor does the fact cache keep one (deploy/pyinfra_ext/factcache.py).
    cached = "".join(p.read_text() for p in cache.glob("*.json")).lower()
    for data in [v.encode() for v in values] + contents:
        assert not [d for d in plain_digests(data) if d in cached]
    # Read back, not hashed: a second deploy leaves the secret files alone ...
    second = deploy(limit=master)
    assert second.returncode == 0, second.stderr[-3000:]
    assert not [op for op in second.changed_operations() if any(name in op for name in SECRET_FILE_OPS)]
    # ... and a secret file that differs from cluster.yaml's is written again, mode 0600 first.
    lab_ssh(master, f"echo '# tampered' >> {S3_ENV}")
    repaired = deploy(limit=master)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert any("Master S3 environment" in op for op in repaired.changed_operations())
    assert base64.b64decode(lab_ssh(master, f"base64 -w0 {S3_ENV}").stdout) == contents[1]
    assert lab_ssh(master, f"stat -c '%U %G %a' {S3_ENV}").stdout.split() == ["root", "root", "600"]


# --- a mirror that wants a login ----------------------------------------------------------------


class LoginMirror(http.server.SimpleHTTPRequestHandler):
    """The lab mirror's tree, every path behind HTTP Basic (as a site's authenticated mirror)."""

    login = ""
    log: list[tuple[str, int]] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.headers.get("Authorization") != "Basic " + base64.b64encode(self.login.encode()).decode():
            self.log.append((self.path, 401))
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="site mirror"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.log.append((self.path, 200))
        super().do_GET()

    def do_HEAD(self):
        self.do_GET()


@pytest.fixture
def login_mirror(lab, tmp_path):
    """(cluster.yaml copy whose cuda_repo is a mirror wanting a login, that login, request log)."""
    controller = str(lab.sources.cuda_repo).split("//", 1)[1].split(":", 1)[0]
    log: list[tuple[str, int]] = []
    login = "site-mirror:Lab-M1rror-" + os.urandom(6).hex()
    handler = type("Handler", (LoginMirror,), {"login": login, "log": log})
    httpd = http.server.ThreadingHTTPServer(
        (controller, 0), functools.partial(handler, directory=str(MIRROR))
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    secret = tmp_path / "mirror-login"
    secret.write_text(login + "\n")
    secret.chmod(0o600)
    port = httpd.server_address[1]
    text = LAB_CLUSTER.read_text()
    line = next(row for row in text.splitlines() if row.startswith("  cuda_repo: "))
    repo = line.replace(":8077/", f":{port}/")
    text = text.replace(line + "\n", f"{repo}\n  mirror_credentials: {{file: {secret}}}\n")
    copy = tmp_path / "cluster.yaml"
    copy.write_text(text)
    try:
        yield copy, login, log
    finally:
        httpd.shutdown()


def test_apt_and_downloads_log_in_to_the_mirror_from_root_only_files(lab, lab_ssh, deploy, login_mirror):
    from roles.apt.proxy import AUTH_CONF
    from roles.shared.ops import DOWNLOAD_NETRC

    cluster, login, log = login_mirror
    user, password = login.split(":", 1)
    victim = lab.agents[-1].hostname
    lab_ssh(victim, f"rm -f {KEPT_KEYRING}")  # so the keyring .deb is downloaded (curl)
    try:
        run = deploy(inventory=_inventory_for(cluster), limit=victim)
        assert run.returncode == 0, run.stderr[-3000:]
        assert password not in run.stdout + run.stderr
        ok = {path for path, status in log if status == 200}
        assert any(p.endswith("/InRelease") for p in ok), log  # apt, from auth.conf.d
        assert any(p.endswith(f"/{CUDA_KEYRING_DEB}") for p in ok), log  # curl, from the netrc
        for path in (AUTH_CONF, DOWNLOAD_NETRC):
            assert lab_ssh(victim, f"stat -c '%U %G %a' {path}").stdout.split() == ["root", "root", "600"]
        netloc = cluster.read_text().split("cuda_repo: http://", 1)[1].split("/", 1)[0]
        assert f"machine http://{netloc} login {user} password" in lab_ssh(victim, f"cat {AUTH_CONF}").stdout
        leaked = lab_ssh(
            victim, f"grep -rlF {password} /etc/apt/sources.list.d /etc/apt/apt.conf.d", check=False
        )
        assert leaked.stdout == ""
    finally:
        # Back to the lab's own mirror: the login files go with the login.
        back = deploy(limit=victim)
        assert back.returncode == 0, back.stderr[-3000:]
        for path in (AUTH_CONF, DOWNLOAD_NETRC):
            assert lab_ssh(victim, f"test -e {path}", check=False).returncode != 0


# From inside a task container: the agent protocol needs no login (Determined exempts /agents
# from authentication, master/internal/user unauthenticatedPointsList); the stand-in's form of
# it is tests/lab/standins/determined/determined-agent's (setup, started, heartbeats).
ROGUE_AGENT = """
import json, os, time, urllib.request
c = json.loads(os.environ["ROGUE"])
q = "id=%s&resource_pool=default&version=0.38.0" % c["id"]
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(c["master"] + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=10).status
call("GET", "/agents/setup?" + q + "&reconnect=false")
devices = [{"id": i, "brand": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-rogue-%d" % i, "type": "cuda"}
           for i in range(8)]
print("started", call("POST", "/agents/started?" + q, {"version": "0.38.0", "devices": devices,
                                                        "resource_pool": "default"}), flush=True)
for _ in range(60):
    time.sleep(2)
    call("POST", "/agents/heartbeat?" + q, {})
"""


def test_a_rogue_agent_from_a_trial_container_turns_verify_red(deployed, lab, tmp_path):
    """A task container registers an 8-GPU agent cluster.yaml does not name (#35 M4): verify's
    master row names it with where it connects from. Afterwards it is disabled (a disconnected
    agent stays listed for agent_reconnect_wait, 25 s) and disconnected."""
    import json
    import shlex
    import urllib.request

    from .test_scheduler_lab import run_on
    from .test_trials_lab import Api

    agent = lab.agents[-1].hostname
    master = f"http://{lab.master_node.address}:{lab.master_port}"
    image = shlex.quote(lab.task_refs.cpu)
    name = "dtlab-rogue-agent"
    given = shlex.quote(json.dumps({"master": master, "id": "rogue-gpu"}))  # nothing secret
    run_on(
        lab,
        agent,
        f"docker rm -f {name} >/dev/null 2>&1; docker run -d --name {name} --network bridge "
        f"-e ROGUE={given} {image} python3 -c {shlex.quote(ROGUE_AGENT)}",
    )
    try:
        for _ in range(30):
            if "started 200" in run_on(lab, agent, f"docker logs {name} 2>&1", check=False).stdout:
                break
            time.sleep(1)
        else:
            raise AssertionError(run_on(lab, agent, f"docker logs {name} 2>&1", check=False).stdout)
        junit = tmp_path / "rogue.xml"
        run_verify("-k", "test_master_knows_no_unnamed_agent", f"--junitxml={junit}")
        assert failing_cells(junit) == {
            f"test_determined::test_master_knows_no_unnamed_agent[{lab.master_node.hostname}]"
        }
        report = junit.read_text()
        assert "rogue-gpu (from " in report and "8 slots" in report, report[-2000:]
    finally:
        run_on(lab, agent, f"docker rm -f {name}", check=False)
        Api(lab).call("POST", "/api/v1/agents/rogue-gpu/disable", {"drain": False})
        request = urllib.request.Request(f"{master}/agents?id=rogue-gpu", method="DELETE")
        urllib.request.urlopen(request, timeout=10).read()
