"""storage.tls: optional TLS for MinIO's S3 API (a sub-section of storage_keys.Storage).

    storage:
      tls:
        certificate: {file: /etc/gpu-cluster/minio.crt}     # PEM: the server's, then intermediates
        private_key: {file: /etc/gpu-cluster/minio.key}     # PEM, unencrypted, chmod 600
        ca_certificate: {file: /etc/gpu-cluster/ca.crt}     # optional: a private root CA to trust

The files are read on the machine that runs pyinfra, named like secrets (`{file: PATH}`); only
the private key is one (0600, outside the repository, never shown). MinIO serves TLS when its
certs directory holds `public.crt` and `private.key` (minio/minio cmd/common-main.go
getTLSConfig, cmd/config-dir.go): the deploy writes them there (roles/minio/tls.py).

The certificate files are copied to every node, readable by all and mounted into trials: they
may hold only CERTIFICATE blocks (a private key pasted into one is refused), and what is copied
is the certificates re-encoded, never the file's own text. MinIO refuses any other block in
public.crt too (internal/config/certs.go ParsePublicCertFile: "Failed to parse ...").

What MinIO would refuse at start-up is refused here, before any host is touched
(minio/minio internal/config/certs.go LoadX509KeyPair at RELEASE.2025-04-22T22-12-26Z): a key
file Go's encoding/pem Decode leaves data after (pem_decode below), an encrypted key (it needs
MINIO_CERT_PASSWD), a key that is not the certificate's (Go's crypto/tls "private key does not
match public key"). And what clients would refuse: a certificate that does not name the
endpoint's host (or, for trial containers, the storage node's address), has expired, or does not
chain to a self-signed root in `ca_certificate` (OpenSSL: "unable to get issuer certificate").
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509 import verification

from deploy.cluster.checks import check
from deploy.cluster.keys import Key, Section
from deploy.cluster.reader import Map, Reader
from deploy.cluster.tls_pair import halves_given
from deploy.secrets import REPO_ROOT, FileProblem, Secret, SecretRef, describe, read_local_file

# A certificate chain is a few KiB; a bundle of every public CA is ~200 KiB.
PEM_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class PemFile:
    """Certificates read from the controller: the file's path and the certificates re-encoded
    as PEM ("" when the file is not read or not readable without the checks)."""

    path: str
    text: str

    def __repr__(self) -> str:
        return f"PemFile({self.path})"

    def __str__(self) -> str:
        return self.path


# --- Go's encoding/pem Decode (golang/go src/encoding/pem/pem.go), byte for byte ---------------


class PemBlock(NamedTuple):
    type: str
    headers: dict[str, str]
    body: bytes
    start: int  # where its BEGIN line starts in the data


_BEGIN, _END, _DASHES = b"-----BEGIN ", b"\n-----END ", b"-----"


def _get_line(data: bytes) -> tuple[bytes, bytes]:
    """pem.go getLine: the line without trailing spaces/tabs and its \\n or \\r\\n, the rest."""
    i = data.find(b"\n")
    if i < 0:
        i = j = len(data)
    else:
        j = i + 1
        if i > 0 and data[i - 1 : i] == b"\r":
            i -= 1
    return data[:i].rstrip(b" \t"), data[j:]


def pem_decode(data: bytes) -> tuple[PemBlock | None, bytes]:
    """pem.Decode: the first block and what follows it. Text before the BEGIN line (which must
    start the data or a line) is skipped; after the END line only that line's own newline is
    consumed, so a blank line after it is left over (MinIO: "The private key contains
    additional data"). A candidate that does not decode is skipped, like Go's `continue`."""
    rest = data
    while True:
        if rest.startswith(_BEGIN):
            rest = rest[len(_BEGIN) :]
        elif (at := rest.find(b"\n" + _BEGIN)) >= 0:
            rest = rest[at + 1 + len(_BEGIN) :]
        else:
            return None, data
        start = len(data) - len(rest) - len(_BEGIN)
        type_line, rest = _get_line(rest)
        if not type_line.endswith(_DASHES):
            continue
        type_line = type_line[: -len(_DASHES)]
        headers: dict[str, str] = {}
        while True:
            if not rest:
                return None, data
            line, following = _get_line(rest)
            key, colon, value = line.partition(b":")
            if not colon:
                break
            headers[key.strip().decode("latin-1")] = value.strip().decode("latin-1")
            rest = following
        if not headers and rest.startswith(_END[1:]):
            end_index, trailer_index = 0, len(_END) - 1
        else:
            end_index = rest.find(_END)
            trailer_index = end_index + len(_END)
        if end_index < 0:
            continue
        trailer = rest[trailer_index:]
        trailer_len = len(type_line) + len(_DASHES)
        if len(trailer) < trailer_len:
            continue
        rest_of_end_line, trailer = trailer[trailer_len:], trailer[:trailer_len]
        if not trailer.startswith(type_line) or not trailer.endswith(_DASHES):
            continue
        if _get_line(rest_of_end_line)[0]:
            continue
        try:  # base64.StdEncoding skips \r and \n; spaces and tabs were removed
            body = base64.b64decode(re.sub(rb"[ \t\r\n]", b"", rest[:end_index]), validate=True)
        except (binascii.Error, ValueError):
            continue
        _, rest = _get_line(rest[end_index + len(_END) - 1 :])
        return PemBlock(type_line.decode("latin-1"), headers, body, start), rest


def _reference(r: Reader, path: str, v: Any) -> str | None:
    """The PATH of `{file: PATH}`; None after reporting."""
    if isinstance(v, dict) and set(v) == {"file"} and isinstance(v["file"], str) and v["file"]:
        target = v["file"]
        if os.path.isabs(target):
            return target
        r.add(path, describe(v), "the file must be an absolute path")
        return None
    r.add(path, describe(v), "must be {file: PATH} (a PEM file on the machine that runs pyinfra)")
    return None


def _read(r: Reader, path: str, target: str, secret: bool) -> bytes | None:
    shown = str(SecretRef("file", target))
    try:
        data = read_local_file(
            Path(target),
            private=0o066 if secret else 0,
            max_bytes=PEM_MAX_BYTES,
            repo_root=REPO_ROOT if secret else None,
        )
    except FileProblem as e:
        r.add(path, shown, str(e))
        return None
    if len(data) > PEM_MAX_BYTES:
        r.add(path, shown, "larger than 1 MiB: not a PEM certificate or key")
        return None
    return data


# Any BEGIN line, also one whose block does not decode: its type is what the file holds.
_BEGIN_LINE = re.compile(rb"-----BEGIN ([^\r\n]*?)-----")


# Why a certificate file holds only certificates (the master's rules say their own).
MINIO_CERTIFICATES_ONLY = (
    "the file goes to every node, readable by all, and MinIO refuses anything else in public.crt"
)


def parse_certificates(
    data: bytes, what: str, only: str = MINIO_CERTIFICATES_ONLY
) -> list[x509.Certificate] | str:
    """The certificates of a PEM file, or what is wrong with it (one line); `only`: why only
    CERTIFICATE blocks belong there."""
    types = [m[1].decode("ascii", "replace") for m in _BEGIN_LINE.finditer(data)]
    others = sorted({t for t in types if t != "CERTIFICATE"})
    if others:
        return f"holds a {others[0]} block: only CERTIFICATE blocks belong here ({only})"
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        return f"not {what} in PEM (no readable '-----BEGIN CERTIFICATE-----' block)"
    if len(certs) != len(types):
        return f"{len(types) - len(certs)} of its CERTIFICATE blocks cannot be read"
    return certs


def _pem(certs: list[x509.Certificate]) -> str:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs).decode("ascii")


