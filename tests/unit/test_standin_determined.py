"""The Determined master and agent stand-ins (tests/lab/standins/determined/).

Without PostgreSQL: the master's strict configuration decoder and the agent against a small
stub master. With a local PostgreSQL (`pg` marker, root, pg_lsclusters): the real master
stand-in, a registered agent with a fake nvidia-smi and a fake Docker socket, and its removal.
"""

from __future__ import annotations

import http.client
import importlib.machinery
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "lab" / "standins" / "determined"
MASTER = STANDINS / "determined-master"
AGENT = STANDINS / "determined-agent"
SYSTEM_PYTHON = "/usr/bin/python3"  # what the nodes run; it has Debian's psycopg2 and yaml

GPUS = [(i, "NVIDIA A100-SXM4-80GB", f"GPU-{i:08x}-1111-2222-3333-{i:012x}") for i in range(8)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(path: Path) -> types.ModuleType:
    loader = importlib.machinery.SourceFileLoader(path.name.replace("-", "_"), str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "DTLAB_", "AWS_", "DOCKER_"))}
    env.update(extra)
    return env


def run_master(tmp_path: Path, config: dict | str, **env: str) -> subprocess.CompletedProcess:
    path = tmp_path / "master.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, str(MASTER), "--config-file", str(path)],
        env=clean_env(DTLAB_DB_CONNECT_TRIES="1", DTLAB_DB_RETRY_SECONDS="0", **env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def base_config(tmp_path: Path, db_port: int) -> dict:
    return {
        "port": free_port(),
        "log": {"color": False},
        "cache": {"cache_dir": str(tmp_path / "cache")},
        "db": {
            "user": "determined",
            "password": "db-Secret-1",
            "host": "127.0.0.1",
            "port": db_port,
            "name": "determined",
        },
        "checkpoint_storage": {
            "type": "s3",
            "bucket": "det-checkpoints",
            "access_key": "minio-access",
            "secret_key": "minio-Secret-Key-1",
            "endpoint_url": "http://127.0.0.1:9000",
            "prefix": "lab",
            "save_experiment_best": 0,
            "save_trial_best": 1,
            "save_trial_latest": 1,
        },
        "security": {"initial_user_password": "Admin-Passw0rd"},
        "task_container_defaults": {"environment_variables": ["AWS_DEFAULT_REGION=eu-west-3"]},
    }


# --------------------------------------------------------------------------- master config


def test_first_lines_say_what_they_stand_in_for():
    for path in (MASTER, AGENT):
        first = path.read_text().splitlines()[0]
        assert first.startswith("#!/usr/bin/env -S python3") and "Lab stand-in for /usr/bin/" in first
        assert os.access(path, os.X_OK)
    for name in (
        "build.py",
        "master.yaml",
        "agent.yaml",
        "determined-master.service",
        "determined-agent.service",
        "determined-master.socket",
    ):
        assert (STANDINS / name).read_text().startswith("# Lab stand-in")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["checkpoint_storage"].update(region="us-east-1"), 'json: unknown field "region"'),
        (lambda c: c.update(regionn="x"), 'json: unknown field "regionn"'),
        (lambda c: c["db"].update(sslmode="disable"), 'json: unknown field "sslmode"'),
        (lambda c: c.update(log={"level": "info", "colour": True}), 'json: unknown field "colour"'),
        (
            lambda c: c.update(resource_manager={"type": "agent", "schedulr": {}}),
            'json: unknown field "schedulr"',
        ),
        (
            lambda c: c.update(cluster_name=["a"]),
            "json: cannot unmarshal array into Go struct field Config.cluster_name of type string",
        ),
        (lambda c: c["checkpoint_storage"].update(type="s4"), "unexpected type: s4"),
    ],
)
def test_master_rejects_what_the_real_decoder_rejects(tmp_path, mutate, expected):
    config = base_config(tmp_path, free_port())
    mutate(config)
    result = run_master(tmp_path, config)
    assert result.returncode == 1
    assert expected in result.stdout.replace('\\"', '"')
    assert "cannot unmarshal configuration" in result.stdout
    assert "connecting to database" not in result.stdout


def test_master_unknown_key_message_is_logrus_colored_by_default(tmp_path):
    config = base_config(tmp_path, free_port())
    del config["log"]
    config["checkpoint_storage"]["region"] = "us-east-1"
    result = run_master(tmp_path, config)
    assert result.returncode == 1
    first, second = result.stdout.splitlines()[:2]
    assert first.startswith("\x1b[31mERRO\x1b[0m[")
    assert first.rstrip().endswith(
        'error unmarshaling JSON: while decoding JSON: json: unknown field "region"'
    )
    assert second.strip() == "cannot unmarshal configuration"


def test_master_is_lenient_where_the_real_one_is(tmp_path):
    """task_container_defaults and resource pools are decoded with plain json.Unmarshal."""
    config = base_config(tmp_path, free_port())
    config["task_container_defaults"]["not_a_real_key"] = 1
    config["resource_pools"] = [{"pool_name": "default", "whatever": True}]
    config["port"] = "8081"  # viper casts registered keys
    result = run_master(tmp_path, config)
    assert result.returncode == 1  # no database here
    assert f"connecting to database 127.0.0.1:{config['db']['port']}" in result.stdout
    logged = json.loads(result.stdout.splitlines()[0].split("msg=", 1)[1])
    logged = json.loads(logged.split("master configuration: ", 1)[1])
    assert logged["port"] == 8081
    # Secrets never reach the log.
    for secret in ("db-Secret-1", "minio-Secret-Key-1", "Admin-Passw0rd", "minio-access"):
        assert secret not in result.stdout + result.stderr
    assert logged["db"]["password"] == "********"


