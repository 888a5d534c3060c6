"""Storage and scheduler roles without a lab: rendered files, operations, bucket, SCRAM.

Real where it is cheap: the bucket code runs against the lab's MinIO stand-in started on
loopback, the download-and-verify shell runs against a loopback HTTP server, and (marked `pg`,
needs root) the PostgreSQL role operations run against a throwaway PostgreSQL cluster.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import http.server
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.facts.postgres import PostgresDatabases
from pyinfra.operations import postgres

from deploy import s3
from deploy.cluster import load_cluster
from roles.determined import agent as determined_agent
from roles.determined import docker
from roles.determined import domains as determined_domains
from roles.determined import master as determined_master
from roles.minio import server as minio
from roles.postgresql import server as postgresql
from roles.shared import ops as shared_ops
from tests.unit.optest import Facts, commands_of
from tests.verify.test_determined import KNOWN_AGENT, KNOWN_MASTER, unknown_keys
from tests.verify.test_storage import parse_env_file

REPO = Path(__file__).resolve().parents[2]
MINIO_STANDIN = REPO / "tests" / "lab" / "standins" / "minio" / "minio"
ZERO_SHA = "0" * 64

# Values chosen to break naive quoting in YAML, systemd environment files and shells.
NASTY = {
    "T_ACCESS": "det-ak_01",
    "T_SECRET": 'S3cr"et$HOME`id`\\n #: {x}',
    # Only what Determined's database URL carries (deploy/cluster/rules.py), still hard on
    # shell, YAML and SQL quoting.
    "T_DB": "db'pass:$PATH!(x)*;=@&~1",
    "T_ADMIN": "Adm1n-P@ss'\"# yes: no",
}


def write_cluster(
    tmp_path: Path, storage_port=9000, region="us-east-1", prefix=None, layout="per_node"
) -> Path:
    storage = {
        "bucket": "det-checkpoints",
        "region": region,
        "port": storage_port,
        "access_key": {"env": "T_ACCESS"},
        "secret_key": {"env": "T_SECRET"},
    }
    if prefix:
        storage["prefix"] = prefix
    artifact = {"sha256": ZERO_SHA}
    doc = {
        "master_host": "m1",
        "master_port": 23457,
        "insecure_http": True,  # the TLS tests add their sections to this file
        "network": {"management": "127.0.0.0/24", "ipoib": {"subnet": "10.78.9.0/24"}},
        "nodes": [
            {
                "hostname": "m1",
                "address": "127.0.0.1",
                "ipoib_address": "10.78.9.10",
                "roles": ["master", "storage"],
            },
            {
                "hostname": "g1",
                "address": "127.0.0.2",
                "ipoib_address": "10.78.9.11",
                "roles": ["agent"],
                "slots": 4,
                "agent_layout": layout,
            },
        ],
        "sources": {
            "minio": {"url": "http://mirror/minio", **artifact},
            "mofed_tarball": {"url": "http://mirror/{version}-{distro}.tgz", **artifact},
            "determined_master": {"url": "http://mirror/m_{version}.deb", **artifact},
            "determined_agent": {"url": "http://mirror/a_{version}.deb", **artifact},
        },
        "storage": storage,
        "database": {"password": {"env": "T_DB"}},
        "determined": {"admin_password": {"env": "T_ADMIN"}},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def make_cluster(tmp_path, monkeypatch):
    for key, value in NASTY.items():
        monkeypatch.setenv(key, value)
    return lambda **kw: load_cluster(write_cluster(tmp_path, **kw))


@pytest.fixture
def cluster(make_cluster):
    return make_cluster()


# --- rendered files -------------------------------------------------------------------------


def test_master_yaml_has_only_known_keys_and_no_region(cluster):
    config = yaml.safe_load(determined_master.master_yaml(cluster))
    assert unknown_keys(config, KNOWN_MASTER) == []
    assert "region" not in config["checkpoint_storage"]
    assert not re.search(r"^\s*region\s*:", determined_master.master_yaml(cluster), re.MULTILINE)


def test_master_yaml_values(cluster):
    config = yaml.safe_load(determined_master.master_yaml(cluster))
    assert config["port"] == 23457
    assert config["db"] == {
        "user": "determined",
        "password": NASTY["T_DB"],
        "host": "localhost",
        "port": 5432,
        "name": "determined",
    }
    assert config["checkpoint_storage"] == {
        "type": "s3",
        "bucket": "det-checkpoints",
        # Determined's bucket-only user (deploy/minio_admin.py), never MinIO's root keys.
        "access_key": "determined",
        "secret_key": cluster.storage.determined_secret.value,
        "endpoint_url": "http://127.0.0.1:9000",  # m1's address: trials on the bridge network
        "save_experiment_best": 0,
        "save_trial_best": 1,
        "save_trial_latest": 1,
    }
    assert config["security"] == {"initial_user_password": NASTY["T_ADMIN"]}
    assert config["task_container_defaults"]["environment_variables"] == [
        "AWS_DEFAULT_REGION=us-east-1",
    ]


def test_master_yaml_prefix_and_region(make_cluster):
    config = yaml.safe_load(
        determined_master.master_yaml(make_cluster(prefix="team-a/ckpt", region="eu-central-1"))
    )
    assert config["checkpoint_storage"]["prefix"] == "team-a/ckpt"
    assert config["task_container_defaults"]["environment_variables"][0] == "AWS_DEFAULT_REGION=eu-central-1"


def test_agent_yaml(cluster):
    text = determined_agent.agent_yaml(cluster, cluster.node("g1"))
    config = yaml.safe_load(text)
    assert unknown_keys(config, KNOWN_AGENT) == []
    assert config == {
        "master_host": "m1",
        "master_port": 23457,  # written although it is the cluster's default: the agent's is 80
        "container_master_host": "127.0.0.1",
        "agent_id": "g1",
        "resource_pool": "default",
        "slot_type": "cuda",
    }
    assert not any(v in text for v in NASTY.values())


def test_agent_yaml_per_domain(make_cluster):
    from deploy.topology import AgentSpec

    cluster = make_cluster(layout="per_domain")
    plain = yaml.safe_load(determined_agent.agent_yaml(cluster, cluster.node("g1"))) or {}
    assert "master_host" not in plain  # the plain unit cannot start by mistake
    config = yaml.safe_load(determined_domains.domain_yaml(cluster, 1, AgentSpec("g1-1", "4,5,6,7", 4)))
    assert unknown_keys(config, KNOWN_AGENT) == []
    assert (config["agent_id"], config["visible_gpus"]) == ("g1-1", "4,5,6,7")
    assert config["master_port"] == cluster.master_port


def test_unknown_keys_names_the_article_region_key():
    doc = {"port": 1, "checkpoint_storage": {"type": "s3", "region": "x"}, "regio": 1}
    assert unknown_keys(doc, KNOWN_MASTER) == ["checkpoint_storage.region", "regio"]


def test_minio_env_file(cluster):
    env = parse_env_file(minio.env_content(cluster))
    assert env == {
        "MINIO_VOLUMES": "/mnt/data",
        "MINIO_OPTS": "--address :9000 --console-address 127.0.0.1:9001",
        "MINIO_ROOT_USER": NASTY["T_ACCESS"],
        "MINIO_ROOT_PASSWORD": NASTY["T_SECRET"],
        "MINIO_SITE_REGION": "us-east-1",
    }


def test_master_s3_env_file(cluster):
    assert parse_env_file(determined_master.s3_env(cluster)) == {
        "AWS_ACCESS_KEY_ID": "determined",
        "AWS_SECRET_ACCESS_KEY": cluster.storage.determined_secret.value,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def test_env_file_refuses_line_breaks_without_showing_the_value():
    with pytest.raises(ValueError) as e:
        shared_ops.env_file("h", {"KEY": "top\nsecret"})
    assert "KEY" in str(e.value) and "secret" not in str(e.value)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_env_file_matches_what_a_shell_sees_for_plain_values():
    # A second opinion on the quoting for values without systemd/shell differences.
    text = shared_ops.env_file("x", {"A": "one two", "B": "--address :9000"})
    out = subprocess.run(
        ["bash", "-c", 'set -a; . /dev/stdin; printf "%s|%s" "$A" "$B"'],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "one two|--address :9000"


def test_postgresql_conf():
    text = postgresql.conf_content(5433)
    assert "max_connections = 100" in text and "port = 5433" in text and "{{" not in text
    assert postgresql.MAX_CONNECTIONS >= 96
    assert "listen_addresses = 'localhost'" in text


@pytest.mark.parametrize(
    "os_id,version,expected",
    [
        ("debian", "12", (15, False)),
        ("ubuntu", "22.04", (14, False)),
        ("ubuntu", "20.04", (15, True)),  # 12 is too old: PGDG
        ("debian", "11", (13, False)),
        ("ubuntu", "18.04", (15, True)),
    ],
)
def test_postgresql_major(os_id, version, expected):
    assert postgresql.major_for(os_id, version) == expected


# --- SCRAM ----------------------------------------------------------------------------------


def test_scram_verifier_against_rfc7677_example():
    # RFC 7677 section 3: user "user", password "pencil", salt W22ZaJ0SNY7soEsUEjb6gQ==.
    verifier = postgresql.scram_verifier("pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    head, keys = verifier.rsplit("$", 1)
    assert head == "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ=="
    stored_key, server_key = (base64.b64decode(k) for k in keys.split(":"))
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    auth = (
        f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r={nonce}"
    ).encode()
    server_signature = hmac.new(server_key, auth, hashlib.sha256).digest()
    assert base64.b64encode(server_signature).decode() == "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    client_signature = hmac.new(stored_key, auth, hashlib.sha256).digest()
    proof = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
    assert hashlib.sha256(client_key).digest() == stored_key


def test_password_matches():
    verifier = postgresql.scram_verifier("pw-1", b"0123456789abcdef")
    key = b"k" * 64  # the node's key (roles/postgresql/db_role.py digest_key)
    current = {
        "salt": verifier.split("$")[1],
        "digest": hmac.new(key, verifier.encode(), "sha256").hexdigest(),
    }
    assert postgresql.password_matches("pw-1", current, key)
    assert not postgresql.password_matches("pw-2", current, key)
    assert not postgresql.password_matches("pw-1", current, b"j" * 64)
    assert not postgresql.password_matches("pw-1", current, None)
    assert not postgresql.password_matches("pw-1", {"salt": "", "digest": current["digest"]}, key)
    assert not postgresql.password_matches("pw-1", None, key)
    # A plain hash of the verifier (what -vvv printed before) no longer counts.
    plain = {**current, "digest": hashlib.sha256(verifier.encode()).hexdigest()}
    assert not postgresql.password_matches("pw-1", plain, key)


# --- operations, with a host whose facts are given ------------------------------------------


def _shown(commands) -> str:
    """What pyinfra prints for these commands (masked), plus the uploads' reprs."""
    return "\n".join(str(c) if isinstance(c, StringCommand) else repr(c) for c in commands)