def _certificates(
    r: Reader, path: str, v: Any, what: str, only: str = MINIO_CERTIFICATES_ONLY
) -> PemFile | None:
    target = _reference(r, path, v)
    if target is None:
        return None
    if not r.resolve_secrets:
        # Not a secret: read when it can be (deploy/experiment needs the names it holds), never
        # a problem when not (that is for the loads that resolve secrets).
        try:
            with open(target, "rb") as f:
                parsed = parse_certificates(f.read(PEM_MAX_BYTES), what, only)
        except OSError:
            parsed = ""
        return PemFile(target, _pem(parsed) if isinstance(parsed, list) else "")
    data = _read(r, path, target, secret=False)
    if data is None:
        return None
    shown = str(SecretRef("file", target))
    certs = parse_certificates(data, what, only)
    if isinstance(certs, str):
        r.add(path, shown, certs)
        return None
    now = dt.datetime.now(dt.UTC)
    for cert in certs:
        if cert.not_valid_after_utc < now:
            r.add(
                path,
                shown,
                f"{_name(cert)} expired on {cert.not_valid_after_utc:%Y-%m-%d}: clients refuse it",
            )
            return None
        if cert.not_valid_before_utc > now:
            r.add(
                path,
                shown,
                f"{_name(cert)} is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC",
            )
            return None
    return PemFile(target, _pem(certs))


