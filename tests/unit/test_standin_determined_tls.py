"""TLS in the Determined master and agent stand-ins (tests/lab/standins/determined/).

The master loads security.tls's pair as Go's tls.LoadX509KeyPair does and serves TLS only; the
agent dials it with master_cert/master_cert_name and fails with Go's x509 texts; trial
containers get the certificate, DET_MASTER=https://... and the prep step that uses them.
Without PostgreSQL: the loader, the option checks, the agent against a TLS stub master, the
prep step against a TLS stub. With a local PostgreSQL (`pg` marker): the real master stand-in.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.unit import test_standin_determined as base
from tests.unit.tls_material import make_ca, make_server, write

PREP = base.STANDINS / "lab_prep_container.py"
postgres = base.postgres  # the fixtures, shared
docker = base.docker


@pytest.fixture(scope="module")
def master_module():
    return base.load(base.MASTER)


@pytest.fixture(scope="module")
def agent_module():
    return base.load(base.AGENT)


@pytest.fixture
def pki(tmp_path):
    """A CA, the master's certificate (lab-master and 127.0.0.1) and a second, unrelated CA."""
    ca = make_ca("lab master CA")
    server = make_server(ca, ["lab-master", "127.0.0.1"], cn="lab-master")
    other = make_ca("another CA")
    return {
        "ca": write(tmp_path / "ca.crt", ca.cert_pem),
        "other_ca": write(tmp_path / "other-ca.crt", other.cert_pem),
        "cert": write(tmp_path / "master.crt", server.cert_pem + ca.cert_pem),
        "key": write(tmp_path / "master.key", server.key_pem(), 0o600),
        "server": server,
        "ca_issued": ca,
    }


# --------------------------------------------------------------------------- master: the pair


def test_master_reads_the_pair_as_go_does(tmp_path, pki, master_module):
    context, chain = master_module.read_certificate(pki["cert"], pki["key"])
    assert isinstance(context, ssl.SSLContext)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    # config.GetCertPEM: every CERTIFICATE block of the file, re-encoded, in order.
    assert chain == pki["server"].cert_pem + pki["ca_issued"].cert_pem


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing cert", "open {dir}/nope.crt: no such file or directory"),
        ("missing key", "open {dir}/nope.key: no such file or directory"),
        ("mismatch", "tls: private key does not match public key"),
        (
            "switched",
            "tls: failed to find certificate PEM data in certificate input, but did find a private key; "
            "PEM inputs may have been switched",
        ),
        ("cert as key", "tls: found a certificate rather than a key in the PEM for the private key"),
        (
            "chain as key",
            'tls: failed to find PEM block with type ending in "PRIVATE KEY" in key input after skipping '
            "PEM blocks of the following types: [CERTIFICATE CERTIFICATE]",
        ),
        ("empty cert", "tls: failed to find any PEM data in certificate input"),
        ("encrypted key", "tls: failed to parse private key"),
    ],
)
def test_master_pair_refusals_carry_gos_text(tmp_path, pki, master_module, case, expected):
    cert, key = pki["cert"], pki["key"]
    other = make_server(make_ca(), ["lab-master"])
    if case == "missing cert":
        cert = str(tmp_path / "nope.crt")
    elif case == "missing key":
        key = str(tmp_path / "nope.key")
    elif case == "mismatch":
        key = write(tmp_path / "other.key", other.key_pem(), 0o600)
    elif case == "switched":
        cert, key = pki["key"], pki["cert"]
    elif case == "cert as key":
        key = write(tmp_path / "leaf.crt", pki["server"].cert_pem)
    elif case == "chain as key":
        key = pki["cert"]
    elif case == "empty cert":
        cert = write(tmp_path / "empty.crt", b"not PEM\n")
    elif case == "encrypted key":
        key = write(tmp_path / "enc.key", pki["server"].key_pem(password=b"secret"), 0o600)
    with pytest.raises(master_module.TLSLoadError) as info:
        master_module.read_certificate(cert, key)
    assert str(info.value) == expected.format(dir=tmp_path)


