"""determined.tls: the keys and their rules, what the roles render and write, and the
controller's HTTPS client for the master (deploy/master_http.py) against a local TLS server."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import os
import runpy
import ssl
import threading
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
import yaml
from cryptography import x509

from deploy import determined_node, master_http
from deploy.cluster import ClusterError, load_cluster
from deploy.cluster.master_tls import agent_ca, served_chain
from deploy.facts.determined_users import MasterUsers, program_command
from roles.determined import common as determined_common
from roles.determined import master as determined_master
from roles.determined import tls as determined_tls
from tests.unit.test_storage_roles import NASTY, write_cluster
from tests.unit.tls_material import (
    Issued,
    make_ca,
    make_intermediate,
    make_server,
    pki_files,
    tls_keys,
    write,
)
from tests.verify.master_config import differences, expected_master_yaml
from tests.verify.test_determined import KNOWN_AGENT, KNOWN_MASTER, unknown_keys

PROGRAM = determined_common.__file__.replace("roles/determined/common.py", "files/determined/master-users.py")


@pytest.fixture
def pki(tmp_path):
    """A CA and a certificate for the master m1 in tmp files."""
    ca = make_ca("test master CA")
    server = make_server(ca, ["m1"], cn="determined-master")
    return pki_files(tmp_path, ca, server, "master")


@pytest.fixture
def load(tmp_path, monkeypatch):
    for key, value in NASTY.items():
        monkeypatch.setenv(key, value)

    def load_with(tls: dict | None, layout: str = "per_node"):
        doc = yaml.safe_load(write_cluster(tmp_path, layout=layout).read_text())
        if tls is not None:
            doc["determined"]["tls"] = tls
        path = tmp_path / "cluster.yaml"
        path.write_text(yaml.safe_dump(doc))
        return load_cluster(path)

    return load_with


def problems(load, *args, **kwargs) -> list[str]:
    with pytest.raises(ClusterError) as e:
        load(*args, **kwargs)
    return e.value.problems


def certs_of(text: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(text.encode())


# --- the keys --------------------------------------------------------------------------------


def test_tls_off_by_default(load):
    cluster = load(None)
    assert not cluster.determined.tls.enabled
    assert master_http.base_url(cluster) == "http://127.0.0.1:23457"


def test_tls_on(load, pki):
    cluster = load(tls_keys(pki))
    tls = cluster.determined.tls
    assert tls.enabled and "PRIVATE KEY" in tls.private_key.value
    assert "PRIVATE" not in repr(tls) and "BEGIN" not in repr(tls)
    assert master_http.base_url(cluster) == "https://127.0.0.1:23457"


@pytest.mark.parametrize(
    ("missing", "key", "what"),
    [
        ("private_key", "determined.tls.private_key", "'TLS cert file provided without a key file'"),
        ("certificate", "determined.tls.certificate", "'TLS key file provided without a cert file'"),
    ],
)
def test_half_a_pair_is_refused(load, pki, missing, key, what):
    found = problems(load, tls_keys(pki, **{missing: None}))
    assert any(f": {key}: (missing): " in p and what in p for p in found), found


def test_ca_alone_is_refused(load, pki):
    (line,) = problems(load, {"ca_certificate": {"file": pki["ca_file"]}})
    assert f"determined.tls.ca_certificate: {pki['ca_file']}: a CA without determined.tls.certificate" in line


def test_key_readable_by_others_is_refused(load, pki):
    os.chmod(pki["key_file"], 0o644)
    (line,) = problems(load, tls_keys(pki))
    assert "determined.tls.private_key" in line and line.endswith(f"chmod 600 {pki['key_file']}")


def test_missing_file_is_refused(load, pki):
    (line,) = problems(load, tls_keys(pki, certificate={"file": str(pki["dir"] / "nope.crt")}))
    assert line.endswith(
        f"determined.tls.certificate: {{file: {pki['dir']}/nope.crt}}: the file does not exist"
    )


def test_key_of_another_certificate_is_refused(load, pki):
    write(pki["dir"] / "master.key", make_server(pki["ca"], ["m1"]).key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "determined.tls.private_key" in line and "is not the key of determined.tls.certificate" in line
    assert "private key does not match public key" in line


def test_chain_in_the_wrong_order_says_so(load, pki):
    inter = make_intermediate(pki["ca"])
    leaf = make_server(inter, ["m1"])
    write(pki["dir"] / "master.crt", inter.cert_pem + leaf.cert_pem)
    write(pki["dir"] / "master.key", leaf.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "the first certificate must be the master's" in line


def test_certificate_must_name_master_host(load, pki):
    other = make_server(pki["ca"], ["elsewhere.test", "127.0.0.1"])
    write(pki["dir"] / "master.crt", other.cert_pem)
    write(pki["dir"] / "master.key", other.key_pem(), 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "determined.tls.certificate" in line and "does not name m1, master_host" in line
    assert "DNS:elsewhere.test, IP:127.0.0.1" in line and "add DNS:m1" in line


def test_expired_certificate_is_refused(load, pki):
    old = make_server(pki["ca"], ["m1"], days=-1)
    write(pki["dir"] / "master.crt", old.cert_pem)
    (line,) = problems(load, tls_keys(pki))
    assert "determined.tls.certificate" in line and "expired on" in line


def test_certificate_of_another_ca_is_refused(load, pki):
    write(pki["dir"] / "ca.crt", make_ca("another CA").cert_pem)
    (line,) = problems(load, tls_keys(pki))
    assert "is not issued by determined.tls.ca_certificate" in line


def test_without_ca_the_file_must_end_at_a_root(load, pki):
    (line,) = problems(load, tls_keys(pki, ca_certificate=None))
    assert "does not end at a self-signed root and determined.tls.ca_certificate is not set" in line
    # With its root appended (a full chain, as Determined's docs ask) it loads.
    write(pki["dir"] / "master.crt", pki["server"].cert_pem + pki["ca"].cert_pem)
    cluster = load(tls_keys(pki, ca_certificate=None))
    # The agents trust the root only: a renewed leaf under it leaves master-ca.crt as it was.
    assert certs_of(agent_ca(cluster.determined.tls, "m1")) == [pki["ca"].cert]


def test_a_self_signed_certificate_is_its_own_root(load, pki):
    own = self_signed("m1")
    write(pki["dir"] / "master.crt", own.cert_pem)
    write(pki["dir"] / "master.key", own.key_pem(), 0o600)
    tls = load(tls_keys(pki, ca_certificate=None)).determined.tls
    assert certs_of(served_chain(tls, "m1")) == [own.cert]
    assert agent_ca(tls, "m1") == served_chain(tls, "m1")


def test_served_chain_gets_the_root_appended(load, pki):
    inter = make_intermediate(pki["ca"])
    leaf = make_server(inter, ["m1"])
    write(pki["dir"] / "master.crt", leaf.cert_pem + inter.cert_pem)
    write(pki["dir"] / "master.key", leaf.key_pem(), 0o600)
    tls = load(tls_keys(pki)).determined.tls
    assert certs_of(served_chain(tls, "m1")) == [leaf.cert, inter.cert, pki["ca"].cert]
    assert certs_of(agent_ca(tls, "m1")) == [pki["ca"].cert]


def test_key_rules_are_gos_not_minios(load, pki):
    """Go's tls.X509KeyPair skips other blocks and ignores what follows the key; only the key
    block reaches the node. Encrypted keys are refused (Go cannot read them)."""
    key = pki["server"].key_pem()
    write(pki["dir"] / "master.key", pki["server"].cert_pem + key + b"\ntrailing text\n", 0o600)
    tls = load(tls_keys(pki)).determined.tls
    assert tls.private_key.value == key.decode()
    for legacy in (True, False):
        write(pki["dir"] / "master.key", pki["server"].key_pem(b"pass-word", legacy=legacy), 0o600)
        (line,) = problems(load, tls_keys(pki))
        assert "is encrypted: Determined's master cannot read it" in line
    write(pki["dir"] / "master.key", pki["server"].cert_pem, 0o600)
    (line,) = problems(load, tls_keys(pki))
    assert "holds no private key, only CERTIFICATE block(s)" in line


def test_private_key_in_a_certificate_file_is_refused(load, pki):
    write(pki["dir"] / "master.crt", pki["server"].cert_pem + pki["server"].key_pem())
    (line,) = problems(load, tls_keys(pki))
    assert "holds a PRIVATE KEY block: only CERTIFICATE blocks belong here" in line
    assert "every agent and into every trial container" in line and "MinIO" not in line


# --- what the roles render and write ---------------------------------------------------------


def test_master_yaml_with_and_without_tls(load, pki):
    off = yaml.safe_load(determined_master.master_yaml(load(None)))
    assert "tls" not in off["security"] and off["port"] == 23457
    on = yaml.safe_load(determined_master.master_yaml(load(tls_keys(pki))))
    assert unknown_keys(on, KNOWN_MASTER) == []
    assert on["security"]["tls"] == {
        "cert": "/etc/determined/certs/master.crt",
        "key": "/etc/determined/certs/master.key",
    }
    # Always written: Determined's default with TLS is 8443.
    assert on["port"] == 23457 and on["security"]["initial_user_password"] == NASTY["T_ADMIN"]
    # verify's own oracle (tests/verify/master_config.py) agrees, with and without TLS.
    assert differences(on, expected_master_yaml(load(tls_keys(pki)))) == []
    assert differences(off, expected_master_yaml(load(None))) == []


@pytest.mark.parametrize("layout", ["per_node", "per_domain"])
def test_agent_yaml_with_and_without_tls(load, pki, layout):
    path = "/etc/determined/agent-0.yaml"
    off = yaml.safe_load(determined_common.agent_config(load(None, layout), "g1-0", "0,1", path))
    assert "security" not in off
    cluster = load(tls_keys(pki), layout)
    on = yaml.safe_load(determined_common.agent_config(cluster, "g1-0", "0,1", path))
    assert unknown_keys(on, KNOWN_AGENT) == []
    assert on["security"] == {
        "tls": {
            "enabled": True,
            "master_cert": "/etc/determined/certs/master-ca.crt",
            "master_cert_name": "m1",
        }
    }
    assert on["master_host"] == "m1" and on["master_port"] == 23457 and on["visible_gpus"] == "0,1"


def test_health_check_by_name_against_the_ca(load, pki):
    assert determined_node.health_check(load(None)) == ("http://127.0.0.1:23457/health", None, {})
    assert determined_node.health_check(load(tls_keys(pki))) == (
        "https://m1:23457/health",
        "m1:23457:127.0.0.1",
        {"CURL_CA_BUNDLE": "/etc/determined/certs/master-ca.crt"},
    )


def _ops(monkeypatch):
    made: list[tuple[str, dict]] = []

    def record(kind):
        return lambda **kw: made.append((kind, kw)) or SimpleNamespace(did_change=lambda: False)

    monkeypatch.setattr(determined_tls.files, "directory", record("directory"))
    monkeypatch.setattr(determined_tls.files, "put", record("put"))
    monkeypatch.setattr(determined_tls, "secret_file", record("secret"))
    return made


def test_tls_off_removes_the_certs_directory(load, monkeypatch):
    made = _ops(monkeypatch)
    cluster = load(None)
    assert len(determined_tls.master_files(cluster)) == 1 and len(determined_tls.agent_files(cluster)) == 1
    assert [(k, d["path"], d["present"]) for k, d in made] == [
        ("directory", "/etc/determined/certs", False)
    ] * 2


def test_tls_on_writes_the_interface_files(load, pki, monkeypatch):
    made = _ops(monkeypatch)
    cluster = load(tls_keys(pki))
    assert len(determined_tls.master_files(cluster)) == 3
    written = {kw.get("dest") or kw["path"]: (kind, kw) for kind, kw in made}
    assert written["/etc/determined/certs"][1]["mode"] == "755"
    kind, crt = written["/etc/determined/certs/master.crt"]
    assert (
        kind == "put"
        and crt["mode"] == "644"
        and crt["src"].getvalue() == served_chain(cluster.determined.tls, "m1")
    )
    kind, key = written["/etc/determined/certs/master.key"]
    assert kind == "secret" and key["content"].data == cluster.determined.tls.private_key.value.encode()
    assert "mode" not in key  # secret_file's default: 0600 root
    kind, ca = written["/etc/determined/certs/master-ca.crt"]
    assert ca["mode"] == "644" and ca["src"].getvalue() == pki["ca"].cert_pem.decode()
    made.clear()
    assert len(determined_tls.agent_files(cluster)) == 1
    assert [kw.get("dest") for kind, kw in made if kind == "put"] == ["/etc/determined/certs/master-ca.crt"]


def test_users_program_gets_the_name_and_ca_only_with_tls():
    plain = MasterUsers().command(port=8080, config="/etc/determined/master.yaml")
    assert plain.startswith("python3 -c ") and plain.endswith(" status 8080 /etc/determined/master.yaml")
    over = MasterUsers().command(
        8080, "/etc/x.yaml", cert_name="m1", cert_file="/etc/determined/certs/master-ca.crt"
    )
    assert over.startswith(
        "DET_MASTER_CERT_NAME=m1 DET_MASTER_CERT_FILE=/etc/determined/certs/master-ca.crt python3 -c "
    )
    assert program_command("apply", 1, "x", tls=("a b", "/c")).startswith("DET_MASTER_CERT_NAME='a b' ")


# --- the controller's client and the users program against a local TLS server ---------------


def self_signed(name: str) -> Issued:
    """A self-signed end-entity certificate naming `name` (what `openssl req -x509` makes)."""
    import datetime as dt

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "up"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(401)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(cert_file: str, key_file: str):
    """An https server on 127.0.0.1 with that pair; yields its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tls_server(pki):
    """pki's certificate for m1 served on 127.0.0.1; yields the port."""
    with serving(pki["cert_file"], pki["key_file"]) as port:
        yield port