def test_secret_file_sets_mode_before_content_and_never_shows_it():
    from deploy.facts.trust import SecretFileState

    secret = shared_ops.SecretBytes("KEY=" + NASTY["T_SECRET"])
    commands = commands_of(shared_ops.secret_file, {SecretFileState: None}, "/etc/x.env", secret)
    assert [type(c) for c in commands] == [StringCommand, FileUploadCommand]
    assert str(commands[0]) == "touch /etc/x.env && chown root:root /etc/x.env && chmod 600 /etc/x.env"
    assert NASTY["T_SECRET"] not in _shown(commands) + repr(secret) + str(secret)
    assert commands[1].src.read() == secret.data


# Unchanged, drifted and changed secret files: tests/unit/test_trust_odds.py.


def test_verified_binary_skips_a_matching_file():
    from pyinfra.facts.files import Sha256File

    assert (
        commands_of(
            shared_ops.verified_binary,
            {Sha256File: ZERO_SHA},
            "http://m/minio",
            ZERO_SHA,
            "/usr/local/bin/minio",
            "MinIO server binary",
        )
        == []
    )
    commands = commands_of(
        shared_ops.verified_binary,
        {Sha256File: None},
        "http://m/minio",
        ZERO_SHA,
        "/usr/local/bin/minio",
        "MinIO server binary",
    )
    assert len(commands) == 1 and str(commands[0]).endswith(
        f"fetch-verified.sh http://m/minio /usr/local/bin/minio 'MinIO server binary' {ZERO_SHA} 755"
    )


