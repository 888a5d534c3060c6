"""storage.tls: the keys and their rules, what the roles write, and the MinIO stand-in's TLS,
driven by the deploy's own S3 client (deploy/s3.py) on loopback."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from deploy import s3
from deploy.cluster import ClusterError, load_cluster
from roles.determined import master as determined_master
from roles.minio import server as minio
from roles.minio import tls as minio_tls
from tests.unit.test_standin_minio import SCRIPT, free_port
from tests.unit.test_storage_roles import NASTY, write_cluster
from tests.unit.tls_material import make_ca, make_intermediate, make_server, pki_files, tls_keys, write
from tests.verify.master_config import differences, expected_master_yaml
from tests.verify.test_determined import KNOWN_MASTER, unknown_keys


@pytest.fixture
def pki(tmp_path):
    """A CA and a certificate for the storage node m1 (name and address) in tmp files."""
    ca = make_ca()
    server = make_server(ca, ["m1", "127.0.0.1"])
    return pki_files(tmp_path, ca, server, "minio")


@pytest.fixture
def load(tmp_path, monkeypatch):
    for key, value in NASTY.items():
        monkeypatch.setenv(key, value)

    def load_with(tls: dict | None, endpoint_url: str | None = None, port: int = 9000):
        doc = yaml.safe_load(write_cluster(tmp_path, storage_port=port).read_text())
        if tls is not None:
            doc["storage"]["tls"] = tls
        if endpoint_url is not None:
            doc["storage"]["endpoint_url"] = endpoint_url
        path = tmp_path / "cluster.yaml"
        path.write_text(yaml.safe_dump(doc))
        return load_cluster(path)

    return load_with


def problems(load, *args, **kwargs) -> list[str]:
    with pytest.raises(ClusterError) as e:
        load(*args, **kwargs)
    return e.value.problems


# --- the keys --------------------------------------------------------------------------------


def test_tls_off_by_default(load):
    cluster = load(None)
    assert not cluster.storage.tls.enabled
    assert cluster.storage.endpoint_url == "http://m1:9000"


def test_tls_on_makes_the_default_endpoint_https(load, pki):
    cluster = load(tls_keys(pki))
    tls = cluster.storage.tls
    assert tls.enabled and cluster.storage.endpoint_url == "https://m1:9000"
    assert "PRIVATE KEY" in tls.private_key.value
    assert "PRIVATE" not in repr(tls) and "BEGIN" not in repr(tls)


@pytest.mark.parametrize(
    ("missing", "key", "what"),
    [
        ("private_key", "storage.tls.private_key", "needs its private key"),
        ("certificate", "storage.tls.certificate", "needs its certificate"),
    ],
)
def test_half_a_pair_is_refused(load, pki, missing, key, what):
    found = problems(load, tls_keys(pki, **{missing: None}))
    assert any(f": {key}: " in p and what in p for p in found), found


def test_ca_alone_is_refused(load, pki):
    found = problems(load, {"ca_certificate": {"file": pki["ca_file"]}})
    assert any("storage.tls.ca_certificate" in p and "without storage.tls.certificate" in p for p in found), (
        found
    )


def test_scheme_must_follow_tls(load, pki):
    found = problems(load, tls_keys(pki), endpoint_url="http://m1:9000")
    assert any("storage.endpoint_url: 'http://m1:9000'" in p and "https://" in p for p in found), found
    found = problems(load, None, endpoint_url="https://m1:9000")
    assert any("storage.endpoint_url" in p and "https needs storage.tls" in p for p in found), found


def test_key_readable_by_others_is_refused(load, pki):
    os.chmod(pki["key_file"], 0o644)
    (line,) = problems(load, tls_keys(pki))
    assert line.endswith(f"chmod 600 {pki['key_file']}") and "storage.tls.private_key" in line


def test_key_must_be_a_file_reference(load, pki):
    (line,) = problems(load, tls_keys(pki, private_key=pki["key_file"]))
    assert "storage.tls.private_key: (a plain string, not shown): must be {file: PATH}" in line


def test_encrypted_keys_are_refused(load, pki):
    for legacy in (True, False):
        write(pki["dir"] / "minio.key", pki["server"].key_pem(b"pass-word", legacy=legacy), 0o600)
        (line,) = problems(load, tls_keys(pki))
        assert "storage.tls.private_key" in line and "is encrypted" in line


def test_key_with_more_than_one_block_is_refused(load, pki):
    write(pki["dir"] / "minio.key", pki["server"].key_pem() + pki["server"].cert_pem, 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "has data after the key's END line" in line and "additional data" in line


def test_key_of_another_certificate_is_refused(load, pki):
    other = make_server(pki["ca"], ["m1"])
    write(pki["dir"] / "minio.key", other.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "storage.tls.private_key" in line and "is not the key of storage.tls.certificate" in line
    assert "BEGIN" not in line


def test_certificate_must_name_the_endpoint_host(load, pki):
    other = make_server(pki["ca"], ["other.example"])
    write(pki["dir"] / "minio.crt", other.cert_pem)
    write(pki["dir"] / "minio.key", other.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "does not name m1, endpoint_url's host (it names: DNS:other.example)" in line


def test_certificate_of_another_ca_is_refused(load, pki):
    write(pki["dir"] / "ca.crt", make_ca("someone else").cert_pem)
    (line,) = problems(load, tls_keys(pki))
    assert "is not issued by storage.tls.ca_certificate" in line


def test_expired_certificate_is_refused(load, pki):
    old = make_server(pki["ca"], ["m1"], days=-2)
    write(pki["dir"] / "minio.crt", old.cert_pem)
    write(pki["dir"] / "minio.key", old.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "expired on" in line


def test_not_a_certificate_is_refused(load, pki):
    write(pki["dir"] / "minio.crt", b"hello\n")
    found = problems(load, tls_keys(pki))
    assert any("not a certificate in PEM" in p for p in found), found


def test_files_not_read_without_resolving_secrets(tmp_path, pki, load):
    load(tls_keys(pki))  # writes cluster.yaml
    cluster = load_cluster(tmp_path / "cluster.yaml", resolve_secrets=False)
    assert cluster.storage.tls.enabled and not cluster.storage.tls.private_key.resolved


# --- what the roles write ----------------------------------------------------------------------


def test_minio_options_and_readiness(load, pki):
    off, on = load(None), load(tls_keys(pki))
    assert "--certs-dir" not in minio.server_options(off)
    assert f"--address :9000 --certs-dir {minio_tls.CERTS_DIR} --console" in minio.server_options(on)
    assert minio_tls.ready_check(off) == ("http://127.0.0.1:9000/minio/health/ready", None)
    assert minio_tls.ready_check(on) == ("https://m1:9000/minio/health/ready", "m1:9000:127.0.0.1")


def test_readiness_by_address_needs_no_resolve_and_brackets_ipv6(load, pki):
    write(pki["dir"] / "minio.crt", (by_ip := make_server(pki["ca"], ["127.0.0.1"])).cert_pem)
    write(pki["dir"] / "minio.key", by_ip.key_pem(), 0o600)
    cluster = load(tls_keys(pki), endpoint_url="https://127.0.0.1:9000")
    assert minio_tls.ready_check(cluster) == ("https://127.0.0.1:9000/minio/health/ready", None)
    v6 = SimpleNamespace(
        storage=SimpleNamespace(
            tls=SimpleNamespace(enabled=True), endpoint_url="https://[fd00::5]:9000", port=9000
        )
    )
    assert minio_tls.ready_check(v6) == ("https://[fd00::5]:9000/minio/health/ready", None)


def test_wait_for_http_pins_the_name_with_resolve(monkeypatch):
    from roles.shared import ops as shared_ops

    monkeypatch.setattr(shared_ops.server, "shell", lambda **kwargs: kwargs)
    (plain,) = shared_ops.wait_for_http("http://127.0.0.1:9000/x", "MinIO")["commands"]
    assert "--resolve" not in plain and "curl -fsS -o /dev/null --max-time 2 http://127.0.0.1:9000/x" in plain
    op = shared_ops.wait_for_http("https://m1:9000/x", "MinIO", resolve="m1:9000:127.0.0.1")
    assert op["name"] == "Wait until MinIO is ready"
    assert "--max-time 2 --resolve m1:9000:127.0.0.1 https://m1:9000/x && exit 0" in op["commands"][0]


def test_master_yaml_gives_trials_the_ca(load, pki):
    off = yaml.safe_load(determined_master.master_yaml(load(None)))
    assert "bind_mounts" not in off["task_container_defaults"]
    text = determined_master.master_yaml(load(tls_keys(pki)))
    config = yaml.safe_load(text)
    assert unknown_keys(config, KNOWN_MASTER) == []
    tcd = config["task_container_defaults"]
    # The agent's whole bundle (public CAs + the private one), not the private CA alone.
    assert tcd["bind_mounts"] == [
        {
            "host_path": "/etc/ssl/certs/ca-certificates.crt",
            "container_path": minio_tls.CONTAINER_BUNDLE,
            "read_only": True,
        }
    ]
    assert not minio_tls.CONTAINER_BUNDLE.startswith(("/etc/ssl/", "/usr/", "/etc/pki/"))
    env = tcd["environment_variables"]
    assert f"AWS_CA_BUNDLE={minio_tls.CONTAINER_BUNDLE}" in env
    assert f"REQUESTS_CA_BUNDLE={minio_tls.CONTAINER_BUNDLE}" in env
    # The certificate names 127.0.0.1, m1's address: trials on the bridge use the address.
    assert config["checkpoint_storage"]["endpoint_url"] == "https://127.0.0.1:9000"
    # verify's own oracle (tests/verify/master_config.py) agrees, with and without the CA.
    assert differences(config, expected_master_yaml(load(tls_keys(pki)))) == []
    assert differences(off, expected_master_yaml(load(None))) == []
    # A master.yaml without the CA's parts, for a cluster with it: each part named.
    bundle, env = minio_tls.CONTAINER_BUNDLE, "task_container_defaults.environment_variables"
    lines = differences(off, expected_master_yaml(load(tls_keys(pki))))
    assert lines[0] == (
        "checkpoint_storage.endpoint_url is 'http://127.0.0.1:9000', cluster.yaml implies 'https://127.0.0.1:9000'"
    )
    assert lines[1].startswith("task_container_defaults.bind_mounts is missing, cluster.yaml implies [{")
    assert lines[2:] == [f"{env} lacks AWS_CA_BUNDLE={bundle}", f"{env} lacks REQUESTS_CA_BUNDLE={bundle}"]


def test_certificate_must_name_the_address_trials_use(load, pki):
    """Trials reach MinIO by the node's address (Docker's bridge network cannot resolve m1):
    a certificate naming only the hostname would fail every checkpoint at run time."""
    write(pki["dir"] / "minio.crt", (named := make_server(pki["ca"], ["m1"])).cert_pem)
    write(pki["dir"] / "minio.key", named.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "storage.tls.certificate" in line and "does not name 127.0.0.1, m1's address" in line
    assert "add IP:127.0.0.1" in line and "bridge network" in line
    # Written by address, the address is the name: no second one needed.
    write(pki["dir"] / "minio.crt", (by_ip := make_server(pki["ca"], ["127.0.0.1"])).cert_pem)
    write(pki["dir"] / "minio.key", by_ip.key_pem(), 0o600)
    cluster = load(tls_keys(pki), endpoint_url="https://127.0.0.1:9000")
    assert cluster.trial_endpoint == "https://127.0.0.1:9000"


# --- the MinIO stand-in's TLS, with the deploy's client --------------------------------------


def start_standin(tmp_path: Path, certs: Path, env: dict | None = None, port: int | None = None):
    port = port or free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MINIO_")}
    full_env.update({"MINIO_ROOT_USER": NASTY["T_ACCESS"], "MINIO_ROOT_PASSWORD": NASTY["T_SECRET"]})
    full_env.update({"MINIO_BROWSER": "off", **(env or {})})
    args = [
        sys.executable,
        str(SCRIPT),
        "server",
        "--address",
        f"127.0.0.1:{port}",
        "--certs-dir",
        str(certs),
    ]
    proc = subprocess.Popen(
        [*args, str(tmp_path / "data")], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    return proc, port


def wait_listening(proc, port: int) -> None:
    for _ in range(100):
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read().decode())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the stand-in did not listen")


def fails_with(tmp_path: Path, certs: Path, env: dict | None = None) -> str:
    proc, _ = start_standin(tmp_path, certs, env)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 1
    return out.decode()


@pytest.fixture
def certs_dir(tmp_path, pki):
    d = tmp_path / "certs"
    d.mkdir()
    write(d / "public.crt", pki["server"].cert_pem)
    write(d / "private.key", pki["server"].key_pem(), 0o600)
    return d


def test_standin_serves_tls_to_the_deploys_client(tmp_path, certs_dir, load, pki):
    proc, port = start_standin(tmp_path, certs_dir)
    try:
        wait_listening(proc, port)
        cluster = load(tls_keys(pki), port=port)
        assert s3.ensure_bucket(cluster) is True  # minio-py over https, the CA from cluster.yaml
        assert s3.bucket_problem(cluster) is None
        # Plain http on the S3 port: Go's net/http answer, no S3.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/minio/health/ready")
        response = conn.getresponse()
        assert response.status == 400 and b"HTTP request to an HTTPS server" in response.read()
        # The certificate, checked like a client does against the CA, by name.
        context = ssl.create_default_context(cafile=pki["ca_file"])
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            context.wrap_socket(raw, server_hostname="m1"),
        ):
            pass
        assert (certs_dir / "CAs").is_dir()  # mkdirAllIgnorePerm(<certs>/CAs)
    finally:
        proc.kill()
        proc.wait()


def test_standin_without_the_pair_serves_http(tmp_path, certs_dir):
    (certs_dir / "private.key").unlink()
    proc, port = start_standin(tmp_path, certs_dir)
    try:
        wait_listening(proc, port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/minio/health/live")
        assert conn.getresponse().status == 200
    finally:
        proc.kill()
        proc.wait()


def test_standin_refuses_a_key_that_is_not_the_certificates(tmp_path, certs_dir, pki):
    write(certs_dir / "private.key", make_server(pki["ca"], ["m1"]).key_pem(), 0o600)
    out = fails_with(tmp_path, certs_dir)
    assert "FATAL Unable to load the TLS configuration: tls: private key does not match public key" in out
    assert "> Please check your certificate" in out


def test_standin_refuses_encrypted_keys_like_minio(tmp_path, certs_dir, pki):
    write(certs_dir / "private.key", pki["server"].key_pem(b"pass-word", legacy=True), 0o600)
    out = fails_with(tmp_path, certs_dir)
    assert "FATAL Unable to load the TLS configuration: Missing TLS password" in out
    assert "MINIO_CERT_PASSWD" in out
    out = fails_with(tmp_path, certs_dir, {"MINIO_CERT_PASSWD": "wrong-one"})
    assert "x509: decryption password incorrect" in out
    write(certs_dir / "private.key", pki["server"].key_pem(b"pass-word"), 0o600)  # PKCS#8
    assert "tls: failed to parse private key" in fails_with(tmp_path, certs_dir)


def test_standin_decrypts_a_legacy_key_with_its_password(tmp_path, certs_dir, pki):
    write(certs_dir / "private.key", pki["server"].key_pem(b"pass-word", legacy=True), 0o600)
    proc, port = start_standin(tmp_path, certs_dir, {"MINIO_CERT_PASSWD": "pass-word"})
    try:
        wait_listening(proc, port)
    finally:
        proc.kill()
        proc.wait()


def test_standin_refuses_extra_data_and_bad_certificates(tmp_path, certs_dir, pki):
    write(certs_dir / "private.key", pki["server"].key_pem() + b"\n" + pki["server"].key_pem(), 0o600)
    assert "The private key contains additional data" in fails_with(tmp_path, certs_dir)
    write(certs_dir / "private.key", pki["server"].key_pem(), 0o600)
    write(certs_dir / "public.crt", b"not a certificate\n")
    assert f"Could not read PEM block from file {certs_dir}/public.crt" in fails_with(tmp_path, certs_dir)


@pytest.mark.parametrize(
    ("port", "url", "why"),
    [
        (443, "https://m1", None),
        (9100, "https://m1:9100", None),
        (80, "https://m1", "has no port, so S3 clients would use 443"),
    ],
)
def test_https_endpoints_with_tls(load, pki, port, url, why):
    """endpoint_url's port rules hold for https (moved here from test_cluster_input.py: https
    needs storage.tls since that exists)."""
    if why is None:
        assert load(tls_keys(pki), endpoint_url=url, port=port).storage.endpoint_url == url
    else:
        (line,) = problems(load, tls_keys(pki), endpoint_url=url, port=port)
        assert "storage.endpoint_url" in line and why in line


def test_experiment_target_gets_the_trials_endpoint(load, pki, tmp_path):
    """deploy/experiment loads without secrets: the certificate is still read for its names."""
    from deploy.experiment import target

    load(tls_keys(pki))
    assert target.load(str(tmp_path / "cluster.yaml")).endpoint_url == "https://127.0.0.1:9000"


def test_standin_survives_clients_that_close_after_the_handshake(tmp_path, certs_dir, pki):
    """TLS 1.3 session tickets go out after the handshake: a client gone by then gave the
    stand-in a SIGPIPE (Go's runtime ignores it on sockets)."""
    proc, port = start_standin(tmp_path, certs_dir)
    try:
        wait_listening(proc, port)
        context = ssl.create_default_context(cafile=pki["ca_file"])
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port)) as raw:
                context.wrap_socket(raw, server_hostname="m1").close()
        time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read().decode()
    finally:
        proc.kill()
        proc.wait()


