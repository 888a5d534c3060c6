"""The MinIO stand-in (tests/lab/standins/minio/minio), driven by minio-py as the deploy will.

Each server runs on 127.0.0.1 with ports picked by the kernel and a data directory in tmp.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import importlib.machinery
import importlib.util
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from minio import Minio
from minio.credentials import Credentials
from minio.error import S3Error
from minio.signer import sign_v4_s3

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "lab" / "standins" / "minio" / "minio"
USER = "labadmin"
PASSWORD = "lab-secret-Key1"
REGION = "eu-west-3"  # not us-east-1, so a client that forgets the region fails


def load_module() -> types.ModuleType:
    loader = importlib.machinery.SourceFileLoader("minio_standin", str(SCRIPT))
    spec = importlib.util.spec_from_loader("minio_standin", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports: each socket stays bound until all are picked, so no two match."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class MinioProcess:
    """One `minio server` process with its own notify socket, like systemd's Type=notify.

    A port the kernel picked is free only until it is closed again: under xdist another
    test's client can take it as its source port before the server binds it. The server
    then refuses it as MinIO does ("Specified port is already in use"), and wait_ready
    starts it again on new ports, which it can do only for the ports it picked itself.
    """

    def __init__(self, data_dir: Path, tmp: Path, env: dict[str, str], port: int | None = None):
        self.data_dir, self.tmp, self.fixed_port = data_dir, tmp, port
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MINIO_")}
        full_env.update(env)
        # Like MinIO, the stand-in makes ${HOME}/.minio/certs/CAs without --certs-dir: not here.
        full_env["HOME"] = str(tmp)
        self.env = full_env
        self._spawn()

    def _spawn(self) -> None:
        picked = free_ports(2)
        self.port = self.fixed_port or picked[0]
        self.console_port = picked[1]
        self.notify_path = self.tmp / f"notify-{self.port}-{self.console_port}.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(10)
        self.log = self.tmp / f"minio-{self.port}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                "server",
                "--address",
                f"127.0.0.1:{self.port}",
                "--console-address",
                f"127.0.0.1:{self.console_port}",
                str(self.data_dir),
            ],
            env={**self.env, "NOTIFY_SOCKET": str(self.notify_path)},
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        for _attempt in range(3):
            deadline = time.monotonic() + 10
            self.notify.settimeout(0.2)
            while time.monotonic() < deadline:
                try:
                    message = self.notify.recv(1024).decode()
                except TimeoutError:
                    if self.proc.poll() is not None:
                        break  # it exited: read why below
                    continue
                assert message == "READY=1"
                return
            self.kill()
            log = self.log.read_text()
            clash = "Specified port is already in use" in log
            if not clash or (self.fixed_port and f":{self.fixed_port})" in log):
                raise AssertionError(f"no READY=1 from minio:\n{log}")
            self._spawn()
        raise AssertionError(f"no READY=1 from minio after three port clashes:\n{self.log.read_text()}")

    def stop(self) -> tuple[int, str]:
        """SIGTERM, as systemctl stop does; returns (exit code, what was notified)."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=10)
        try:
            self.notify.settimeout(1)
            notified = self.notify.recv(1024).decode()
        except TimeoutError:
            notified = ""
        self.notify.close()
        return code, notified

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()

    def client(self, secret: str = PASSWORD, region: str | None = REGION, user: str = USER) -> Minio:
        return Minio(f"127.0.0.1:{self.port}", user, secret, secure=False, region=region)