def test_verified_deb_skips_the_installed_version():
    from pyinfra.facts.deb import DebPackages

    args = ("determined-master", "0.38.0", "http://m/m.deb", ZERO_SHA, "determined-master")
    assert commands_of(shared_ops.verified_deb, {DebPackages: {"determined-master": ["0.38.0"]}}, *args) == []
    commands = commands_of(shared_ops.verified_deb, {DebPackages: {"determined-master": ["0.37.0"]}}, *args)
    fetch, install = (str(c) for c in commands)
    deb = "/var/cache/apt/archives/determined-master_0.38.0.verified.deb"
    assert fetch.endswith(f"fetch-verified.sh http://m/m.deb {deb} determined-master {ZERO_SHA}")
    assert "apt-get install" in install and "--force-confold" in install and f"rm -f {deb}" in install


def test_docker_runtime_configured_only_when_missing():
    from pyinfra.facts.files import FileContents

    with_nvidia = ['{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}']
    assert commands_of(docker.nvidia_runtime, {FileContents: with_nvidia}) == []
    for without in (['{"runtimes": {"runc": {}}}'], None):
        commands = commands_of(docker.nvidia_runtime, {FileContents: without})
        assert "nvidia-ctk runtime configure --runtime=docker" in str(commands[0])


def test_docker_runtimes_parses_nvidia_ctk_output():
    text = (
        '{\n    "runtimes": {\n        "nvidia": {\n            "args": [],\n'
        '            "path": "nvidia-container-runtime"\n        }\n    }\n}'
    )
    assert docker.runtimes(text.splitlines()) == {"nvidia"}
    assert docker.runtimes(["{not json"]) == frozenset()
    assert docker.runtimes(['{"log-driver": "json-file"}']) == frozenset()
    assert docker.runtimes(None) == frozenset()