# --- review fixes: what reaches the nodes, Go's PEM rules, names, chains ----------------------

KEY_BODY_START = b"-----BEGIN PRIVATE KEY-----\n"


def test_private_key_in_a_certificate_file_is_refused(load, pki):
    """A key pasted into a certificate file would go to every node world-readable."""
    for name, key in (("minio.crt", "storage.tls.certificate"), ("ca.crt", "storage.tls.ca_certificate")):
        original = Path(pki["dir"] / name).read_bytes()
        write(pki["dir"] / name, original + pki["server"].key_pem())
        found = problems(load, tls_keys(pki))
        assert len(found) == 1 and f": {key}: " in found[0], found
        assert "holds a PRIVATE KEY block: only CERTIFICATE blocks belong here" in found[0]
        assert "MII" not in found[0]
        write(pki["dir"] / name, original)


def test_only_reencoded_certificates_are_shipped(load, pki, monkeypatch):
    """Text around the blocks (comments, openssl x509 -text output) never leaves the controller."""
    chain = b"subject=CN=minio \xc3\xa9t\xc3\xa9\n" + pki["server"].cert_pem + b"\n\n# end\n"
    write(pki["dir"] / "minio.crt", chain)
    write(pki["dir"] / "ca.crt", b"Bag Attributes: x\r\n" + pki["ca"].cert_pem.replace(b"\n", b"\r\n"))
    tls = load(tls_keys(pki)).storage.tls
    assert tls.certificate.text == pki["server"].cert_pem.decode()
    assert tls.ca_certificate.text == pki["ca"].cert_pem.decode()
    puts = []
    monkeypatch.setattr(minio_tls.files, "put", lambda **kw: puts.append(kw) or SimpleNamespace())
    monkeypatch.setattr(minio_tls.files, "directory", lambda **kw: SimpleNamespace())
    monkeypatch.setattr(minio_tls, "secret_file", lambda **kw: SimpleNamespace())
    minio_tls.certs(load(tls_keys(pki)))
    (public,) = puts
    assert public["dest"] == f"{minio_tls.CERTS_DIR}/public.crt"
    assert public["src"].read() == pki["server"].cert_pem.decode()