@check("`{file: PATH}`: PEM certificate, then its intermediates")
def certificate_file(r: Reader, path: str, v: Any) -> PemFile | None:
    return _certificates(r, path, v, "a certificate")


@check("`{file: PATH}`: PEM CA certificate(s)")
def ca_file(r: Reader, path: str, v: Any) -> PemFile | None:
    return _certificates(r, path, v, "a CA certificate")


def key_problem(data: bytes) -> str | None:
    """What MinIO's LoadX509KeyPair (internal/config/certs.go) and Go's tls.X509KeyPair would
    refuse in a private.key, or None."""
    block, rest = pem_decode(data)
    if block is None:
        return "not a PEM private key (no '-----BEGIN ... PRIVATE KEY-----' block Go can decode)"
    if rest:
        # pem.Decode consumes only the END line's own newline; MinIO refuses any rest.
        return (
            "has data after the key's END line (another block, text, or even a blank line): "
            "MinIO refuses it ('The private key contains additional data')"
        )
    encrypted = "DEK-Info" in block.headers or "ENCRYPTED" in block.headers.get("Proc-Type", "")
    if encrypted or block.type == "ENCRYPTED PRIVATE KEY":
        # RFC 1423 keys (x509.IsEncryptedPEMBlock: a DEK-Info header) need MINIO_CERT_PASSWD
        # ("Missing TLS password"); Go cannot read an encrypted PKCS#8 key at all ("tls: failed
        # to parse private key").
        return "is encrypted: give MinIO the key unencrypted (openssl pkey -in KEY -out NEW)"
    if block.type != "PRIVATE KEY" and not block.type.endswith(" PRIVATE KEY"):
        return f"holds a {block.type} block, not a private key"
    try:
        key = serialization.load_der_private_key(block.body, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return "not a PEM private key Go can read (RSA, ECDSA or Ed25519)"
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey)):
        return "not an RSA, ECDSA or Ed25519 key (what Go's crypto/tls serves)"
    try:
        data[block.start :].decode("ascii")
    except UnicodeDecodeError:
        return "the key block holds non-ASCII bytes"
    return None


@check("`{file: PATH}`: PEM private key, unencrypted, mode 0600")
def private_key_file(r: Reader, path: str, v: Any) -> Secret | None:
    target = _reference(r, path, v)
    if target is None:
        return None
    ref = SecretRef("file", target)
    if not r.resolve_secrets:
        return Secret(ref, None)
    data = _read(r, path, target, secret=True)
    if data is None:
        return None
    problem = key_problem(data)
    if problem is not None:
        r.add(path, str(ref), problem)
        return None
    block, _ = pem_decode(data)
    assert block is not None
    # The block as written, from its BEGIN line (text before it is no part of the key).
    return Secret(ref, data[block.start :].decode("ascii"))


@dataclass(frozen=True)
class StorageTls:
    certificate: Annotated[
        PemFile | None,
        Key(
            certificate_file,
            None,
            "MinIO's server certificate (public.crt in its certs directory), first in the file, "
            "then its intermediates; only CERTIFICATE blocks. With `private_key`, MinIO serves "
            "only https and `endpoint_url` is https. It must name `endpoint_url`'s host "
            "(subjectAltName; an IP address only as an IP entry) and, when that is the storage "
            "node's hostname, the node's address too (IP entry): trial containers reach MinIO by "
            "address",
        ),
    ]
    private_key: Annotated[
        Secret | None,
        Key(
            private_key_file,
            None,
            "the certificate's private key (private.key, 0600 minio-user); a secret. Nothing may "
            "follow its END line, not even a blank line (MinIO refuses it)",
        ),
    ]
    ca_certificate: Annotated[
        PemFile | None,
        Key(
            ca_file,
            None,
            "a private CA the clients trust for MinIO, ending at its self-signed root: the nodes' "
            "system store (the master, pg-backup, trial containers) and the deploy's own clients; "
            "unset: the certificate must chain to a public CA",
        ),
    ]

    @property
    def enabled(self) -> bool:
        return self.certificate is not None and self.private_key is not None