def test_role_password_never_shown():
    from pyinfra.api import FileUploadCommand

    from deploy.facts.postgresql import RoleVerifier

    commands = commands_of(postgresql.role, {RoleVerifier: None}, "determined", load_secret(NASTY["T_DB"]))
    [upload] = [c for c in commands if isinstance(c, FileUploadCommand)]
    lines = [str(c) for c in commands if not isinstance(c, FileUploadCommand)]
    # The statement travels over SFTP into a 0600 file and reaches psql on stdin: no command
    # line (visible to every user in `ps`) holds the password or its SCRAM verifier.
    assert lines[0].startswith("install -m 600 /dev/null /tmp/")
    assert "runuser -u postgres -- psql -X -q -p 5432 -v ON_ERROR_STOP=1 < /tmp/" in lines[1]
    assert not any("ROLE" in line or "SCRAM" in line or NASTY["T_DB"] in line for line in lines)
    sql = upload.src.getvalue().decode()
    assert sql.startswith('CREATE ROLE "determined" WITH LOGIN PASSWORD \'SCRAM-SHA-256$4096:')
    assert NASTY["T_DB"] not in sql


# PGDG's key (exactly the pinned one, re-checked): tests/unit/test_trust_odds.py.


def load_secret(value: str):
    from deploy.secrets import Secret, SecretRef

    return Secret(SecretRef("env", "T"), value)