def test_master_lab_rule_s3_needs_endpoint(tmp_path):
    config = base_config(tmp_path, free_port())
    del config["checkpoint_storage"]["endpoint_url"]
    result = run_master(tmp_path, config)
    assert result.returncode == 1
    assert "'endpoint_url' must be set" in result.stdout


def test_master_environment_overrides_registered_keys(tmp_path):
    config = base_config(tmp_path, free_port())
    result = run_master(tmp_path, config, DET_DB_HOST="127.0.0.2", DET_PORT="9999")
    assert "connecting to database 127.0.0.2:" in result.stdout
    assert '\\"port\\":9999' in result.stdout


def test_master_shipped_default_config_parses(tmp_path):
    result = run_master(tmp_path, (STANDINS / "master.yaml").read_text())
    assert result.returncode == 1
    assert "connecting to database :5432" in result.stdout


# --------------------------------------------------------------------------- agent fixtures


def write_fake_nvidia_smi(bin_dir: Path) -> None:
    """nvidia-smi as the agent calls it, including --id=<visible_gpus> filtering."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import sys
            GPUS = {GPUS!r}
            args = sys.argv[1:]
            query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), "")
            ids = next((a.split("=", 1)[1] for a in args if a.startswith("--id=")), "")
            wanted = [g for g in GPUS if not ids or str(g[0]) in ids.split(",") or g[2] in ids.split(",")]
            for index, name, uuid in wanted:
                if query == "driver_version":
                    print("515.65.01")
                elif query == "mig.mode.current":
                    print("[N/A]")
                elif query == "index,name,uuid":
                    print(f"{{index}}, {{name}}, {{uuid}}")
                else:
                    sys.exit(2)
            """
        )
    )
    script.chmod(0o755)