@pytest.fixture
def server_env() -> dict[str, str]:
    return {"MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD, "MINIO_SITE_REGION": REGION}


@pytest.fixture
def server(tmp_path, server_env):
    srv = MinioProcess(tmp_path / "data", tmp_path, server_env)
    srv.wait_ready()
    yield srv
    srv.kill()


def run_minio(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MINIO_")}
    full_env["HOME"] = tempfile.mkdtemp(prefix="minio-home-")  # not the controller's ~/.minio
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def test_first_line_says_what_it_stands_in_for():
    first = SCRIPT.read_text().splitlines()[0]
    assert first.startswith("#!/usr/bin/env -S python3") and "stand-in for the MinIO server" in first
    assert os.access(SCRIPT, os.X_OK)


def test_version_output_is_the_real_release():
    result = run_minio("--version")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "minio version RELEASE.2025-04-22T22-12-26Z (commit-id=0d7408fc9969caf07de6a8c3a84f9fbb10a6739e)"
    )
    assert lines[1] == "Runtime: go1.24.2 linux/amd64"
    assert lines[2].startswith("License: GNU AGPLv3")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"MINIO_ROOT_USER": USER}, 'Missing credential environment variable, "MINIO_ROOT_PASSWORD"'),
        ({"MINIO_ROOT_PASSWORD": PASSWORD}, 'Missing credential environment variable, "MINIO_ROOT_USER"'),
        (
            {"MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": "short"},
            "MINIO_ROOT_PASSWORD length at least 8 characters",
        ),
        (
            {"MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD, "MINIO_SITE_REGION": "bad region"},
            "invalid",
        ),
    ],
)
def test_bad_credentials_or_region_are_fatal(tmp_path, env, expected):
    result = run_minio("server", "--address", f"127.0.0.1:{free_port()}", str(tmp_path), env=env)
    assert result.returncode == 1
    assert "FATAL" in result.stderr and expected in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(tmp_path, server_env, monkeypatch):
    """The race CI lost once: another process held the port between pick and bind."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = free_ports
    picks = iter([[taken.getsockname()[1], real(1)[0]]])
    monkeypatch.setattr(sys.modules[__name__], "free_ports", lambda n: next(picks, None) or real(n))
    srv = MinioProcess(tmp_path / "data", tmp_path, server_env)
    try:
        srv.wait_ready()
        assert srv.port != taken.getsockname()[1]
        first = (tmp_path / f"minio-{taken.getsockname()[1]}.log").read_text()
        assert "Specified port is already in use" in first
        assert srv.client().list_buckets() == []
    finally:
        srv.kill()
        taken.close()


def test_no_credentials_means_default_ones_with_a_warning(tmp_path):
    srv = MinioProcess(tmp_path / "data", tmp_path, {})
    try:
        srv.wait_ready()
        assert srv.client("minioadmin", None, "minioadmin").list_buckets() == []
    finally:
        assert srv.stop()[0] == 0
    assert "Detected default credentials 'minioadmin:minioadmin'" in srv.log.read_text()


def test_round_trip_regions_and_restart(tmp_path, server_env):
    data = tmp_path / "data"
    srv = MinioProcess(data, tmp_path, server_env)
    try:
        srv.wait_ready()
        client = srv.client()
        client.make_bucket("det-checkpoints", location=REGION)
        assert client.bucket_exists("det-checkpoints")
        assert not client.bucket_exists("missing-bucket")
        with pytest.raises(S3Error) as again:
            client.make_bucket("det-checkpoints", location=REGION)
        assert again.value.code == "BucketAlreadyOwnedByYou"

        client.put_object("det-checkpoints", "trial/1/state.bin", io.BytesIO(b"weights"), 7)
        client.put_object("det-checkpoints", "trial/2/state.bin", io.BytesIO(b"w2"), 2)
        client.put_object("det-checkpoints", "top level.txt", io.BytesIO(b"t"), 1)
        assert client.get_object("det-checkpoints", "trial/1/state.bin").read() == b"weights"
        stat = client.stat_object("det-checkpoints", "trial/1/state.bin")
        assert stat.size == 7 and stat.etag == hashlib.md5(b"weights").hexdigest()
        names = [o.object_name for o in client.list_objects("det-checkpoints")]
        assert names == ["top level.txt", "trial/"]
        names = [
            o.object_name for o in client.list_objects("det-checkpoints", prefix="trial/", recursive=True)
        ]
        assert names == ["trial/1/state.bin", "trial/2/state.bin"]

        # GET /<bucket>?location: the site region, read back as set.
        response = client._url_open(
            "GET", "us-east-1", bucket_name="det-checkpoints", query_params={"location": ""}
        )
        assert f">{REGION}</LocationConstraint>" in response.data.decode()
        # A client without a region finds it through that call and then works.
        assert srv.client(region=None).get_object("det-checkpoints", "top level.txt").read() == b"t"

        client.remove_object("det-checkpoints", "trial/2/state.bin")
        assert not (data / "det-checkpoints" / "trial" / "2").exists()
        code, notified = srv.stop()
        assert (code, notified) == (0, "STOPPING=1")
    finally:
        srv.kill()

    # Buckets are directories and objects files; metadata is kept apart in .minio.sys.
    assert (data / "det-checkpoints" / "trial" / "1" / "state.bin").read_bytes() == b"weights"
    assert (data / ".minio.sys" / "format.json").is_file()

    again_srv = MinioProcess(data, tmp_path, server_env)
    try:
        again_srv.wait_ready()
        client = again_srv.client()
        assert client.bucket_exists("det-checkpoints")
        assert client.get_object("det-checkpoints", "trial/1/state.bin").read() == b"weights"
        assert (
            client.stat_object("det-checkpoints", "trial/1/state.bin").etag
            == hashlib.md5(b"weights").hexdigest()
        )
    finally:
        again_srv.kill()


def test_wrong_credentials_and_region_are_refused(server):
    server.client().make_bucket("bucket-one", location=REGION)

    with pytest.raises(S3Error) as wrong_secret:
        server.client(secret="not-the-secret").list_objects("bucket-one").__next__()
    assert wrong_secret.value.code == "SignatureDoesNotMatch"

    with pytest.raises(S3Error) as wrong_key:
        server.client(user="someone-else").list_buckets()
    assert wrong_key.value.code == "InvalidAccessKeyId"

    # Signed for us-east-1 (what trial containers do without AWS_DEFAULT_REGION).
    with pytest.raises(S3Error) as wrong_region:
        server.client(region="us-east-1").list_objects("bucket-one").__next__()
    assert wrong_region.value.code == "AuthorizationHeaderMalformed"
    assert wrong_region.value.message == (
        f"The authorization header is malformed; the region is wrong; expecting '{REGION}'."
    )

    with pytest.raises(S3Error) as wrong_location:
        server.client(region=None).make_bucket("bucket-two", location="us-east-1")
    assert wrong_location.value.code == "AuthorizationHeaderMalformed"

    # Bucket existence checks use HEAD, whose errors carry no body: minio-py sees 403.
    with pytest.raises(S3Error) as head:
        server.client(secret="not-the-secret").bucket_exists("bucket-one")
    assert head.value.response.status == 403


def test_no_site_region_accepts_any_signing_region(tmp_path):
    srv = MinioProcess(
        tmp_path / "data", tmp_path, {"MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD}
    )
    try:
        srv.wait_ready()
        srv.client(region="ap-south-1").make_bucket("anyregion", location="ap-south-1")
        assert srv.client(region="us-east-1").bucket_exists("anyregion")
        response = srv.client()._url_open(
            "GET", "us-east-1", bucket_name="anyregion", query_params={"location": ""}
        )
        assert "<LocationConstraint" in response.data.decode() and REGION not in response.data.decode()
    finally:
        srv.kill()


def test_legacy_minio_region_wins_over_site_region(tmp_path):
    env = {
        "MINIO_ROOT_USER": USER,
        "MINIO_ROOT_PASSWORD": PASSWORD,
        "MINIO_REGION": "eu-legacy-1",
        "MINIO_SITE_REGION": REGION,
        "MINIO_REGION_NAME": "ignored-1",
    }
    srv = MinioProcess(tmp_path / "data", tmp_path, env)
    try:
        srv.wait_ready()
        srv.client(region="eu-legacy-1").make_bucket("legacy", location="eu-legacy-1")
        with pytest.raises(S3Error) as wrong:
            srv.client(region=REGION).bucket_exists("legacy")
        assert wrong.value.response.status == 400
    finally:
        srv.kill()


def test_presigned_get(server):
    client = server.client()
    client.make_bucket("bucket-one", location=REGION)
    client.put_object("bucket-one", "shared.txt", io.BytesIO(b"presigned"), 9)
    url = client.presigned_get_object("bucket-one", "shared.txt", expires=dt.timedelta(minutes=5))
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.read() == b"presigned"
    with pytest.raises(urllib.error.HTTPError) as forged:
        urllib.request.urlopen(url.replace("X-Amz-Signature=", "X-Amz-Signature=0"), timeout=5)
    assert forged.value.code == 403


def test_health_without_auth_and_anonymous_s3_denied(server):
    base = f"http://127.0.0.1:{server.port}"
    for path in ("/minio/health/live", "/minio/health/ready"):
        with urllib.request.urlopen(base + path, timeout=5) as r:
            assert r.status == 200
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(base + "/", timeout=5)
    assert denied.value.code == 403
    body = denied.value.read().decode()
    for element in ("<Code>AccessDenied</Code>", "<Message>", "<Resource>/</Resource>", "<RequestId>"):
        assert element in body
    with urllib.request.urlopen(f"http://127.0.0.1:{server.console_port}/", timeout=5) as r:
        assert b"MinIO Console" in r.read()


def signed_request(port: int, method: str, path: str, body: bytes, content_sha256: str, extra=None):
    """A request signed by minio-py's own signer, sent with a chosen x-amz-content-sha256."""
    url = urlsplit(f"http://127.0.0.1:{port}{path}")
    date = dt.datetime.now(dt.UTC).replace(microsecond=0)
    headers = {
        "Host": url.netloc,
        "x-amz-content-sha256": content_sha256,
        "x-amz-date": date.strftime("%Y%m%dT%H%M%SZ"),
        "Content-Length": str(len(body)),
        **(extra or {}),
    }
    headers = sign_v4_s3(
        method=method,
        url=url,
        region=REGION,
        headers=headers,
        credentials=Credentials(USER, PASSWORD),
        content_sha256=content_sha256,
        date=date,
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read(), headers, date


def test_payload_hash_is_checked(server):
    server.client().make_bucket("bucket-one", location=REGION)
    status, body, _, _ = signed_request(
        server.port, "PUT", "/bucket-one/x", b"real body", hashlib.sha256(b"other").hexdigest()
    )
    assert status == 400 and b"<Code>XAmzContentSHA256Mismatch</Code>" in body
    status, _, _, _ = signed_request(server.port, "PUT", "/bucket-one/x", b"unsigned", "UNSIGNED-PAYLOAD")
    assert status == 200
    assert server.client().get_object("bucket-one", "x").read() == b"unsigned"


def test_streaming_chunk_signatures_match_the_aws_example():
    """AWS's documented chunked-upload example: 66560 bytes of 'a' in 64 KiB chunks."""
    module = load_module()
    key = module.signing_key("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524", "us-east-1")
    signatures = [
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
    ]
    chunks = [b"a" * 65536, b"a" * 1024, b""]
    body = b"".join(
        f"{len(c):x};chunk-signature={s}\r\n".encode() + c + b"\r\n"
        for c, s in zip(chunks, signatures, strict=True)
    )
    assert len(body) == 66824  # the Content-Length of AWS's example
    seed = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
    scope = "20130524/us-east-1/s3/aws4_request"
    assert module.decode_aws_chunked(body, key, scope, "20130524T000000Z", seed) == b"a" * 66560
    tampered = body.replace(b"a" * 10, b"b" * 10, 1)
    with pytest.raises(module.S3Error):
        module.decode_aws_chunked(tampered, key, scope, "20130524T000000Z", seed)


def test_streaming_signed_upload(server):
    server.client().make_bucket("bucket-one", location=REGION)
    payload = os.urandom(70000)
    chunks = [payload[:65536], payload[65536:], b""]
    encoded_len = sum(len(f"{len(c):x};chunk-signature=".encode()) + 64 + 4 + len(c) for c in chunks)
    url = urlsplit(f"http://127.0.0.1:{server.port}/bucket-one/streamed")
    date = dt.datetime.now(dt.UTC).replace(microsecond=0)
    content_sha = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    headers = {
        "Host": url.netloc,
        "x-amz-content-sha256": content_sha,
        "x-amz-date": date.strftime("%Y%m%dT%H%M%SZ"),
        "x-amz-decoded-content-length": str(len(payload)),
        "Content-Encoding": "aws-chunked",
        "Content-Length": str(encoded_len),
    }
    headers = sign_v4_s3(
        method="PUT",
        url=url,
        region=REGION,
        headers=headers,
        credentials=Credentials(USER, PASSWORD),
        content_sha256=content_sha,
        date=date,
    )
    previous = headers["Authorization"].rsplit("Signature=", 1)[1]
    key = b"AWS4" + PASSWORD.encode()
    for part in (date.strftime("%Y%m%d"), REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    body = b""
    for chunk in chunks:
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-PAYLOAD",
                date.strftime("%Y%m%dT%H%M%SZ"),
                f"{date.strftime('%Y%m%d')}/{REGION}/s3/aws4_request",
                previous,
                hashlib.sha256(b"").hexdigest(),
                hashlib.sha256(chunk).hexdigest(),
            ]
        )
        previous = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        body += f"{len(chunk):x};chunk-signature={previous}\r\n".encode() + chunk + b"\r\n"
    assert len(body) == encoded_len
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("PUT", "/bucket-one/streamed", body=body, headers=headers)
    response = conn.getresponse()
    assert response.status == 200, response.read()
    assert server.client().get_object("bucket-one", "streamed").read() == payload


