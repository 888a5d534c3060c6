"""TLS on the lab: the lab's cluster.yaml plus storage.tls (a certificate for the storage node)
and determined.tls (one for the master: master_host and its address), each from its own
throwaway CA, deployed, verified, refused where the trust is wrong, repaired, deployed again,
and switched back to plain http. One cycle for both, as a site that turns TLS on does (one
deploy on, one off, one verify with the smoke: the largest items of the lab's run).

Storage:
- MinIO answers only TLS: the deploy's own client (the CA from cluster.yaml, the name
  endpoint_url's host) gets 200, plain http gets Go's "Client sent an HTTP request to an HTTPS
  server." and no S3; its key is minio-user's, 0600;
- trials get AWS_CA_BUNDLE (the agents' whole bundle, bind-mounted) from master.yaml's
  task_container_defaults, and pg-backup takes a backup over https (the master's system store).
Master:
- it answers only TLS, with that certificate; a plain request gets no answer at all (the real
  master's cmux closes a connection that does not start a TLS handshake:
  master/internal/core.go startServers, soheilhy/cmux v0.1.4; not net/http's answer, which
  MinIO sends);
- every agent registers over TLS, and a trial that does not trust the master's certificate
  fails before its entrypoint with the prep step's SSLError;
- an agent whose master_cert is another CA is refused: Go's "x509: certificate signed by
  unknown authority" in its journal, the agent gone from the master; a deploy repairs it.
Both:
- verify is green, its smoke experiment included (each trial container reaches the master over
  https with DET_MASTER_CERT_FILE and DET_MASTER_CERT_NAME, as the harness's prep step does, and
  saves and restores a checkpoint through boto3 over https);
- a second deploy changes nothing; the plain lab deploy switches both off again (certificates,
  CAs and security.tls gone, http back) and a deploy after that changes nothing: the lab is
  left as it was found.
"""

from __future__ import annotations

import http.client
import json
import shlex
import ssl
import time
import xml.etree.ElementTree as ET

import pytest
import yaml

from deploy import s3
from deploy.cluster import load_cluster
from deploy.experiment import smoke
from deploy.experiment.target import load as load_target
from roles.minio import tls as minio_tls
from tests.unit.tls_material import make_ca, make_server, write

from .conftest import run_verify
from .test_smoke_lab import RESTORE, SAVE

pytestmark = pytest.mark.lab

PLAIN_HTTP_ANSWER = "Client sent an HTTP request to an HTTPS server."
CERTS = "/etc/determined/certs"
AGENT_YAML = "/etc/determined/agent.yaml"
WRONG_CA = "/root/dtlab-wrong-master-ca.crt"
REFUSED = "tls: failed to verify certificate: x509: certificate signed by unknown authority"


def _tls_copy(lab, tmp_path):
    """cluster.yaml with storage.tls and determined.tls, its inventory, the loaded cluster, the
    master's certificate and its CA's file."""
    pki = tmp_path / "pki"
    pki.mkdir()
    raw = yaml.safe_load(lab.path.read_text())
    storage_ca = make_ca("dtlab storage test CA")
    node = lab.storage_node
    minio = make_server(storage_ca, [node.hostname, str(node.address)])
    raw["storage"]["tls"] = {
        "certificate": {"file": write(pki / "minio.crt", minio.cert_pem)},
        "private_key": {"file": write(pki / "minio.key", minio.key_pem(), 0o600)},
        "ca_certificate": {"file": write(pki / "storage-ca.crt", storage_ca.cert_pem)},
    }
    master_ca = make_ca("dtlab master test CA")
    node = lab.master_node
    master = make_server(master_ca, [lab.master_host, str(node.address)], cn=lab.master_host)
    raw["determined"]["tls"] = {
        "certificate": {"file": write(pki / "master.crt", master.cert_pem)},
        "private_key": {"file": write(pki / "master.key", master.key_pem(), 0o600)},
        "ca_certificate": {"file": write(pki / "master-ca.crt", master_ca.cert_pem)},
    }
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(raw, sort_keys=False))
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(cluster)!r}))\n")
    return cluster, inventory, load_cluster(cluster), master, pki / "master-ca.crt"


class Master:
    """The master's API over https: its address, the CA, the name master_host (as the agents
    and the deploy check it)."""

    def __init__(self, cluster, ca_file):
        self.address, self.port, self.name = (
            str(cluster.master_node.address),
            cluster.master_port,
            cluster.master_host,
        )
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.password = _password(cluster)
        self.token = ""

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        status, raw = self.raw(method, path, body)
        return status, json.loads(raw or b"null")

    def raw(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.address, self.port, timeout=15)
        conn.connect()
        conn.sock = self.context.wrap_socket(conn.sock, server_hostname=self.name)
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def agent_ids(self) -> set[str]:
        if not self.token:
            status, body = self.request(
                "POST", "/api/v1/auth/login", {"username": "admin", "password": self.password}
            )
            assert status == 200, body
            self.token = body["token"]
        status, body = self.request("GET", "/api/v1/agents")
        assert status == 200, body
        return {a["id"] for a in body.get("agents") or []}

    def wait_agents(self, done, timeout: float = 90) -> set[str]:
        deadline = time.monotonic() + timeout
        while True:
            ids = self.agent_ids()
            if done(ids) or time.monotonic() > deadline:
                return ids
            time.sleep(2)