def test_master_tls_needs_both_files_and_defaults_to_8443(tmp_path, pki):
    config = base.base_config(tmp_path, base.free_port())
    config["security"]["tls"] = {"key": pki["key"]}
    result = base.run_master(tmp_path, config)
    assert result.returncode == 1
    assert "Check Failed! 1 errors found:" in result.stdout
    assert "TLS key file provided without a cert file" in result.stdout
    assert "connecting to database" not in result.stdout

    config["security"]["tls"] = {"cert": pki["cert"], "key": pki["key"]}
    del config["port"]
    result = base.run_master(tmp_path, config)
    assert result.returncode == 1  # no database here
    logged = json.loads(result.stdout.splitlines()[0].split("msg=", 1)[1])
    assert json.loads(logged.split("master configuration: ", 1)[1])["port"] == 8443


# --------------------------------------------------------------------------- agent


def test_agent_tls_options_are_checked_as_validate_does(tmp_path, pki):
    options = {
        "master_host": "127.0.0.1",
        "security": {"tls": {"enabled": True, "skip_verify": True, "master_cert": pki["ca"]}},
    }
    agent = base.AgentProcess(tmp_path, options, None)
    try:
        assert agent.wait() == 1
    finally:
        agent.kill()
    out = agent.output()
    assert "command-line arguments specify illegal configuration: Check Failed! 1 errors found:" in out
    assert "cannot specify a master cert file with verification off" in out


class TLSStubMaster(base.StubMaster):
    """The agent protocol stub behind a TLS listener with the given pair."""

    def __init__(self, cert: str, key: str):
        super().__init__()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)


def run_agent(tmp_path: Path, port: int, tls: dict, docker_path=None) -> base.AgentProcess:
    options = {
        "master_host": "127.0.0.1",
        "master_port": port,
        "agent_reconnect_attempts": 1,
        "agent_reconnect_backoff": 1,
        "security": {"tls": {"enabled": True, **tls}},
    }
    return base.AgentProcess(tmp_path, options, docker_path)


@pytest.mark.parametrize(
    ("tls", "expected"),
    [
        (
            {"master_cert": "other_ca", "master_cert_name": "lab-master"},
            "x509: certificate signed by unknown authority",
        ),
        # Go checks the name before the chain: the wrong name is named even with the wrong CA.
        (
            {"master_cert": "other_ca", "master_cert_name": "wrong.example"},
            "is valid for lab-master, not wrong.example",
        ),
        (
            {"master_cert": "ca", "master_cert_name": "master.example"},
            "x509: certificate is valid for lab-master, not master.example",
        ),
        ({"master_cert": "nope"}, 'failed to construct TLS config: failed to read certificate file "'),
    ],
)
def test_agent_refuses_a_master_it_cannot_verify(tmp_path, pki, tls, expected):
    stub = TLSStubMaster(pki["cert"], pki["key"])
    try:
        tls = dict(tls)
        tls["master_cert"] = pki.get(tls["master_cert"], str(tmp_path / "nope.crt"))
        agent = run_agent(tmp_path, stub.port, tls)
        try:
            assert agent.wait() == 1
        finally:
            agent.kill()
    finally:
        stub.close()
    out = agent.output().replace('\\"', '"')
    assert "long disconnected and unable to reconnect to master: initial connection to master failed" in out
    assert expected in out
    if "x509" in expected:
        assert "error dialing master: tls: failed to verify certificate: x509: " in out
    assert not any(p.startswith("POST /agents/started") for p in stub.paths())


def test_agent_names_an_expired_master_certificate_as_go_does(tmp_path, pki):
    expired = make_server(pki["ca_issued"], ["lab-master"], days=-1)
    cert = write(tmp_path / "expired.crt", expired.cert_pem)
    key = write(tmp_path / "expired.key", expired.key_pem(), 0o600)
    stub = TLSStubMaster(cert, key)
    try:
        agent = run_agent(tmp_path, stub.port, {"master_cert": pki["ca"], "master_cert_name": "lab-master"})
        try:
            assert agent.wait() == 1
        finally:
            agent.kill()
    finally:
        stub.close()
    assert "x509: certificate has expired or is not yet valid: current time " in agent.output()
    assert " is after " in agent.output()