def test_multipart_upload_and_bulk_delete(server):
    client = server.client()
    client.make_bucket("bucket-one", location=REGION)
    data = os.urandom(11 * 1024 * 1024)
    client.put_object("bucket-one", "big.bin", io.BytesIO(data), -1, part_size=5 * 1024 * 1024)
    assert client.stat_object("bucket-one", "big.bin").etag.endswith("-3")
    assert client.get_object("bucket-one", "big.bin", offset=5, length=4).read() == data[5:9]
    from minio.deleteobjects import DeleteObject

    assert list(client.remove_objects("bucket-one", [DeleteObject("big.bin")])) == []
    assert list(client.list_objects("bucket-one")) == []
    client.remove_bucket("bucket-one")
    assert not client.bucket_exists("bucket-one")


def test_port_in_use_is_fatal(tmp_path, server, server_env):
    result = run_minio(
        "server", "--address", f"127.0.0.1:{server.port}", str(tmp_path / "other"), env=server_env
    )
    assert result.returncode == 1
    assert "Specified port is already in use" in result.stderr


def test_mirror_build_publishes_binary_and_checksum(tmp_path):
    from tests.lab.standins.minio import build

    ctx = types.SimpleNamespace(mirror_dir=tmp_path, base_url="http://10.77.0.1:8077", work_dir=tmp_path)
    first = build.build(ctx)
    binary = tmp_path / "minio" / "minio"
    assert binary.read_bytes() == SCRIPT.read_bytes()
    assert os.stat(binary).st_mode & 0o777 == 0o755
    digest = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()
    assert (tmp_path / "minio" / "minio.sha256sum").read_text() == f"{digest}  minio\n"
    mtime = binary.stat().st_mtime_ns
    time.sleep(0.01)
    assert build.build(ctx) == first and binary.stat().st_mtime_ns == mtime