def test_key_with_non_ascii_text_before_it_is_read_without_it(load, pki):
    """Go's pem.Decode skips text before the BEGIN line (MinIO accepts it); the key shipped
    starts at that line, so a UTF-8 comment neither crashes `check` nor reaches the node."""
    write(pki["dir"] / "minio.key", "# clé de MinIO\n".encode() + pki["server"].key_pem(), 0o600)
    value = load(tls_keys(pki)).storage.tls.private_key.value
    assert value == pki["server"].key_pem().decode()
    # Latin-1, not UTF-8, before the block: the same.
    write(pki["dir"] / "minio.key", b"\xe9t\xe9\n" + pki["server"].key_pem(), 0o600)
    assert load(tls_keys(pki)).storage.tls.private_key.value.startswith("-----BEGIN PRIVATE KEY-----")


def test_key_block_with_non_ascii_header_is_one_line(load, pki):
    pem = pki["server"].key_pem().replace(KEY_BODY_START, KEY_BODY_START + b"Comment: \xe9\n\n")
    write(pki["dir"] / "minio.key", pem, 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "storage.tls.private_key" in line and "non-ASCII" in line


@pytest.mark.parametrize(
    ("tail", "ok"),
    [
        (b"", True),
        (b"  \t", True),  # spaces after END on its line: getLine trims them
        (b"\r", True),  # \r\n ends the END line
        (b"\n", False),  # a blank line after the END line: rest, "additional data"
        (b" \n", False),
        (b"\n# comment", False),
        (b" # comment", None),  # not whitespace after END on its line: no block at all
    ],
)
def test_key_end_follows_go(load, pki, tail, ok):
    """golang/go src/encoding/pem/pem.go Decode consumes only the END line's own newline;
    minio internal/config/certs.go LoadX509KeyPair refuses any rest."""
    pem = pki["server"].key_pem()
    write(pki["dir"] / "minio.key", pem[:-1] + tail + b"\n" if tail != b"\r" else pem[:-1] + b"\r\n", 0o600)
    if ok:
        assert load(tls_keys(pki)).storage.tls.enabled
    else:
        (line,) = problems(load, tls_keys(pki))
        assert ("additional data" if ok is False else "no '-----BEGIN ... PRIVATE KEY-----' block") in line


def test_pem_decode_is_gos():
    from deploy.cluster.storage_tls import pem_decode

    body = b"-----BEGIN X-----\nAAEC\n-----END X-----\n"
    assert pem_decode(body) == ((("X", {}, b"\x00\x01\x02", 0)), b"")
    assert pem_decode(b"text\n" + body + b"\n")[1] == b"\n"
    assert pem_decode(b"text" + body)[0] is None  # BEGIN must start a line
    bad = b"-----BEGIN X-----\nA!!C\n-----END X-----\n"  # not base64: skipped, like Go
    assert pem_decode(bad + body)[0].start == len(bad)
    block, rest = pem_decode(
        b"-----BEGIN X-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: A\n\nAAEC\n-----END X-----"
    )
    assert block.headers == {"Proc-Type": "4,ENCRYPTED", "DEK-Info": "A"} and rest == b""
    assert pem_decode(b"-----BEGIN X-----\nAAEC\n-----END Y-----\n")[0] is None


def test_an_ip_endpoint_needs_an_ip_entry(load, pki):
    """RFC 6125 / Go's VerifyHostname / OpenSSL: DNS:127.0.0.1 does not name the address."""
    from deploy.cluster.storage_tls import names_host

    write(pki["dir"] / "minio.crt", (dns := make_server(pki["ca"], [])).cert_pem)
    write(pki["dir"] / "minio.key", dns.key_pem(), 0o600)
    builder_cert = _with_dns_sans(pki, ["127.0.0.1", "m1"])
    assert not names_host(builder_cert.cert, "127.0.0.1") and names_host(builder_cert.cert, "m1")
    write(pki["dir"] / "minio.crt", builder_cert.cert_pem)
    write(pki["dir"] / "minio.key", builder_cert.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki), endpoint_url="https://127.0.0.1:9000")
    assert "does not name 127.0.0.1, endpoint_url's host (it names: DNS:127.0.0.1, DNS:m1)" in line
    (line,) = problems(load, tls_keys(pki))  # by name: the address trials use is missing
    assert "does not name 127.0.0.1, m1's address" in line
    wild = make_server(pki["ca"], ["*.example.org"])
    assert names_host(wild.cert, "a.example.org") and not names_host(wild.cert, "a.b.example.org")
    assert not names_host(wild.cert, "example.org")