def test_agent_registers_over_tls_and_hands_the_name_to_containers(tmp_path, pki, docker, agent_module):
    stub = TLSStubMaster(pki["cert"], pki["key"])
    try:
        agent = run_agent(
            tmp_path, stub.port, {"master_cert": pki["ca"], "master_cert_name": "lab-master"}, docker
        )
        try:
            base.wait_for(lambda: "POST /agents/started" in stub.paths(), what="the agent over TLS")
            assert f"connecting to master at: wss://127.0.0.1:{stub.port}/agents?" in agent.output()
        finally:
            agent.kill()
    finally:
        stub.close()

    opts = {
        "agent_id": "lab-gpu1-0",
        "master_host": "lab-master",
        "master_port": 8443,
        "container_master_host": "10.0.0.1",
        "container_master_port": 0,
        **{k: "" for k in ("http_proxy", "https_proxy", "ftp_proxy", "no_proxy")},
        "security": {"tls": {"enabled": True, "master_cert_name": "lab-master"}},
    }
    runtime = agent_module.Runtime(opts, None, {"master_info": {"cluster_id": "c1", "master_id": "m1"}})
    env = runtime.global_env()
    assert "DET_MASTER=https://10.0.0.1:8443" in env
    assert env[-1] == "DET_MASTER_CERT_NAME=lab-master"
    import base64
    import io
    import tarfile

    info = base64.b64encode(json.dumps({"master_url": None, "master_cert_name": None}).encode()).decode()
    files = [{"path": "/run/determined/info/cluster.json", "content": info, "mode": 0o644}]
    archive = agent_module.build_archive(files, "https://10.0.0.1:8443", "gpu1", "lab-master")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        cluster = json.loads(tar.extractfile("run/determined/info/cluster.json").read())
    assert cluster == {
        "master_url": "https://10.0.0.1:8443",
        "master_cert_name": "lab-master",
        "agent_id": "gpu1",
    }


# --------------------------------------------------------------------------- the trial's prep step