# --- download and verify, for real against a loopback HTTP server --------------------------


@pytest.fixture
def http_dir(tmp_path):
    served = tmp_path / "served"
    served.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_fetch_verified_installs_only_a_matching_file(http_dir, tmp_path):
    served, base = http_dir
    (served / "tool").write_bytes(b"#!/bin/sh\necho real\n")
    good = hashlib.sha256(b"#!/bin/sh\necho real\n").hexdigest()
    dest = tmp_path / "bin-tool"

    def install(url, sha, mode=None):
        command = shared_ops.fetch_verified(url, str(dest), artifact="Tool", sha256=sha, mode=mode)
        return subprocess.run(
            ["sh", "-c", command.get_raw_value()], check=False, capture_output=True, text=True
        )

    bad = install(f"{base}/tool", ZERO_SHA)
    assert bad.returncode == 1
    assert f"Tool: sha256 mismatch for {base}/tool: expected {ZERO_SHA}, got {good}" in bad.stderr
    assert not dest.exists() and not Path(f"{dest}.part").exists()
    missing = install(f"{base}/nope", good)
    assert missing.returncode == 1 and f"Tool: download failed from {base}/nope" in missing.stderr
    ok = install(f"{base}/tool", good, mode="755")
    assert ok.returncode == 0, ok.stderr
    assert dest.read_bytes() == b"#!/bin/sh\necho real\n" and dest.stat().st_mode & 0o777 == 0o755
    # No pin, no download: there is no unpinned path (cuda-keyring is pinned too).
    dest.unlink()
    for no_pin in (None, "", "x" * 64):
        refused = install(f"{base}/tool", no_pin)
        assert refused.returncode == 1 and "no sha256 pin" in refused.stderr and not dest.exists()
    script = subprocess.run(
        ["sh", str(REPO / "files/shared/fetch-verified.sh"), f"{base}/tool", str(dest), "Tool", ""],
        check=False,
        capture_output=True,
        text=True,
    )
    assert script.returncode == 1 and "no sha256 pin" in script.stderr and not dest.exists()