def _with_dns_sans(pki, names):
    """A certificate with only DNS entries, even for what looks like an address."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from tests.unit.tls_material import Issued

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(pki["ca"].cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=3))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .sign(pki["ca"].key, hashes.SHA256())
    )
    return Issued(cert, key)


def test_intermediate_as_ca_is_refused_root_with_chain_is_not(load, pki):
    """OpenSSL clients (urllib3, boto3, pg-backup) stop at an intermediate in their store:
    "unable to get issuer certificate"."""
    inter = make_intermediate(pki["ca"])
    leaf = make_server(inter, ["m1", "127.0.0.1"])
    write(pki["dir"] / "minio.crt", leaf.cert_pem + inter.cert_pem)
    write(pki["dir"] / "minio.key", leaf.key_pem(), 0o600)
    assert load(tls_keys(pki)).storage.tls.enabled  # root in ca_certificate, chain in the file
    write(pki["dir"] / "ca.crt", inter.cert_pem)
    (line,) = problems(load, tls_keys(pki))
    assert "storage.tls.certificate" in line and "not a self-signed root" in line
    assert "unable to get issuer certificate" in line
    write(pki["dir"] / "ca.crt", pki["ca"].cert_pem)
    write(pki["dir"] / "minio.crt", leaf.cert_pem)  # intermediate left out
    (line,) = problems(load, tls_keys(pki))
    assert "is not issued by storage.tls.ca_certificate" in line


def test_chain_in_the_wrong_order_says_so(load, pki):
    inter = make_intermediate(pki["ca"])
    leaf = make_server(inter, ["m1", "127.0.0.1"])
    write(pki["dir"] / "minio.crt", inter.cert_pem + leaf.cert_pem)
    write(pki["dir"] / "minio.key", leaf.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "the first certificate must be the server's" in line


def test_ca_without_certificate_shows_the_path(load, pki):
    (line,) = problems(load, {"ca_certificate": {"file": pki["ca_file"]}})
    assert f"storage.tls.ca_certificate: {pki['ca_file']}: a CA without" in line and "PemFile(" not in line


def test_tls_off_removes_only_the_certs_directory(load, monkeypatch):
    made = []
    monkeypatch.setattr(minio_tls.files, "directory", lambda **kw: made.append(kw) or SimpleNamespace())
    minio_tls.certs(load(None))
    assert [(d["path"], d["present"]) for d in made] == [(minio_tls.CERTS_DIR, False)]
    assert minio_tls.CERTS_DIR != minio_tls.CONFIG_DIR


def test_unreachable_shows_the_tls_reason(tmp_path, certs_dir, load, pki):
    """A client that refuses the certificate: the SSL error, not only "MaxRetryError"."""
    proc, port = start_standin(tmp_path, certs_dir)
    try:
        wait_listening(proc, port)
        # check_tls would refuse another CA: loaded with the right one, swapped in memory.
        cluster = load(tls_keys(pki), port=port)
        problem = s3.bucket_problem(_with_ca(cluster, make_ca("someone else")))
        assert problem is not None and "SSLError" in problem and "certificate verify failed" in problem
        with pytest.raises(s3.BucketError, match="certificate verify failed"):
            s3.ensure_bucket(_with_ca(cluster, make_ca("another one")))
    finally:
        proc.kill()
        proc.wait()


def _with_ca(cluster, ca):
    import dataclasses

    from deploy.cluster.storage_tls import PemFile

    tls = dataclasses.replace(cluster.storage.tls, ca_certificate=PemFile("/x", ca.cert_pem.decode()))
    return dataclasses.replace(cluster, storage=dataclasses.replace(cluster.storage, tls=tls))


def test_standin_follows_gos_pem_rules(tmp_path, certs_dir, pki):
    """MinIO (pem.Decode): text before the key's BEGIN line is fine, a blank line after its
    END line is "additional data"; public.crt may have text before a block, not a key block."""
    write(certs_dir / "private.key", "# clé\n".encode() + pki["server"].key_pem(), 0o600)
    proc, port = start_standin(tmp_path, certs_dir)
    try:
        wait_listening(proc, port)
    finally:
        proc.kill()
        proc.wait()
    write(certs_dir / "private.key", pki["server"].key_pem() + b"\n", 0o600)
    assert "The private key contains additional data" in fails_with(tmp_path, certs_dir)
    write(certs_dir / "private.key", pki["server"].key_pem(), 0o600)
    write(certs_dir / "public.crt", pki["server"].cert_pem + pki["server"].key_pem())
    assert f"Failed to parse `{certs_dir}/public.crt`" in fails_with(tmp_path, certs_dir)


def test_bundle_is_rebuilt_when_it_lacks_the_ca(load, pki, monkeypatch):
    """Trials mount the agents' bundle: update-ca-certificates runs when the CA file changes
    and also when the bundle lacks the CA (a run that stopped between the two); not else."""
    guards: list = []
    asked: list = []
    put = SimpleNamespace(did_change=lambda: False)
    monkeypatch.setattr(minio_tls, "packages", lambda *a: None)
    monkeypatch.setattr(minio_tls.files, "put", lambda **kw: put)
    monkeypatch.setattr(minio_tls.server, "shell", lambda **kw: guards.append(kw["_if"]))
    cluster = load(tls_keys(pki))
    cases = [(["x"], False, False), ([], False, True), (None, False, True), (["x"], True, True)]
    for found, changed, runs in cases:
        fake_host = SimpleNamespace(get_fact=lambda fact, f=found, **kw: asked.append(kw) or f)
        monkeypatch.setattr(minio_tls, "host", fake_host)
        put.did_change = lambda c=changed: c
        guards.clear()
        minio_tls.apply.__wrapped__(cluster=cluster, node=None)
        (guard,) = guards
        assert bool(guard()) is runs, (found, changed)
    assert asked[0] == {
        "path": minio_tls.SYSTEM_BUNDLE,
        "pattern": pki["ca"].cert_pem.decode().splitlines()[1],
    }


def test_key_label_does_not_matter_like_go(load, pki):
    """tls.X509KeyPair parses a "... PRIVATE KEY" block as PKCS#1, PKCS#8 or SEC 1, whatever
    its label says: a PKCS#8 body labelled EC is fine (and no traceback)."""
    relabelled = pki["server"].key_pem().replace(b"PRIVATE KEY", b"EC PRIVATE KEY")
    write(pki["dir"] / "minio.key", relabelled, 0o600)
    assert load(tls_keys(pki)).storage.tls.private_key.value == relabelled.decode()