class ContextDirectoryStub:
    """GET /api/v1/tasks/<id>/context_directory over TLS, as the master answers it."""

    def __init__(self, cert: str, key: str):
        self.paths: list[tuple[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stub.paths.append((self.path, self.headers.get("Authorization", "")))
                data = json.dumps({"b64Tgz": ""}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def run_prep(port: int, cert_file: str, name: str) -> subprocess.CompletedProcess:
    env = base.clean_env(
        DET_MASTER=f"https://127.0.0.1:{port}",
        DET_MASTER_CERT_FILE=cert_file,
        DET_MASTER_CERT_NAME=name,
        DET_TASK_ID="1.abc",
        DET_SESSION_TOKEN="tok",
        DTLAB_PREP_RETRIES="0",
    )
    return subprocess.run(
        [sys.executable, str(PREP), sys.executable, "-c", "print('entrypoint ran')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_prep_step_verifies_the_master_then_runs_the_entrypoint(tmp_path, pki):
    stub = ContextDirectoryStub(pki["cert"], pki["key"])
    try:
        ok = run_prep(stub.port, pki["ca"], "lab-master")
        wrong_ca = run_prep(stub.port, pki["other_ca"], "lab-master")
        wrong_name = run_prep(stub.port, pki["ca"], "wrong.example")
    finally:
        stub.close()
    assert ok.returncode == 0 and ok.stdout == "entrypoint ran\n", ok.stderr
    assert stub.paths[0] == ("/api/v1/tasks/1.abc/context_directory", "Bearer tok")
    for result, why in (
        (wrong_ca, "self-signed certificate in certificate chain"),  # the chain ends in its root
        (wrong_name, "Hostname mismatch"),
    ):
        assert result.returncode == 1 and "entrypoint ran" not in result.stdout
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"requests.exceptions.SSLError: HTTPSConnectionPool(host='127.0.0.1', port={stub.port}): "
            "Max retries exceeded with url: /api/v1/tasks/1.abc/context_directory (Caused by SSLError("
        )
        assert "CERTIFICATE_VERIFY_FAILED" in last and why in last


# --------------------------------------------------------------------------- the master, with PostgreSQL


class TLSMasterProcess(base.MasterProcess):
    def __init__(self, tmp: Path, config: dict, ca_file: str, name: str = "master"):
        self.context = ssl.create_default_context(cafile=ca_file)
        super().__init__(tmp, config, name)

    def request(self, method: str, path: str, body: dict | None = None, token: str | None = None):
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.context)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, json.loads(data) if data else None


def tls_config(tmp_path: Path, postgres: dict, cert: str, key: str) -> dict:
    config = base.base_config(tmp_path, postgres["port"])
    config["db"] = dict(postgres)
    config["task_container_defaults"] = base.LAB_TCD
    config["security"]["tls"] = {"cert": cert, "key": key}
    return config


@pytest.mark.pg
def test_master_refuses_to_start_without_a_usable_pair(tmp_path, postgres, pki):
    other = make_server(make_ca(), ["lab-master"])
    mismatched = write(tmp_path / "other.key", other.key_pem(), 0o600)
    for cert, key, cause in (
        (str(tmp_path / "absent.crt"), pki["key"], f"open {tmp_path}/absent.crt: no such file or directory"),
        (pki["cert"], mismatched, "tls: private key does not match public key"),
    ):
        path = tmp_path / "master.yaml"
        path.write_text(json.dumps(tls_config(tmp_path, postgres, cert, key)))
        result = subprocess.run(
            [base.SYSTEM_PYTHON, str(base.MASTER), "--config-file", str(path)],
            env=base.clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 1, result.stdout
        # errors.Wrap(err, "failed to read TLS certificate") as runRoot logs it (%+v).
        assert json.dumps(f"{cause}\nfailed to read TLS certificate") in result.stdout
        assert "accepting incoming connections" not in result.stdout


@pytest.mark.pg
def test_master_serves_tls_only_and_trials_get_its_certificate(tmp_path, postgres, pki, docker):
    master = TLSMasterProcess(tmp_path, tls_config(tmp_path, postgres, pki["cert"], pki["key"]), pki["ca"])
    agents: list[base.AgentProcess] = []
    try:
        master.wait_healthy()
        served = ssl.get_server_certificate(("127.0.0.1", master.port))
        assert ssl.PEM_cert_to_DER_cert(served) == ssl.PEM_cert_to_DER_cert(pki["server"].cert_pem.decode())
        # A plain request is closed without an answer (cmux behind tls.NewListener).
        conn = http.client.HTTPConnection("127.0.0.1", master.port, timeout=10)
        with pytest.raises(http.client.RemoteDisconnected):
            conn.request("GET", "/info")
            conn.getresponse()
        conn.close()

        token = master.login("Admin-Passw0rd")[1]["token"]
        for name, tls in (
            ("good", {"master_cert": pki["ca"], "master_cert_name": "lab-master"}),
            ("bad", {"master_cert": pki["other_ca"], "master_cert_name": "lab-master"}),
        ):
            (tmp_path / name).mkdir()
            agent = run_agent(tmp_path / name, master.port, tls, docker)
            agents.append(agent)
        good, bad = agents
        base.wait_for(lambda: master.agents(token), what="the TLS agent's registration")
        assert bad.wait() == 1
        assert "x509: certificate signed by unknown authority" in bad.output()
        (listed,) = master.agents(token)
        assert listed["id"] == socket.gethostname()

        # The trial's spec, read through the agent protocol by hand: the real agent is
        # disabled so that the trial goes to this reader.
        assert master.request("POST", f"/api/v1/agents/{listed['id']}/disable", {}, token=token)[0] == 200
        assert master.request("GET", "/agents/setup?id=spec-reader")[0] == 200
        devices = [{"id": 0, "brand": base.GPUS[0][1], "uuid": base.GPUS[0][2], "type": "cuda"}]
        assert master.request("POST", "/agents/started?id=spec-reader", {"devices": devices})[0] == 200
        model = [{"path": "train.py", "type": 48, "content": "cHJpbnQoMSk=", "mode": 33188, "mtime": "0"}]
        body = {"config": base.GOOD + "max_restarts: 0\n", "modelDefinition": model, "activate": True}
        status, created = master.request("POST", "/api/v1/experiments", body, token=token)
        assert status == 200, created
        spec = None
        for _ in range(5):
            work = master.request("GET", "/agents/work?id=spec-reader&wait=5")[1]
            if work.get("start"):
                spec = work["start"][0]
                break
        assert spec is not None
        env = dict(item.split("=", 1) for item in spec["env"])
        assert env["DET_USE_TLS"] == "true"
        assert env["DET_MASTER_CERT_FILE"] == "/run/determined/etc/ssl/master.crt"
        files = {f["path"]: f for f in spec["files"]}
        import base64

        chain = base64.b64decode(files["/run/determined/etc/ssl/master.crt"]["content"])
        assert chain == pki["server"].cert_pem + pki["ca_issued"].cert_pem
        assert files["/run/determined/etc/ssl/master.crt"]["mode"] == 0o644
        assert spec["cmd"][:2] == ["python3", "/run/determined/lab/prep_container.py"]
        cluster = json.loads(base64.b64decode(files["/run/determined/info/cluster.json"]["content"]))
        assert cluster["master_cert_file"] == "/run/determined/etc/ssl/master.crt"
        # The prep step's request, with the trial's session.
        status, _ = master.request(
            "GET", f"/api/v1/tasks/{env['DET_TASK_ID']}/context_directory", token=env["DET_SESSION_TOKEN"]
        )
        assert status == 200
    finally:
        for agent in agents:
            agent.kill()
        master.kill()


LEAF = {
    "notBefore": "Jan  1 00:00:00 2020 GMT",
    "notAfter": "Jan  1 00:00:00 2100 GMT",
    "subject": ((("commonName", "lab-master"),),),
    "subjectAltName": (("DNS", "lab-master"), ("DNS", "*.lab.example"), ("IP Address", "10.77.0.10")),
}


@pytest.mark.parametrize(
    ("leaf", "name", "expected"),
    [
        (LEAF, "lab-master", "x509: certificate signed by unknown authority"),
        (LEAF, "gpu1.lab.example", "x509: certificate signed by unknown authority"),
        (
            LEAF,
            "a.gpu1.lab.example",
            "x509: certificate is valid for lab-master, *.lab.example, not a.gpu1.lab.example",
        ),
        (LEAF, "10.77.0.11", "x509: certificate is valid for 10.77.0.10, not 10.77.0.11"),
        (
            {**LEAF, "subjectAltName": (("DNS", "lab-master"),)},
            "10.77.0.10",
            "x509: cannot validate certificate for 10.77.0.10 because it doesn't contain any IP SANs",
        ),
        (
            {k: v for k, v in LEAF.items() if k != "subjectAltName"},
            "lab-master",
            "x509: certificate relies on legacy Common Name field, use SANs instead",
        ),
        (
            {**LEAF, "subjectAltName": (("IP Address", "10.77.0.10"),)},
            "lab-master",
            "x509: certificate is not valid for any names, but wanted to match lab-master",
        ),
        (
            {**LEAF, "notBefore": "Jan  1 00:00:00 2099 GMT"},
            "other",  # the validity period is checked before the name
            "x509: certificate has expired or is not yet valid: current time ",
        ),
    ],
)
def test_agent_verify_errors_follow_crypto_x509(agent_module, leaf, name, expected):
    message = agent_module.go_verify_error(leaf, name)
    assert message.startswith("tls: failed to verify certificate: " + expected), message