def test_fail_stops_with_the_message_on_stderr():
    proc = subprocess.run(
        ["sh", "-c", str(shared_ops.fail('x: it\'s "broken"')) + "; echo went on"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", 'x: it\'s "broken"\n')


# --- the bucket, for real against the MinIO stand-in on loopback ----------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def minio_server(tmp_path):
    if not MINIO_STANDIN.exists():
        pytest.skip("the MinIO stand-in is not in the tree")
    procs = []

    def start(site_region: str | None) -> int:
        port = _free_port()
        env = {
            "PATH": os.environ["PATH"],
            "MINIO_ROOT_USER": NASTY["T_ACCESS"],
            "MINIO_ROOT_PASSWORD": NASTY["T_SECRET"],
            "HOME": str(tmp_path),  # the stand-in, like MinIO, makes ${HOME}/.minio/certs/CAs
        }
        if site_region:
            env["MINIO_SITE_REGION"] = site_region
        data = tmp_path / f"data-{port}"
        data.mkdir()
        proc = subprocess.Popen(
            [
                "python3",
                str(MINIO_STANDIN),
                "server",
                "--address",
                f"127.0.0.1:{port}",
                "--console-address",
                f"127.0.0.1:{_free_port()}",
                str(data),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return port
            if proc.poll() is not None:
                assert proc.stderr is not None
                pytest.fail(f"MinIO stand-in exited: {proc.stderr.read().decode()[-500:]}")
            time.sleep(0.1)
        pytest.fail("MinIO stand-in did not listen")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-1"])
def test_bucket_made_once_with_its_region(minio_server, make_cluster, region):
    cluster = make_cluster(storage_port=minio_server(region), region=region)
    assert s3.bucket_problem(cluster) == "bucket det-checkpoints does not exist"
    assert s3.ensure_bucket(cluster) is True
    assert s3.ensure_bucket(cluster) is False
    assert s3.bucket_problem(cluster) is None
    client = s3.client(cluster)
    assert s3.bucket_location(client, "det-checkpoints", region) == region


def test_bucket_region_mismatch_fails_clearly(minio_server, make_cluster, tmp_path):
    port = minio_server("eu-west-1")
    # MinIO answers GET ?location signed for any region (S3 clients discover regions that
    # way), so the plan only sees a missing bucket; making it is refused, naming the region.
    cluster = make_cluster(storage_port=port, region="us-east-1")
    assert s3.bucket_problem(cluster) == "bucket det-checkpoints does not exist"
    with pytest.raises(s3.BucketError) as e:
        s3.ensure_bucket(cluster)
    message = str(e.value)
    assert "AuthorizationHeaderMalformed" in message and "expecting 'eu-west-1'" in message
    assert not any(v in message for v in NASTY.values())
    # A bucket made in eu-west-1, then cluster.yaml saying us-east-1: the location check.
    assert s3.ensure_bucket(make_cluster(storage_port=port, region="eu-west-1")) is True
    assert "has location 'eu-west-1'" in (s3.bucket_problem(cluster) or "")
    with pytest.raises(s3.BucketError, match="reads back location 'eu-west-1', not 'us-east-1'"):
        s3.ensure_bucket(cluster)


def test_bucket_unreachable_is_a_problem_not_an_exception(make_cluster):
    cluster = make_cluster(storage_port=_free_port())
    assert "is not reachable" in (s3.bucket_problem(cluster) or "")
    with pytest.raises(s3.BucketError, match="not reachable from the controller"):
        s3.ensure_bucket(cluster)


def test_bucket_operation_is_no_change_when_the_bucket_is_right(minio_server, make_cluster):
    cluster = make_cluster(storage_port=minio_server("us-east-1"))
    commands = commands_of(minio.bucket, {}, cluster)
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)
    s3.ensure_bucket(cluster)
    assert commands_of(minio.bucket, {}, cluster) == []


# --- PostgreSQL role and database operations, for real (root, local PostgreSQL 15) ----------

PG_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.fixture
def pg_cluster():
    if os.geteuid() != 0 or not (PG_BIN / "initdb").exists():
        pytest.skip("needs root and PostgreSQL 15 binaries")
    # Outside pytest's tmp_path: its parents are 0700 root, and the server runs as postgres.
    tmp_path = Path(tempfile.mkdtemp(prefix="pg-role-test-"))
    tmp_path.chmod(0o755)
    shutil.chown(tmp_path, "postgres")
    data, sockets = tmp_path / "pgdata", tmp_path / "pgsock"
    sockets.mkdir()
    shutil.chown(sockets, "postgres")
    port = _free_port()
    run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        run_as + [str(PG_BIN / "initdb"), "-D", str(data), "-A", "peer", "--auth-host=scram-sha-256"],
        check=True,
        capture_output=True,
        cwd="/",
    )
    subprocess.run(
        run_as
        + [
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(tmp_path / "pg.log"),
            "-o",
            f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
        cwd="/",
    )
    # The operations pass -p themselves; PGHOST points psql at this cluster's socket.
    env = {**os.environ, "PGHOST": str(sockets)}
    yield env, port
    subprocess.run(
        run_as + [str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
        check=False,
        capture_output=True,
        cwd="/",
    )
    shutil.rmtree(tmp_path, ignore_errors=True)


def _as_postgres(text: str) -> list[str]:
    """What postgres.database's _su_user="postgres", _chdir="/" make of a command (runuser
    instead of su: the same user switch without PAM's session setup)."""
    return ["runuser", "-u", "postgres", "--", "sh", "-c", f"cd / && {text}"]


def _pg_facts(env):
    def facts(cls, kwargs):  # the fact's own command and parser, run here as pyinfra runs it there
        command = cls().command(**kwargs)
        text = command.get_raw_value() if isinstance(command, StringCommand) else command
        argv = _as_postgres(text) if cls is PostgresDatabases else ["sh", "-c", text]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
        return cls().process(out) if out else cls().default()

    return facts


def _pg_run(env, commands, as_postgres=False):
    from pyinfra.api import FileUploadCommand

    for c in commands:
        if isinstance(c, FileUploadCommand):  # what pyinfra does over SFTP, here on this machine
            Path(c.dest).write_bytes(c.src.getvalue())
            continue
        text = c.get_raw_value()
        argv = _as_postgres(text) if as_postgres else ["sh", "-c", text]
        subprocess.run(argv, env=env, check=True, capture_output=True)


def _login(port, user, password, database="postgres") -> bool:
    return (
        subprocess.run(
            [
                str(PG_BIN / "psql"),
                "-X",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                user,
                "-d",
                database,
                "-Atc",
                "SELECT 1",
            ],
            env={**os.environ, "PGPASSWORD": password},
            check=False,
            capture_output=True,
            text=True,
        ).returncode
        == 0
    )


@pytest.mark.pg
def test_role_and_database_against_postgresql(pg_cluster):
    env, port = pg_cluster
    facts = Facts(reader=_pg_facts(env), local_files=True)  # every fact read on this machine
    password = load_secret(NASTY["T_DB"])
    key = str(Path(tempfile.mkdtemp(prefix="pg-key-")) / "gpu-cluster" / "digest.key")
    _pg_run(env, commands_of(postgresql.digest_key, facts, key))
    assert Path(key).stat().st_mode & 0o777 == 0o600 and len(Path(key).read_bytes()) == 128
    assert commands_of(postgresql.digest_key, facts, key) == []
    _pg_run(env, commands_of(postgresql.role, facts, "determined", password, port, key))
    assert _login(port, "determined", NASTY["T_DB"])
    assert not _login(port, "determined", "wrong")
    # Same password: no change. A new one in cluster.yaml: set, and the old one stops working.
    assert commands_of(postgresql.role, facts, "determined", password, port, key) == []
    new = load_secret("N3w-" + NASTY["T_DB"])
    _pg_run(env, commands_of(postgresql.role, facts, "determined", new, port, key))
    assert _login(port, "determined", new.value) and not _login(port, "determined", NASTY["T_DB"])

    # pyinfra's postgres.database, as roles/postgresql/server.py calls it
    database = {"database": "determined", "owner": "determined", "psql_port": port}
    _pg_run(env, commands_of(postgres.database, facts, **database), as_postgres=True)
    assert _login(port, "determined", new.value, database="determined")
    assert commands_of(postgres.database, facts, **database) == []


# --- per-domain agents: retiring, and the plain unit switched off ---------------------------


def test_no_domain_agents_retires_every_instance():
    from deploy.facts.determined import DomainAgents, Instance

    present = {
        "0": Instance(config=True, enabled=True, active="active"),
        "1": Instance(config=True, active="failed"),
    }
    commands = [str(c) for c in commands_of(determined_domains.no_domain_agents, {DomainAgents: present})]
    assert commands == [
        "systemctl disable --now determined-agent@0.service",
        "rm -f /etc/determined/agent-0.yaml",
        "systemctl reset-failed determined-agent@1.service",
        "rm -f /etc/determined/agent-1.yaml",
    ]
    assert commands_of(determined_domains.no_domain_agents, {DomainAgents: {}}) == []


def test_unit_off_also_stops_a_unit_waiting_to_restart():
    from deploy.facts.system import UnitState

    unit = "determined-agent.service"
    waiting = commands_of(determined_domains.unit_off, {UnitState: ("activating", "disabled")}, unit)
    assert [str(c) for c in waiting] == [f"systemctl disable --now {unit}"]
    assert commands_of(determined_domains.unit_off, {UnitState: ("inactive", "disabled")}, unit) == []