OFF = StorageTls(None, None, None)

SECTION = Section(holds_secrets=True, doc="MinIO's certificate and key; see TLS below")

# --- the rules across keys (deploy/cluster/rules.py calls them) -------------------------------


def default_scheme(tls: StorageTls | None) -> str:
    return "https" if tls is not None and tls.enabled else "http"


def trial_address(host: str | None, node: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The storage node's address trial containers use for endpoint_url's `host`, when `host`
    is one of the node's names (trial_endpoint below: Docker's bridge network does not see the
    node's /etc/hosts); None when `host` is used as written."""
    if node is None or host is None:
        return None
    names = {node.hostname.lower(): node.address}
    if node.ipoib_interface is not None:
        names[node.ipoib_name.lower()] = node.ipoib_address
    return names.get(host.rstrip(".").lower())


def trial_endpoint(storage: Any, node: Any) -> str:
    """storage.endpoint_url as trial containers can reach it: with the storage node's address
    where it names the node by hostname. The model's Cluster.trial_endpoint, computed once.

    Determined hands master.yaml's checkpoint_storage to every trial (it is the experiments'
    default) and its S3 config has no second, container-side endpoint. A single-agent trial
    runs on Docker's bridge network, which does not see the node's /etc/hosts (roles/node/hosts.py),
    so a node's hostname does not resolve there. With https the certificate names that address
    too: check_tls refuses one that does not. No trailing slash: Determined joins endpoint and
    key itself, and a slash gives "//key" requests.
    """
    url = storage.endpoint_url.rstrip("/")
    parts = urlsplit(url)
    address = trial_address(parts.hostname, node)
    if address is None:
        return url
    host = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))


def key_mismatch(certs: list[x509.Certificate], private_key: Secret) -> str | None:
    """None when the key is the first certificate's; "order" when it is a later one's (the
    file starts with an intermediate); "other" when it is none of theirs. The key is read as
    key_problem read it: by its DER, whatever the label says (Go tries each format)."""
    block, _ = pem_decode(private_key.value.encode())
    assert block is not None
    mine = _public(serialization.load_der_private_key(block.body, password=None).public_key())
    if mine == _public(certs[0].public_key()):
        return None
    return "order" if any(mine == _public(c.public_key()) for c in certs[1:]) else "other"


def check_tls(r: Reader, m: Map, storage: Any, nodes: Any) -> None:
    """The keys of storage.tls together, and with storage.endpoint_url and the storage node."""
    tls: StorageTls = storage.tls or OFF
    endpoint_url: str | None = storage.endpoint_url
    both = ": MinIO reads both"
    given = halves_given(r, m, "storage.tls", tls.ca_certificate, both, both)
    on = given["certificate"] and given["private_key"]
    written_url = endpoint_url if endpoint_url is not None and m.given("endpoint_url") else None
    scheme = urlsplit(written_url).scheme if written_url else None
    if on and scheme == "http":
        r.bad(
            "storage.endpoint_url",
            endpoint_url,
            "storage.tls is set, so MinIO serves only https: write https://",
        )
    if not on and scheme == "https":
        r.bad(
            "storage.endpoint_url",
            endpoint_url,
            "https needs storage.tls.certificate and private_key (MinIO serves http)",
        )
    if not r.resolve_secrets or not tls.enabled or not tls.certificate or not tls.certificate.text:
        return
    assert tls.private_key is not None
    node = next((n for n in nodes or () if n.hostname == storage.host), None)
    _check_pair(r, tls, urlsplit(endpoint_url or "").hostname, node)