class FakeDocker:
    """A Docker engine socket that answers what the agent asks: /_ping, containers/json and a
    pull (POST /images/create, its progress lines); every request is kept in `seen`."""

    def __init__(self, path: Path):
        self.path = path
        seen: list[tuple[str, str]] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def address_string(self):
                return "docker-client"

            def do_POST(self):
                seen.append(("POST", self.path))
                body = b'{"status":"Pulling"}\n{"status":"Digest: sha256:0"}\n'
                self.send_response(200 if self.path.startswith("/v1.41/images/create?") else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                seen.append(("GET", self.path))
                if self.path == "/_ping":
                    body, headers = b"OK", {"API-Version": "1.41", "Content-Type": "text/plain"}
                elif self.path.startswith("/v1.41/containers/json"):
                    body, headers = b"[]", {"Content-Type": "application/json"}
                else:
                    body, headers = b'{"message":"page not found"}', {}
                    self.send_response(404)
                if body != b'{"message":"page not found"}':
                    self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(str(path), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class AgentProcess:
    def __init__(self, tmp: Path, options: dict, docker: Path | None, name: str = "agent"):
        bin_dir = tmp / "bin"
        write_fake_nvidia_smi(bin_dir)
        self.config = tmp / f"{name}.yaml"
        self.config.write_text(yaml.safe_dump(options))
        self.log = tmp / f"{name}.log"
        env = clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
        env["DOCKER_HOST"] = f"unix://{docker or tmp / 'no-docker.sock'}"
        self.proc = subprocess.Popen(
            [sys.executable, str(AGENT), "run", "--config-file", str(self.config)],
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float = 20) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def docker(tmp_path):
    fake = FakeDocker(tmp_path / "docker.sock")
    yield fake.path
    fake.close()


class StubMaster:
    """Records the agent protocol calls; no database needed."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict]] = []
        self.forget_agent = threading.Event()  # answer the next heartbeat as a restarted master
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def handle_call(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                stub.calls.append((self.command, self.path, body))
                reply = {"heartbeat_seconds": 0.2} if self.path.startswith("/agents/setup") else {}
                status = 200
                if self.path.startswith("/agents/heartbeat") and stub.forget_agent.is_set():
                    stub.forget_agent.clear()
                    status, reply = 404, {"message": "agent is not connected; reconnect"}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = handle_call

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [f"{m} {p.split('?')[0]}" for m, p, _ in self.calls]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_master():
    stub = StubMaster()
    yield stub
    stub.close()


def wait_for(predicate, timeout: float = 15, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# --------------------------------------------------------------------------- agent


def test_agent_registers_visible_gpus_heartbeats_and_says_goodbye(tmp_path, stub_master, docker):
    agent = AgentProcess(
        tmp_path,
        {
            "master_host": "localhost",
            "master_port": stub_master.port,
            "agent_id": "lab-gpu9",
            "slot_type": "cuda",
            "visible_gpus": "0,1,2,3",
            "log": {"color": False},
        },
        docker,
    )
    try:
        wait_for(lambda: "POST /agents/heartbeat" in stub_master.paths(), what="a heartbeat")
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.wait() == 0
    finally:
        agent.kill()
    paths = stub_master.paths()
    assert paths[:2] == ["GET /agents/setup", "POST /agents/started"]
    # The goodbye is the last call but for a work poll already in flight when SIGTERM came
    # (its thread's request can reach the stub after the goodbye on a loaded machine).
    goodbye = paths.index("DELETE /agents")
    assert set(paths[goodbye + 1 :]) <= {"GET /agents/work"}, paths[goodbye:]
    started = next(body for m, p, body in stub_master.calls if p.startswith("/agents/started"))
    assert [d["id"] for d in started["devices"]] == [0, 1, 2, 3]
    assert started["devices"][0] == {"id": 0, "brand": GPUS[0][1], "uuid": GPUS[0][2], "type": "cuda"}
    assert "id=lab-gpu9" in stub_master.calls[0][1] and "resource_pool=default" in stub_master.calls[0][1]
    out = agent.output()
    assert "Nvidia driver version: 515.65.01" in out
    assert f"connecting to master at: ws://localhost:{stub_master.port}/agents?id=lab-gpu9" in out


def test_agent_reconnects_when_the_master_forgot_it(tmp_path, stub_master, docker):
    agent = AgentProcess(
        tmp_path,
        {
            "master_host": "127.0.0.1",
            "master_port": stub_master.port,
            "agent_id": "lab-gpu9",
            "slot_type": "none",
            "agent_reconnect_backoff": 0,
        },
        docker,
    )
    try:
        wait_for(lambda: "POST /agents/heartbeat" in stub_master.paths(), what="a heartbeat")
        stub_master.forget_agent.set()
        wait_for(lambda: stub_master.paths().count("POST /agents/started") == 2, what="re-registration")
        assert any("reconnect=true" in p for m, p, _ in stub_master.calls if p.startswith("/agents/setup"))
        started = [body for m, p, body in stub_master.calls if p.startswith("/agents/started")]
        assert started[-1]["devices"] == []  # slot_type none
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.wait() == 0
    finally:
        agent.kill()


def test_agent_without_docker_fails_with_the_docker_clients_message(tmp_path, stub_master):
    agent = AgentProcess(tmp_path, {"master_host": "127.0.0.1", "master_port": stub_master.port}, None)
    try:
        assert agent.wait() == 1
    finally:
        agent.kill()
    assert "Cannot connect to the Docker daemon at unix://" in agent.output()
    assert "POST /agents/started" not in stub_master.paths()


def test_agent_default_port_is_80_and_refused_connection_is_fatal(tmp_path, docker):
    agent = AgentProcess(tmp_path, {"master_host": "127.0.0.1", "log": {"color": False}}, docker)
    try:
        assert agent.wait() == 1
    finally:
        agent.kill()
    out = agent.output()
    assert "connecting to master at: ws://127.0.0.1:80/agents?" in out
    assert "initial connection to master failed: error dialing master: dial tcp 127.0.0.1:80" in out


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"master_host": "m", "master_prot": 8080}, 'json: unknown field "master_prot"'),
        ({"master_port": 8080}, "master host must be provided"),
        ({"master_host": "m", "slot_type": "tpu"}, "tpu must be in [gpu cuda rocm cpu auto none]"),
        ({"master_host": "m", "security": {"tls": {"enable": True}}}, 'json: unknown field "enable"'),
    ],
)
def test_agent_config_errors_are_fatal(tmp_path, options, expected):
    agent = AgentProcess(tmp_path, options, None)
    try:
        assert agent.wait() == 1
    finally:
        agent.kill()
    assert expected in agent.output()


def test_agent_unresolvable_master_reports_like_go(monkeypatch):
    """A lookup failure, without sending a DNS query anywhere (the lookup is replaced)."""
    module = load(AGENT)

    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(module.socket, "getaddrinfo", no_such_host)
    monkeypatch.setattr(module, "nameserver", lambda: "10.77.0.1:53")
    link = module.MasterLink(
        {
            "master_host": "lab-master",
            "master_port": 8080,
            "agent_id": "a",
            "resource_pool": "default",
            "security": {"tls": {"enabled": False}},
        }
    )
    with pytest.raises(module.MasterError) as err:
        link.connect(reconnect=False)
    assert str(err.value) == "error dialing master: dial tcp: lookup lab-master on 10.77.0.1:53: no such host"


def test_agent_version_commands():
    out = subprocess.run(
        [sys.executable, str(AGENT), "version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("Determined agent 0.38.0 (built with go1.22")
    out = subprocess.run(
        [sys.executable, str(MASTER), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out == "determined-master version 0.38.0\n"


# --------------------------------------------------------------------------- packages


def test_mirror_build_makes_both_packages_deterministically(tmp_path):
    from tests.lab import debs
    from tests.lab.standins.determined import build

    ctx = types.SimpleNamespace(
        mirror_dir=tmp_path / "mirror",
        base_url="http://10.77.0.1:8077",
        work_dir=tmp_path / "work",
        build_deb=debs.build_deb,
    )
    first = [p.read_bytes() for p in build.build(ctx)]
    paths = build.build(ctx)
    assert [p.name for p in paths] == [
        "determined-master_0.38.0_linux_amd64.deb",
        "determined-agent_0.38.0_linux_amd64.deb",
    ]
    assert [p.read_bytes() for p in paths] == first
    if shutil.which("dpkg-deb"):
        info = subprocess.run(
            ["dpkg-deb", "-I", str(paths[0])], capture_output=True, text=True, check=True
        ).stdout
        assert "Package: determined-master" in info and "Version: 0.38.0" in info
        assert "python3-psycopg2" in info
        listing = subprocess.run(
            ["dpkg-deb", "-c", str(paths[0])], capture_output=True, text=True, check=True
        ).stdout
        assert "-rw------- root/root" in next(line for line in listing.splitlines() if "master.yaml" in line)
        assert "./lib/systemd/system/determined-master.service" in listing
        conffiles = subprocess.run(
            ["dpkg-deb", "-f", str(paths[1]), "Package"], capture_output=True, text=True, check=True
        ).stdout
        assert conffiles.strip() == "determined-agent"


# --------------------------------------------------------------------------- with PostgreSQL


def _system_python_has_psycopg2() -> bool:
    return (
        os.path.exists(SYSTEM_PYTHON)
        and subprocess.run(
            [SYSTEM_PYTHON, "-c", "import psycopg2, yaml"], capture_output=True, check=False
        ).returncode
        == 0
    )


def _psql(port: int, sql: str, database: str = "postgres") -> None:
    # SQL on stdin, so that the throwaway password is on no command line.
    subprocess.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            "psql",
            "-q",
            "-p",
            str(port),
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            database,
            "-f",
            "-",
        ],
        input=sql,
        text=True,
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def postgres():
    if os.geteuid() != 0 or not shutil.which("pg_lsclusters") or not shutil.which("runuser"):
        pytest.skip("needs root and a local PostgreSQL (apt-get install postgresql)")
    if not _system_python_has_psycopg2():
        pytest.skip("needs python3-psycopg2 and python3-yaml for /usr/bin/python3")
    clusters = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    clusters = [c.split() for c in clusters if c.strip()]
    if not clusters:
        pytest.skip("no PostgreSQL cluster (pg_createcluster)")
    version, name, port, status = clusters[0][:4]
    started = status != "online"
    if started:
        subprocess.run(["pg_ctlcluster", version, name, "start"], check=True)
    role = "dtlab_" + secrets.token_hex(4)
    password = secrets.token_urlsafe(18)
    _psql(
        int(port), f"CREATE ROLE {role} LOGIN PASSWORD '{password}';\nCREATE DATABASE {role} OWNER {role};\n"
    )
    yield {"user": role, "password": password, "host": "127.0.0.1", "port": int(port), "name": role}
    _psql(int(port), f"DROP DATABASE IF EXISTS {role} WITH (FORCE);\nDROP ROLE IF EXISTS {role};\n")
    # Under pytest-xdist another worker's copy of this fixture may still be using the cluster.
    if started and "PYTEST_XDIST_WORKER" not in os.environ:
        subprocess.run(["pg_ctlcluster", version, name, "stop"], check=False)


class MasterProcess:
    def __init__(self, tmp: Path, config: dict, name: str = "master"):
        self.port = config["port"]
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.log = tmp / f"{name}.log"
        env = clean_env(
            DTLAB_AGENT_HEARTBEAT_TIMEOUT="2",
            AWS_ACCESS_KEY_ID="minio-access",
            AWS_SECRET_ACCESS_KEY="minio-Secret-Key-1",
        )
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, str(MASTER), "--config-file", str(path)],
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def request(self, method: str, path: str, body: dict | None = None, token: str | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, json.loads(data) if data else None

    def wait_healthy(self):
        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"master exited:\n{self.log.read_text()}")
            try:
                return self.request("GET", "/health")[0] == 200
            except OSError:
                return False

        wait_for(up, 30, "the master's /health")

    def login(self, password: str) -> tuple[int, dict]:
        return self.request("POST", "/api/v1/auth/login", {"username": "admin", "password": password})

    def agents(self, token: str) -> list[dict]:
        status, body = self.request("GET", "/api/v1/agents", token=token)
        assert status == 200
        return body["agents"]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.pg
def test_master_with_postgres_and_an_agent(tmp_path, postgres, docker):
    config = base_config(tmp_path, postgres["port"])
    config["db"] = dict(postgres)
    config["cluster_name"] = "lab"
    config["resource_pools"] = [{"pool_name": "default", "agent_reconnect_wait": "1s"}]
    master = MasterProcess(tmp_path, config)
    agents: list[AgentProcess] = []
    try:
        master.wait_healthy()
        status, info = master.request("GET", "/info")
        assert status == 200 and info["version"] == "0.38.0" and info["cluster_name"] == "lab"
        status, health = master.request("GET", "/health")
        assert health["database"] == "up" and health["status"] == "up"
        status, about = master.request("GET", "/api/v1/master")
        assert about["clusterId"] == info["cluster_id"] and about["masterId"] == info["master_id"]
        assert about["labStandin"]["awsEnvironment"] == {
            "AWS_ACCESS_KEY_ID": True,
            "AWS_SECRET_ACCESS_KEY": True,
            "AWS_DEFAULT_REGION": False,
        }
        assert "minio-Secret-Key-1" not in json.dumps(about)

        status, denied = master.login("wrong-password")
        assert status == 401 and denied == {
            "error": {"code": 16, "reason": "Unauthenticated", "error": "invalid credentials"}
        }
        status, login = master.login("Admin-Passw0rd")
        assert status == 200 and login["user"]["username"] == "admin" and login["user"]["admin"]
        token = login["token"]
        assert master.request("GET", "/api/v1/agents")[0] == 401
        assert master.request("GET", "/api/v1/agents", token="v2.public.forged")[0] == 401
        status, conf = master.request("GET", "/api/v1/master/config", token=token)
        assert conf["config"]["checkpoint_storage"]["secret_key"] == "********"
        assert master.agents(token) == []

        options = {
            "master_host": "localhost",
            "master_port": master.port,
            "slot_type": "cuda",
            "visible_gpus": "0,1,2,3",
            "log": {"color": False},
        }
        agents.append(AgentProcess(tmp_path, {**options, "agent_id": "lab-gpu1"}, docker, "gpu1"))
        agents.append(
            AgentProcess(tmp_path, {**options, "agent_id": "lab-gpu2", "visible_gpus": ""}, docker, "gpu2")
        )
        listed = wait_for(lambda: len(master.agents(token)) == 2 and master.agents(token), what="2 agents")
        gpu1, gpu2 = listed
        assert gpu1["id"] == "lab-gpu1" and gpu1["enabled"] and gpu1["resourcePools"] == ["default"]
        assert gpu1["addresses"] == ["127.0.0.1"] and gpu1["version"] == "0.38.0"
        assert sorted(gpu1["slots"]) == [f"/agents/lab-gpu1/slots/{i}" for i in range(4)]
        slot = gpu1["slots"]["/agents/lab-gpu1/slots/0"]
        assert slot == {
            "id": "0",
            "device": {"id": 0, "brand": GPUS[0][1], "uuid": GPUS[0][2], "type": "TYPE_CUDA"},
            "enabled": True,
            "container": None,
            "draining": False,
        }
        assert gpu1["slotStats"]["typeStats"]["TYPE_CUDA"]["total"] == 4
        assert len(gpu2["slots"]) == 8
        status, one = master.request("GET", "/api/v1/agents/lab-gpu2", token=token)
        assert status == 200 and one["agent"]["id"] == "lab-gpu2"

        # SIGTERM: a graceful close; the agent is disabled at once and removed after
        # the pool's agent_reconnect_wait (1 s here, 25 s by default).
        agents[0].proc.send_signal(signal.SIGTERM)
        assert agents[0].wait() == 0
        gpu1 = next(a for a in master.agents(token) if a["id"] == "lab-gpu1")
        assert not gpu1["enabled"] and gpu1["draining"]
        wait_for(lambda: [a["id"] for a in master.agents(token)] == ["lab-gpu2"], 10, "lab-gpu1's removal")

        # An agent that vanishes (no goodbye) is dropped once its heartbeats stop.
        agents[1].proc.send_signal(signal.SIGKILL)
        agents[1].wait()
        wait_for(lambda: master.agents(token) == [], 15, "lab-gpu2's removal")

        # A second master on the same port: the error the real one logs, and exit 1.
        clash = MasterProcess(tmp_path, config, "clash")
        assert clash.proc.wait(timeout=30) == 1
        assert f"listen tcp :{master.port}: bind: address already in use" in clash.log.read_text()

        assert master.stop() == 0
    finally:
        for agent in agents:
            agent.kill()
        master.kill()

    # Restart with another initial password: it only applies on the first boot.
    config["security"]["initial_user_password"] = "Other-Passw0rd"
    again = MasterProcess(tmp_path, config, "again")
    try:
        again.wait_healthy()
        assert again.login("Other-Passw0rd")[0] == 401
        assert again.login("Admin-Passw0rd")[0] == 200
        status, info2 = again.request("GET", "/info")
        assert info2["cluster_id"] == info["cluster_id"] and info2["master_id"] != info["master_id"]
    finally:
        again.kill()
    assert "Admin-Passw0rd" not in (tmp_path / "master.log").read_text()


@pytest.mark.pg
def test_health_turns_503_when_the_database_goes_away(tmp_path, postgres):
    """The database stays up for the other tests; the master's role loses its login instead."""
    config = base_config(tmp_path, postgres["port"])
    config["db"] = dict(postgres)
    master = MasterProcess(tmp_path, config)
    try:
        master.wait_healthy()
        _psql(
            postgres["port"],
            f"ALTER ROLE {postgres['user']} NOLOGIN;\n"
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE usename = '{postgres['user']}';\n",
        )
        status, body = master.request("GET", "/health")
        assert status == 503 and body["database"] == "down" and body["status"] == "down"
    finally:
        _psql(postgres["port"], f"ALTER ROLE {postgres['user']} LOGIN;\n")
        master.kill()


# --------------------------------------------------------------------------- experiments and trials

TRIALS = STANDINS / "lab_trials.py"
LAB_TCD = {
    "image": {"cuda": "registry/gpu:1", "cpu": "registry/cpu:1"},
    "environment_variables": ["AWS_DEFAULT_REGION=eu-west-3", "SHARED=default"],
    "devices": [{"host_path": "/dev/infiniband", "container_path": "/dev/infiniband"}],
    "add_capabilities": ["IPC_LOCK"],
    "dtrain_network_interface": "ib0",
}
LAB_STORAGE = {
    "type": "s3",
    "bucket": "b",
    "access_key": "k",
    "secret_key": "s",
    "endpoint_url": "http://m:9000",
}
GOOD = "entrypoint: python3 train.py\nsearcher: {name: single, metric: loss, max_length: 1}\n"


@pytest.fixture(scope="module")
def trials():
    return load(TRIALS)


def refusal(trials, text: str) -> str:
    with pytest.raises(trials.ExpConfigError) as info:
        trials.parse_config(text)
    return str(info.value)


def test_experiment_config_unknown_keys_get_the_schema_errors(trials):
    region = refusal(trials, GOOD + "checkpoint_storage: {type: s3, bucket: b, region: us-east-1}\n")
    line = '<config>.checkpoint_storage: additionalProperties "region" not allowed'
    # checkpoint-storage.json and its s3 union variant both refuse it (schemas/util.go renders both).
    assert region == (
        "invalid experiment configuration: version 0 experiment config is invalid: config is invalid: "
        f"{line}\n{line}"
    )
    assert refusal(trials, GOOD + "gpu_affinity: true\n").endswith(
        '<config>: additionalProperties "gpu_affinity" not allowed'
    )
    assert refusal(trials, GOOD + "resources: {gpu_affinity: 1}\n").endswith(
        '<config>.resources: additionalProperties "gpu_affinity" not allowed'
    )
    # A key of another searcher is unknown to the single searcher's variant only: once.
    assert refusal(trials, GOOD.replace("max_length: 1", "max_trials: 2")).endswith(
        'config is invalid: <config>.searcher: additionalProperties "max_trials" not allowed'
    )
    assert refusal(trials, GOOD + "resources: {slots: 2}\n") == (
        '<config>.resources: additionalProperties "slots" not allowed'
    )
    assert refusal(trials, "version: 1\n") == "invalid experiment configuration: invalid version: 1"


def test_experiment_config_merges_task_container_defaults_and_storage(trials):
    config = trials.parse_config(
        GOOD
        + "environment: {environment_variables: [SHARED=mine], image: {cpu: my/cpu:2}}\n"
        + "resources: {devices: [{host_path: /dev/fuse, container_path: /dev/infiniband}]}\n"
        + "checkpoint_storage: {type: s3, prefix: mine}\n"
    )
    merged = trials.merge_config(config, LAB_TCD, LAB_STORAGE)
    # EnvironmentVariablesMapV0.Merge: the defaults first, the experiment's after (they win).
    assert merged["environment"]["environment_variables"]["cuda"] == [
        "AWS_DEFAULT_REGION=eu-west-3",
        "SHARED=default",
        "SHARED=mine",
    ]
    assert merged["environment"]["image"] == {"cuda": "registry/gpu:1", "cpu": "my/cpu:2"}
    assert merged["environment"]["add_capabilities"] == ["IPC_LOCK"]
    # DevicesConfigV0.Merge: the experiment's container path wins, no duplicate.
    assert merged["resources"]["devices"] == [{"host_path": "/dev/fuse", "container_path": "/dev/infiniband"}]
    # A union merge: same type, the master's fields fill the experiment's gaps.
    assert merged["checkpoint_storage"] == {
        **LAB_STORAGE,
        "prefix": "mine",
        "save_experiment_best": 0,
        "save_trial_best": 1,
        "save_trial_latest": 1,
    }
    assert merged["max_restarts"] == 5 and merged["resources"]["slots_per_trial"] == 1
    assert trials.completeness_errors(merged) == []
    other = trials.merge_config(
        trials.parse_config(GOOD + "checkpoint_storage: {type: shared_fs, host_path: /x}\n"),
        LAB_TCD,
        LAB_STORAGE,
    )
    assert other["checkpoint_storage"]["type"] == "shared_fs" and "bucket" not in other["checkpoint_storage"]


def test_experiment_config_completeness(trials):
    config = trials.parse_config("entrypoint: x\nsearcher: {name: single}\n")
    errors = trials.completeness_errors(trials.merge_config(config, LAB_TCD, LAB_STORAGE))
    assert errors == ["<config>.searcher: metric is a required property"] * 2
    assert trials.hparams_of({"lr": 0.1, "n": {"type": "const", "val": 3}, "opt": {"beta": 1}}) == {
        "lr": 0.1,
        "n": 3,
        "opt": {"beta": 1},
    }
    with pytest.raises(trials.ExpConfigError):
        trials.hparams_of({"lr": {"type": "double", "minval": 0, "maxval": 1}})


def lab_agents(**used) -> list[dict]:
    sizes = {"lab-gpu1-0": 4, "lab-gpu1-1": 4, "lab-gpu2-0": 8, "lab-gpu3": 8}
    return [
        {"id": a, "slots": n, "used": used.get(a.replace("-", "_"), 0), "usable": True}
        for a, n in sizes.items()
    ]


def test_fitting_follows_the_real_best_fit(trials):
    fits = trials.find_fits
    one = fits(1, lab_agents(), "1.a.1")
    assert len(one) == 1 and one[0][0] in ("lab-gpu1-0", "lab-gpu1-1")  # the fullest that fits
    assert fits(8, lab_agents(), "x")[0][1] == 8 and len(fits(8, lab_agents(), "x")) == 1
    assert sorted(fits(16, lab_agents(), "x")) == [("lab-gpu2-0", 8), ("lab-gpu3", 8)]
    assert fits(12, lab_agents(), "x") == []  # not a multiple of one agent size
    assert fits(16, lab_agents(lab_gpu3=1), "x") == []  # dedicated fits need idle agents
    assert sorted(fits(8, lab_agents(lab_gpu2_0=1, lab_gpu3=1), "x")) == [
        ("lab-gpu1-0", 4),
        ("lab-gpu1-1", 4),
    ]
    disabled = [{**a, "usable": a["id"] != "lab-gpu3"} for a in lab_agents()]
    assert fits(16, disabled, "x") == []
    assert fits(8, lab_agents(), "x", single_agent=True)[0][1] == 8


def test_agent_builds_the_docker_request_and_the_archive(tmp_path):
    import io
    import tarfile

    agent = load(AGENT)
    opts = {
        "agent_id": "lab-gpu1-0",
        "master_host": "lab-master",
        "master_port": 8080,
        "container_master_host": "10.0.0.1",
        "container_master_port": 0,
        "http_proxy": "",
        "https_proxy": "http://proxy:3128",
        "ftp_proxy": "",
        "no_proxy": "",
    }
    runtime = agent.Runtime(opts, None, {"master_info": {"cluster_id": "c1", "master_id": "m1"}})
    spec = {
        "container_id": "cid",
        "description": "exp-1-trial-1-attempt-1",
        "image": "img",
        "env": ["DET_TRIAL_ID=1"],
        "cmd": ["sh", "-c", "true"],
        "workdir": "/run/determined/workdir",
        "network_mode": "host",
        "mounts": [],
        "shm_size": 4294967296,
        "cap_add": ["IPC_LOCK"],
        "cap_drop": [],
        "devices": [],
        "slots": [{"id": 2, "uuid": "GPU-2", "type": "cuda"}, {"id": 3, "uuid": "GPU-3", "type": "cuda"}],
    }
    body = runtime.create_body(spec)
    # The master's variables, then addProxyInfo, makeGlobalEnvVars and containerEnv (spec.go).
    assert body["Env"] == [
        "DET_TRIAL_ID=1",
        "HTTPS_PROXY=http://proxy:3128",
        "DET_CLUSTER_ID=c1",
        "DET_MASTER_ID=m1",
        "DET_MASTER=http://10.0.0.1:8080",
        "DET_MASTER_HOST=10.0.0.1",
        "DET_MASTER_ADDR=10.0.0.1",
        "DET_MASTER_PORT=8080",
        "DET_AGENT_ID=lab-gpu1-0",
        "DET_CONTAINER_ID=cid",
        "DET_SLOT_IDS=[2,3]",
    ]
    assert body["HostConfig"]["DeviceRequests"] == [
        {"Driver": "nvidia", "Capabilities": [["gpu", "compute", "utility"]], "DeviceIDs": ["GPU-2", "GPU-3"]}
    ]
    assert body["Labels"]["ai.determined.container.devices"] == "2,3"
    assert body["Labels"]["ai.determined.container.type"] == "task-container"
    files = [
        {"path": "/run/determined/ssh", "dir": True, "mode": 0o700},
        {"path": "/run/determined/ssh/id_rsa", "content": "a2V5", "mode": 0o600},
        {
            "path": "/run/determined/info/cluster.json",
            "content": "eyJtYXN0ZXJfdXJsIjogbnVsbH0=",
            "mode": 0o644,
        },
    ]
    with tarfile.open(fileobj=io.BytesIO(agent.build_archive(files, "http://m:8080", "gpu1"))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["run/determined/ssh"].isdir() and members["run/determined/ssh/id_rsa"].mode == 0o600
        assert tar.extractfile("run/determined/ssh/id_rsa").read() == b"key"
        cluster = json.loads(tar.extractfile("run/determined/info/cluster.json").read())
        assert cluster == {"master_url": "http://m:8080", "agent_id": "gpu1"}
    assert agent.image_ref("10.77.0.1:5000/a/b:t@sha256:ff") == ("10.77.0.1:5000/a/b:t", "sha256:ff")
    assert agent.image_ref("10.77.0.1:5000/a/b") == ("10.77.0.1:5000/a/b", "latest")


@pytest.mark.pg
def assert_info_files_load_in_the_harness(files: list[dict]) -> None:
    """The master's info files, as the agent copies them in (build_archive fills in its own
    DET_MASTER and DET_AGENT_ID), construct the real harness's ClusterInfo, TrialInfo,
    RendezvousInfo and ResourcesInfo: a key the harness does not take, or one it requires and
    the file lacks, is the TypeError det.get_cluster_info() raises in the trial."""
    import io
    import tarfile

    from determined import _info

    agent = load(AGENT)
    with tarfile.open(fileobj=io.BytesIO(agent.build_archive(files, "http://m:8080", "gpu1"))) as tar:
        infos = {
            Path(m.name).name: json.loads(tar.extractfile(m).read())  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.name.startswith("run/determined/info/")
        }
    assert set(infos) == {"cluster.json", "trial.json", "rendezvous.json", "resources.json"}
    cluster = _info.ClusterInfo(
        trial_info=_info.TrialInfo(**infos["trial.json"]),
        rendezvous_info=_info.RendezvousInfo(**infos["rendezvous.json"]),
        resources_info=_info.ResourcesInfo(**infos["resources.json"]),
        **infos["cluster.json"],
    )
    assert cluster.agent_id == "gpu1" and cluster.master_url == "http://m:8080"
    assert cluster.trial.trial_id >= 1 and cluster.task_type == "TRIAL"


def test_master_runs_an_experiment_through_the_agent_protocol(tmp_path, postgres):
    """A fake agent speaks the lab protocol: the master places the trial, hands over the
    container spec, takes its states and output, and ends the experiment."""
    config = base_config(tmp_path, postgres["port"])
    config["db"] = dict(postgres)
    config["task_container_defaults"] = LAB_TCD
    master = MasterProcess(tmp_path, config)
    try:
        master.wait_healthy()
        token = master.login("Admin-Passw0rd")[1]["token"]
        devices = [{"id": i, "brand": b, "uuid": u, "type": "cuda"} for i, b, u in GPUS[:4]]
        assert master.request("GET", "/agents/setup?id=gpu1")[0] == 200
        assert (
            master.request("POST", "/agents/started?id=gpu1", {"devices": devices, "version": "0.38.0"})[0]
            == 200
        )

        def create(text: str):
            model = [{"path": "train.py", "type": 48, "content": "cHJpbnQoMSk=", "mode": 33188, "mtime": "0"}]
            return master.request(
                "POST",
                "/api/v1/experiments",
                {"config": text, "modelDefinition": model, "activate": True},
                token=token,
            )

        status, body = create(GOOD + "checkpoint_storage: {type: s3, region: x}\n")
        assert status == 500 and body["error"]["reason"] == "Internal"
        assert '"region" not allowed' in body["error"]["error"]
        status, body = create(GOOD + "resources: {slots_per_trial: 5}\n")
        assert (
            body["error"]["error"]
            == "invalid resource configuration: slots requested exceeds cluster capacity"
        )
        status, body = create(GOOD.replace("entrypoint: python3 train.py\n", ""))
        assert body["error"]["error"] == "managed experiments require entrypoint"

        status, body = create(GOOD + "max_restarts: 0\nresources: {slots_per_trial: 2}\n")
        assert status == 200, body
        exp_id = body["experiment"]["id"]
        assert body["config"]["checkpoint_storage"]["secret_key"] == "********"
        status, work = master.request("GET", "/agents/work?id=gpu1&wait=10")
        (spec,) = work["start"]
        env = dict(item.split("=", 1) for item in spec["env"])
        assert env["DET_TASK_TYPE"] == "TRIAL" and env["DET_EXPERIMENT_ID"] == str(exp_id)
        assert env["DET_INTER_NODE_NETWORK_INTERFACE"] == "ib0"
        assert (
            json.loads(env["DET_EXPERIMENT_CONFIG"])["checkpoint_storage"]["secret_key"]
            == "minio-Secret-Key-1"
        )
        # task_container_defaults' variables after the DET_* ones.
        assert spec["env"][-2:] == ["AWS_DEFAULT_REGION=eu-west-3", "SHARED=default"]
        assert (
            spec["network_mode"] == "bridge" and len(spec["slots"]) == 2 and spec["image"] == "registry/gpu:1"
        )
        paths = {f["path"] for f in spec["files"]}
        assert {"/run/determined/workdir/train.py", "/run/determined/ssh/id_rsa"} <= paths
        assert "/run/determined/info/rendezvous.json" in paths
        assert_info_files_load_in_the_harness(spec["files"])
        cid = spec["container_id"]
        trial_url = f"/api/v1/experiments/{exp_id}/trials"
        assert (
            master.request("POST", "/agents/containers?id=gpu1", {"container_id": cid, "state": "RUNNING"})[0]
            == 200
        )
        assert master.request("GET", trial_url, token=token)[1]["trials"][0]["state"] == "STATE_RUNNING"
        status, body = master.request("POST", f"/api/v1/experiments/{exp_id}/archive", token=token)
        assert status == 400 and body["error"]["error"] == "Experiment is not in terminal state."
        line = {"container_id": cid, "stdtype": "stdout", "message": "hello\n"}
        assert master.request("POST", "/agents/logs?id=gpu1", {"logs": [line]})[0] == 200
        done = {"container_id": cid, "state": "TERMINATED", "exit_code": 0}
        assert master.request("POST", "/agents/containers?id=gpu1", done)[0] == 200
        trial = master.request("GET", trial_url, token=token)[1]["trials"][0]
        assert trial["state"] == "STATE_COMPLETED"
        exp = master.request("GET", f"/api/v1/experiments/{exp_id}", token=token)[1]["experiment"]
        assert exp["state"] == "STATE_COMPLETED"
        conn = http.client.HTTPConnection("127.0.0.1", master.port, timeout=10)
        conn.request(
            "GET", f"/api/v1/trials/{trial['id']}/logs", headers={"Authorization": f"Bearer {token}"}
        )
        logs = [json.loads(x)["result"] for x in conn.getresponse().read().splitlines()]
        conn.close()
        assert any(e["message"] == "hello\n" and e["rankId"] == 0 and e["agentId"] == "gpu1" for e in logs)
        conn = http.client.HTTPConnection("127.0.0.1", master.port, timeout=10)
        conn.request(
            "GET",
            f"/api/v1/trials/{trial['id']}/logs?follow=true",
            headers={"Authorization": f"Bearer {token}"},
        )
        followed = [json.loads(x)["result"] for x in conn.getresponse().read().splitlines()]
        conn.close()
        assert followed == logs  # the trial ended: following returns what exists and ends
        assert master.request("POST", f"/api/v1/experiments/{exp_id}/archive", token=token)[0] == 200
        assert (
            master.request("POST", "/agents/containers?id=gpu1", {"container_id": "x", "state": "RUNNING"})[0]
            == 404
        )

        # An agent process that starts again (reconnect=false) took its containers with it.
        status, body = create(GOOD + "max_restarts: 0\n")
        exp_id = body["experiment"]["id"]
        (spec,) = master.request("GET", "/agents/work?id=gpu1&wait=10")[1]["start"]
        running = {"container_id": spec["container_id"], "state": "RUNNING"}
        assert master.request("POST", "/agents/containers?id=gpu1", running)[0] == 200
        assert master.request("GET", "/agents/setup?id=gpu1&reconnect=false")[0] == 200
        trial_url = f"/api/v1/experiments/{exp_id}/trials"
        wait_for(
            lambda: master.request("GET", trial_url, token=token)[1]["trials"][0]["state"] == "STATE_ERROR",
            10,
            "the lost trial's error",
        )
    finally:
        master.kill()


def test_agent_pulls_an_absent_image_with_post_images_create(tmp_path, monkeypatch):
    """A tag the node does not have is pulled as the Docker client's ImagePull does: POST
    /images/create?fromImage=NAME&tag=TAG (a GET there is Docker's 404 "page not found")."""
    docker = FakeDocker(tmp_path / "docker.sock")
    try:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{docker.path}")
        agent = load(AGENT)
        runtime = agent.Runtime({"agent_id": "a"}, None, {"master_info": {}})
        runtime.pull(agent.Docker(), "10.77.0.1:5000/determinedai/pytorch-ngc:0.38.0", False)
    finally:
        docker.close()
    assert docker.seen[-1] == (
        "POST",
        "/v1.41/images/create?fromImage=10.77.0.1%3A5000%2Fdeterminedai%2Fpytorch-ngc&tag=0.38.0",
    )