def test_controller_client_trusts_a_self_signed_certificate(load, pki):
    own = self_signed("m1")
    write(pki["dir"] / "master.crt", own.cert_pem)
    write(pki["dir"] / "master.key", own.key_pem(), 0o600)
    tls = load(tls_keys(pki, ca_certificate=None)).determined.tls
    with serving(pki["cert_file"], pki["key_file"]) as port:
        base = master_http.base_url(_cluster_at(port, tls))
        with master_http.urlopen(base + "/health", timeout=5) as response:
            assert response.status == 200


def _cluster_at(port: int, tls, host: str = "m1"):
    node = SimpleNamespace(address=ipaddress.ip_address("127.0.0.1"))
    return SimpleNamespace(
        master_node=node, master_port=port, master_host=host, determined=SimpleNamespace(tls=tls)
    )


def test_controller_client_checks_the_name_against_the_ca(load, pki, tls_server):
    tls = load(tls_keys(pki)).determined.tls
    base = master_http.base_url(_cluster_at(tls_server, tls))
    assert base == f"https://127.0.0.1:{tls_server}"
    with master_http.urlopen(urllib.request.Request(base + "/health"), timeout=5) as response:
        assert json.loads(response.read()) == {"status": "up"}
    # The 401 handling of the callers (deploy/rebuild.py) sees urllib's own HTTPError.
    with pytest.raises(urllib.error.HTTPError) as e:
        master_http.urlopen(urllib.request.Request(base + "/api/v1/auth/login", data=b"{}"), timeout=5)
    assert e.value.code == 401
    # Another name: refused by the certificate check, as urllib reports it.
    wrong = master_http.base_url(_cluster_at(tls_server, tls, host="m2"))
    assert wrong == base  # same address: the last registration wins
    with pytest.raises(urllib.error.URLError) as e:
        master_http.urlopen(base + "/health", timeout=5)
    assert "m2" in str(e.value.reason) or "hostname" in str(e.value.reason).lower()


def test_users_program_speaks_https_with_the_name(pki, tls_server, monkeypatch):
    namespace = runpy.run_path(PROGRAM, run_name="master_users")
    monkeypatch.setenv("DET_MASTER_CERT_NAME", "m1")
    monkeypatch.setenv("DET_MASTER_CERT_FILE", pki["ca_file"])
    master = namespace["Master"](tls_server)
    assert master.url == f"https://127.0.0.1:{tls_server}"
    assert master.call("GET", "/health") == (200, {"status": "up"})
    assert master.login("admin", "x")[0] == 401
    monkeypatch.setenv("DET_MASTER_CERT_NAME", "m2")
    assert namespace["Master"](tls_server).call("GET", "/health") == (None, {})
    monkeypatch.delenv("DET_MASTER_CERT_NAME")
    assert namespace["Master"](tls_server).url == f"http://127.0.0.1:{tls_server}"