def _check_pair(r: Reader, tls: StorageTls, host: str | None, node: Any) -> None:
    assert tls.certificate is not None and tls.private_key is not None
    certs = x509.load_pem_x509_certificates(tls.certificate.text.encode())
    leaf = certs[0]
    shown = str(SecretRef("file", tls.certificate.path))
    mismatch = key_mismatch(certs, tls.private_key)
    if mismatch is not None:
        if mismatch == "order":
            r.add(
                "storage.tls.certificate",
                shown,
                "the first certificate must be the server's (the one of storage.tls.private_key), "
                "then its intermediates",
            )
        else:
            r.add(
                "storage.tls.private_key",
                str(tls.private_key.reference),
                "is not the key of storage.tls.certificate",
            )
        return
    if host is None:
        return
    names = ", ".join(san_names(leaf)) or "none"
    if not names_host(leaf, host):
        r.add(
            "storage.tls.certificate", shown, f"does not name {host}, endpoint_url's host (it names: {names})"
        )
        return
    address = trial_address(host, node)
    if address is not None and not names_host(leaf, str(address)):
        r.add(
            "storage.tls.certificate",
            shown,
            f"does not name {address}, {host}'s address (it names: {names}): trial containers "
            f"reach MinIO by address, Docker's bridge network cannot resolve {host}; add IP:{address}",
        )
        return
    if tls.ca_certificate is not None and tls.ca_certificate.text:
        roots = x509.load_pem_x509_certificates(tls.ca_certificate.text.encode())
        problem = chain_problem(certs, roots, host)
        if problem is not None:
            r.add("storage.tls.certificate", shown, problem)


def chain_problem(
    certs: list[x509.Certificate],
    roots: list[x509.Certificate],
    host: str,
    ca_key: str = "storage.tls.ca_certificate",
) -> str | None:
    """Whether a client trusting only `roots` accepts `certs` for `host` (cryptography's
    RFC 5280 path building, x509.verification), ending at a self-signed root: OpenSSL (urllib3,
    boto3, pg-backup) does not stop at an intermediate in its store ("unable to get issuer
    certificate"). Extensions are not held to the CA/Browser Forum's profile (private CAs)."""
    chain = verified_chain(certs, roots, host, ca_key)
    return chain if isinstance(chain, str) else None


def verified_chain(
    certs: list[x509.Certificate],
    roots: list[x509.Certificate],
    host: str,
    ca_key: str = "storage.tls.ca_certificate",
) -> list[x509.Certificate] | str:
    """The path chain_problem builds, leaf first, ending at a self-signed root of `roots`; or
    what is wrong (one line; `ca_key` names where the roots come from)."""
    ee = verification.ExtensionPolicy.permit_all().require_present(
        x509.SubjectAlternativeName, verification.Criticality.AGNOSTIC, None
    )
    ca = verification.ExtensionPolicy.permit_all().require_present(
        x509.BasicConstraints, verification.Criticality.AGNOSTIC, None
    )
    builder = (
        verification.PolicyBuilder()
        .store(verification.Store(roots))
        .time(dt.datetime.now(dt.UTC))
        .extension_policies(ca_policy=ca, ee_policy=ee)
    )
    try:
        subject: verification.Subject = verification.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        subject = verification.DNSName(host)
    try:
        chain = builder.build_server_verifier(subject).verify(certs[0], certs[1:])
    except (verification.VerificationError, ValueError):
        return (
            f"is not issued by {ca_key} (its issuer: "
            f"{certs[0].issuer.rfc4514_string()}; put its intermediates after it in this file)"
        )
    top = chain[-1]
    if top.subject != top.issuer or not _issued(top, top):
        return (
            f"chains to {top.subject.rfc4514_string()} in {ca_key}, which is not "
            "a self-signed root: OpenSSL clients refuse that ('unable to get issuer "
            "certificate'): give the root CA there"
        )
    return list(chain)


def _public(key: Any) -> bytes:
    return bytes(
        key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _name(cert: x509.Certificate) -> str:
    return f"the certificate {cert.subject.rfc4514_string() or '(no subject)'}"


def _sans(cert: x509.Certificate) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    ips = san.get_values_for_type(x509.IPAddress)
    return san.get_values_for_type(x509.DNSName), [
        a for a in ips if isinstance(a, (ipaddress.IPv4Address, ipaddress.IPv6Address))
    ]


def san_names(cert: x509.Certificate) -> list[str]:
    """The subjectAltName entries, typed as openssl shows them (clients ignore the subject's CN)."""
    dns, ips = _sans(cert)
    return [*(f"DNS:{d}" for d in dns), *(f"IP:{a}" for a in ips)]


def names_host(cert: x509.Certificate, host: str) -> bool:
    """RFC 6125 matching as Go's crypto/x509 VerifyHostname and OpenSSL do it: an IP address
    only against IP entries (a DNS entry spelling that address does not name it), a name only
    against DNS entries, a wildcard only as the whole left-most label."""
    dns, ips = _sans(cert)
    host = host.strip("[]").rstrip(".").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        return address in ips
    for name in (d.rstrip(".").lower() for d in dns):
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


def _issued(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