def _plain_http(address, port: int, path: str) -> tuple[int | None, str]:
    """GET over plain HTTP: (status, body), or (None, the error) when the server drops it."""
    conn = http.client.HTTPConnection(str(address), port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return None, repr(e)
    finally:
        conn.close()


def _expected_agents(lab) -> set[str]:
    """The agents registered before TLS: what every TLS deploy must get back."""
    status, body = _plain_api(lab, "/api/v1/auth/login", {"username": "admin", "password": _password(lab)})
    assert status == 200, body
    status, agents = _plain_api(lab, "/api/v1/agents", token=body["token"])
    assert status == 200, agents
    return {a["id"] for a in agents.get("agents") or []}


def _password(cluster) -> str:
    return cluster.determined.admin_password.value


def _plain_api(lab, path: str, body: dict | None = None, token: str = "") -> tuple[int, dict]:
    conn = http.client.HTTPConnection(str(lab.master_node.address), lab.master_port, timeout=15)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        conn.request("POST" if body is not None else "GET", path, json.dumps(body) if body else None, headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def _untrusting_trial(master: Master, cluster_path) -> list[str]:
    """One trial whose DET_MASTER_CERT_FILE (the experiment's variables come after the master's)
    names a bundle without the lab's CA: its log lines once it ended."""
    doc = smoke.config(load_target(cluster_path), smoke.SAVE, "master-tls-untrusted")
    doc.update(name="lab-master-tls-untrusted", labels=["lab-master-tls"], entrypoint="echo entrypoint-ran")
    doc["environment"]["environment_variables"] = ["DET_MASTER_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]
    body = {"config": yaml.safe_dump(doc), "modelDefinition": smoke.model_definition(), "activate": True}
    status, created = master.request("POST", "/api/v1/experiments", body)
    assert status == 200, created
    experiment = created["experiment"]["id"]
    deadline = time.monotonic() + 300  # the prep step retries for about 31 s
    while True:
        state = master.request("GET", f"/api/v1/experiments/{experiment}")[1]["experiment"]["state"]
        if state in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED") or time.monotonic() > deadline:
            break
        time.sleep(3)
    (trial,) = master.request("GET", f"/api/v1/experiments/{experiment}/trials")[1]["trials"]
    status, raw = master.raw("GET", f"/api/v1/trials/{trial['id']}/logs")
    assert status == 200, raw
    master.request("POST", f"/api/v1/experiments/{experiment}/kill")
    master.request("POST", f"/api/v1/experiments/{experiment}/archive")
    assert state == "STATE_ERROR", state
    return [json.loads(line)["result"]["message"] for line in raw.splitlines() if line.strip()]


def _ready(cluster, scheme: str) -> int:
    url = f"{scheme}://{cluster.storage_node.address}:{cluster.storage.port}/minio/health/ready"
    return s3.pool(cluster, retries=0).request("GET", url).status


def _ready(cluster, scheme: str) -> int:
    url = f"{scheme}://{cluster.storage_node.address}:{cluster.storage.port}/minio/health/ready"
    return s3.pool(cluster, retries=0).request("GET", url).status


def _storage_tls_on(tls, lab, lab_ssh) -> None:
    storage, master = lab.storage_node.hostname, lab.master_node.hostname
    assert _ready(tls, "https") == 200
    status, body = _plain_http(tls.storage_node.address, tls.storage.port, "/minio/health/ready")
    assert status != 200 and (status is None or PLAIN_HTTP_ANSWER in body), (status, body)
    mode = lab_ssh(storage, f"stat -c '%U %a' {minio_tls.CERTS_DIR}/private.key").stdout.split()
    assert mode == [minio_tls.USER, "600"]
    # Trials get the agents' whole bundle (public CAs too), not the private CA alone.
    defaults = yaml.safe_load(lab_ssh(master, "cat /etc/determined/master.yaml").stdout)[
        "task_container_defaults"
    ]
    assert f"AWS_CA_BUNDLE={minio_tls.CONTAINER_BUNDLE}" in defaults["environment_variables"]
    assert minio_tls.SYSTEM_BUNDLE in [m["host_path"] for m in defaults["bind_mounts"]]
    # pg-backup over https, trusting the CA through the master's system store.
    lab_ssh(master, "systemctl start pg-backup.service")
    assert lab_ssh(master, "systemctl show -p Result --value pg-backup.service").stdout.strip() == "success"


def _master_tls_on(tls, lab, server, ca_file, expected) -> Master:
    served = ssl.get_server_certificate((str(lab.master_node.address), lab.master_port))
    assert ssl.PEM_cert_to_DER_cert(served) == ssl.PEM_cert_to_DER_cert(server.cert_pem.decode())
    status, body = _plain_http(tls.master_node.address, tls.master_port, "/info")
    assert status is None and "RemoteDisconnected" in body, (status, body)
    master = Master(tls, ca_file)
    assert master.request("GET", "/info")[0] == 200
    assert master.wait_agents(lambda ids: ids >= expected) >= expected
    return master


def _wrong_ca_refused(master: Master, lab_ssh, agent_node: str) -> None:
    """One agent told to trust another CA is refused, and stays away."""
    wrong = make_ca("dtlab some other CA")
    lab_ssh(agent_node, f"printf %s {shlex.quote(wrong.cert_pem.decode())} > {WRONG_CA}")
    since = lab_ssh(agent_node, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    lab_ssh(agent_node, f"sed -i 's#master_cert: .*#master_cert: {WRONG_CA}#' {AGENT_YAML}")
    lab_ssh(agent_node, "systemctl restart determined-agent.service")
    ids = master.wait_agents(lambda ids: agent_node not in ids, timeout=120)
    assert agent_node not in ids, ids
    journal = lab_ssh(
        agent_node, f"journalctl -u determined-agent.service --since {shlex.quote(since)} --no-pager"
    )
    assert REFUSED in journal.stdout.replace('\\"', '"'), journal.stdout[-3000:]


def _both_off(lab, lab_ssh) -> None:
    storage = lab.storage_node.hostname
    assert _ready(lab, "http") == 200
    assert lab_ssh(storage, f"test -e {minio_tls.CERTS_DIR}", check=False).returncode == 1
    assert _plain_api(lab, "/info")[0] == 200
    for node in lab.nodes:
        assert lab_ssh(node.hostname, f"test -e {minio_tls.SYSTEM_CA}", check=False).returncode == 1
        assert lab_ssh(node.hostname, f"test -e {CERTS}", check=False).returncode == 1
        for name in lab_ssh(node.hostname, "ls /etc/determined/", check=False).stdout.split():
            if name.endswith(".yaml"):
                config = yaml.safe_load(lab_ssh(node.hostname, f"cat /etc/determined/{name}").stdout) or {}
                assert "tls" not in (config.get("security") or {}), (node.hostname, name)


# Long: one TLS cycle for storage and master (on, verified, refused, repaired, off), in order.
def test_tls_on_verified_refused_repaired_and_off_again(deployed, deploy, lab, lab_ssh, tmp_path):
    cluster, inventory, tls, server, ca_file = _tls_copy(lab, tmp_path)
    assert tls.storage.endpoint_url == f"https://{lab.storage_node.hostname}:{lab.storage.port}"
    expected = _expected_agents(lab)
    assert expected, "the plain lab has no registered agents"
    # A node with the package's one agent (agent_layout per_node): /etc/determined/agent.yaml.
    agent_node = next(n.hostname for n in lab.nodes if "agent" in n.roles and n.agent_layout == "per_node")
    assert agent_node in expected
    try:
        run = deploy(inventory=inventory)
        assert run.returncode == 0, run.stderr[-4000:]
        for secret in (tls.storage.tls.private_key.value, tls.determined.tls.private_key.value):
            assert secret not in run.stdout + run.stderr
        _storage_tls_on(tls, lab, lab_ssh)
        master = _master_tls_on(tls, lab, server, ca_file, expected)

        # The whole of verify, its smoke experiment included (its trials reach the master over
        # https through the lab's prep step, lab_prep_container.py, and MinIO over https).
        # One run for both (verify's own parallel run, the smoke on one worker of it).
        junit = tmp_path / "verify.xml"
        smoked = run_verify("-n", "4", f"--junitxml={junit}", cluster=cluster, smoke=True)
        assert smoked.returncode == 0, smoked.stdout[-6000:]
        passed = {
            case.get("name", "").split("@")[0]
            for case in ET.parse(junit).getroot().iter("testcase")
            if not any(e.tag in ("failure", "error", "skipped") for e in case)
        }
        assert {SAVE, RESTORE} <= passed, smoked.stdout[-6000:]

        # A trial that does not trust the master's certificate fails before its entrypoint, as
        # the harness's prep step fails it (lab_prep_container.py).
        messages = _untrusting_trial(master, cluster)
        assert any("Max retries exceeded" in m and "CERTIFICATE_VERIFY_FAILED" in m for m in messages), (
            messages
        )
        assert not any("entrypoint-ran" in m for m in messages), messages

        _wrong_ca_refused(master, lab_ssh, agent_node)
        repair = deploy(inventory=inventory)
        assert repair.returncode == 0, repair.stderr[-4000:]
        assert master.wait_agents(lambda ids: ids >= expected) >= expected
        again = deploy(inventory=inventory)
        assert again.returncode == 0, again.stderr[-4000:]
        assert again.changed_operations() == []
    finally:
        lab_ssh(agent_node, f"rm -f {WRONG_CA}", check=False)
        restored = deploy()
    assert restored.returncode == 0, restored.stderr[-4000:]
    _both_off(lab, lab_ssh)
    verify = run_verify("-n", "4", "-k", "test_storage or test_trial_container or test_determined")
    assert verify.returncode == 0, verify.stdout[-6000:]
    second = deploy()
    assert second.returncode == 0, second.stderr[-4000:]
    assert second.changed_operations() == []
