"""Throwaway CAs, certificates and keys for the storage.tls tests (unit and lab)."""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self, password: bytes | None = None, legacy: bool = False) -> bytes:
        if password is None:
            encryption: serialization.KeySerializationEncryption = serialization.NoEncryption()
        else:
            encryption = serialization.BestAvailableEncryption(password)
        if legacy and password is not None:
            # RFC 1423 "Proc-Type: 4,ENCRYPTED" (what Go's x509.IsEncryptedPEMBlock sees).
            return self.key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, encryption
            )
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str = "test storage CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def make_server(ca: Issued, names: list[str], days: int = 30, cn: str = "minio") -> Issued:
    """A server certificate for `names` (DNS names or IP addresses) issued by `ca`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    alt: list[x509.GeneralName] = []
    for n in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1) + dt.timedelta(days=min(days, 0) * 2))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def write(path: Path, data: bytes, mode: int = 0o644) -> str:
    path.write_bytes(data)
    os.chmod(path, mode)
    return str(path)


def pki_files(tmp_path: Path, ca: Issued, server: Issued, stem: str) -> dict:
    """The CA and a server certificate with its key (0600) as files under tmp_path/pki: what
    the TLS key tests point cluster.yaml at."""
    d = tmp_path / "pki"
    d.mkdir()
    return {
        "ca": ca,
        "server": server,
        "ca_file": write(d / "ca.crt", ca.cert_pem),
        "cert_file": write(d / f"{stem}.crt", server.cert_pem),
        "key_file": write(d / f"{stem}.key", server.key_pem(), 0o600),
        "dir": d,
    }


def tls_keys(pki: dict, **changes) -> dict:
    """A `tls` section naming pki_files' files; a change to None leaves that key out."""
    keys = {
        "certificate": {"file": pki["cert_file"]},
        "private_key": {"file": pki["key_file"]},
        "ca_certificate": {"file": pki["ca_file"]},
    }
    keys.update(changes)
    return {k: v for k, v in keys.items() if v is not None}


def make_intermediate(ca: Issued, cn: str = "test storage intermediate CA") -> Issued:
    """A CA certificate issued by `ca` (not self-signed)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert, key)


# --- determined.tls files of the broken-file corpus (tests/unit/broken/master-tls-*.yaml) -----


def corpus_master_tls(directory: Path) -> None:
    """The corpus' master certificates and keys in `directory` (made when missing or within a
    week of expiring; under a lock: pytest-xdist workers run this at once). Names and the
    expired certificate's dates are fixed: the corpus states its messages word for word."""
    import fcntl

    directory.mkdir(mode=0o700, exist_ok=True)
    stamp = directory / "master-tls.done"
    with open(directory / "master-tls.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and float(stamp.read_text() or 0) > dt.datetime.now(dt.UTC).timestamp() + 7 * 86400:
            return
        ca = make_ca("corpus master CA")
        good = make_server(ca, ["m1"], cn="corpus master")
        other = make_server(ca, ["m1"], cn="corpus master other")
        elsewhere = make_server(ca, ["elsewhere.test"], cn="corpus elsewhere")
        key = ec.generate_private_key(ec.SECP256R1())
        expired = (
            x509.CertificateBuilder()
            .subject_name(_name("corpus old master"))
            .issuer_name(ca.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
            .not_valid_after(dt.datetime(2020, 1, 2, tzinfo=dt.UTC))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("m1")]), critical=False)
            .sign(ca.key, hashes.SHA256())
        )
        write(directory / "master-ca.crt", ca.cert_pem)
        write(directory / "master.crt", good.cert_pem)
        write(directory / "master.key", good.key_pem(), 0o600)
        write(directory / "master-other.key", other.key_pem(), 0o600)
        write(directory / "master-world-readable.key", good.key_pem(), 0o644)
        write(directory / "master-elsewhere.crt", elsewhere.cert_pem)
        write(directory / "master-elsewhere.key", elsewhere.key_pem(), 0o600)
        write(directory / "master-expired.crt", expired.public_bytes(serialization.Encoding.PEM))
        stamp.write_text(str(good.cert.not_valid_after_utc.timestamp()))


@functools.cache
def ca_pem() -> str:
    """One readable CA certificate (PEM) for tests that only need a file that is one, such as
    the lab's sources.registry_ca stand-in; made once per process."""
    return make_ca("test registry CA").cert_pem.decode()
