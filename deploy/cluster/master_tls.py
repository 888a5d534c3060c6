"""determined.tls: optional TLS for the Determined master (a sub-section of determined.Determined).

    determined:
      tls:
        certificate: {file: /etc/gpu-cluster/master.crt}   # PEM: the master's, then intermediates
        private_key: {file: /etc/gpu-cluster/master.key}   # PEM, unencrypted, chmod 600
        ca_certificate: {file: /etc/gpu-cluster/ca.crt}    # optional: the root that signed it

The files are read on the machine that runs pyinfra, named like secrets (`{file: PATH}`), with
the file rules of storage.tls (deploy/cluster/storage_tls.py: only CERTIFICATE blocks, re-encoded;
the key 0600, outside the repository, never shown). The roles write them to the master
(/etc/determined/certs/master.crt and master.key, master.yaml's security.tls) and the CA to
every agent (master-ca.crt, agent.yaml's security.tls): roles/determined/tls.py.

What Determined 0.38.0 refuses at start-up is refused here, before any host is touched:
- master/internal/config/config.go TLSConfig.Validate: "TLS cert file provided without a key
  file" and the reverse;
- TLSConfig.ReadCertificate is Go's tls.LoadX509KeyPair (golang/go src/crypto/tls/tls.go
  X509KeyPair): the first block whose type ends in "PRIVATE KEY" (other blocks skipped, data
  after it ignored, unlike MinIO), parsed as PKCS#1, PKCS#8 or SEC 1 ("tls: failed to parse
  private key": an encrypted key is one it cannot read), and "tls: private key does not match
  public key" against the file's first certificate.
And what its clients refuse: the agents (agent/internal/agent.go tlsConfig: RootCAs from
security.tls.master_cert, ServerName master_cert_name), trial containers (the master hands them
its certificate file as the only extra CA, master/internal/core.go GetCertPEM and
master/pkg/tasks/task.go DET_MASTER_CERT_FILE; harness/determined/common/api/certs.py adds it to
certifi's bundle and checks DET_MASTER_CERT_NAME) and the `det` CLI verify the name
cluster.master_host, an expired certificate, and a chain that does not end at a root: Determined's
docs (docs/manage/security/tls.rst) "If the master's certificate is not signed by a well-known CA,
then the configured certificate file must contain a full certificate chain that goes all the way
to a root certificate". So without ca_certificate the file must end at a self-signed root (a
self-signed certificate is its own); with it, it must chain to it, and the master's copy gets the
root appended when the file stops below it (served_chain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from deploy.cluster.checks import check
from deploy.cluster.keys import Key, Section
from deploy.cluster.reader import Map, Reader
from deploy.cluster.storage_tls import (
    PemFile,
    _certificates,
    _issued,
    _pem,
    _read,
    _reference,
    key_mismatch,
    names_host,
    pem_decode,
    san_names,
    verified_chain,
)
from deploy.cluster.tls_pair import halves_given
from deploy.secrets import Secret, SecretRef

CERTIFICATES_ONLY = (
    "the chain goes to every agent and into every trial container, readable by all; "
    "Determined's master reads only its CERTIFICATE blocks"
)


@check("`{file: PATH}`: PEM certificate, then its intermediates")
def certificate_file(r: Reader, path: str, v: Any) -> PemFile | None:
    return _certificates(r, path, v, "a certificate", CERTIFICATES_ONLY)


@check("`{file: PATH}`: PEM CA certificate(s)")
def ca_file(r: Reader, path: str, v: Any) -> PemFile | None:
    return _certificates(r, path, v, "a CA certificate", CERTIFICATES_ONLY)


def key_block(data: bytes) -> tuple[int, int] | str:
    """(start, end) of the key block Go's tls.X509KeyPair takes from `data` (the first whose
    type ends in "PRIVATE KEY"), or what it would refuse (one line)."""
    rest, skipped = data, list[str]()
    while True:
        block, after = pem_decode(rest)
        if block is None:
            if not skipped:
                return "not a PEM private key (Go: 'tls: failed to find any PEM data in key input')"
            return f"holds no private key, only {', '.join(skipped)} block(s)"
        if block.type == "PRIVATE KEY" or block.type.endswith(" PRIVATE KEY"):
            offset = len(data) - len(rest)
            start, end = offset + block.start, len(data) - len(after)
            break
        skipped.append(block.type)
        rest = after
    encrypted = "DEK-Info" in block.headers or "ENCRYPTED" in block.headers.get("Proc-Type", "")
    if encrypted or block.type == "ENCRYPTED PRIVATE KEY":
        return (
            "is encrypted: Determined's master cannot read it (Go: 'tls: failed to parse private "
            "key'); give it unencrypted (openssl pkey -in KEY -out NEW)"
        )
    try:
        key = serialization.load_der_private_key(block.body, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return "not a private key Go can read (Go: 'tls: failed to parse private key')"
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey)):
        return "not an RSA, ECDSA or Ed25519 key (what Go's crypto/tls serves)"
    try:
        data[start:end].decode("ascii")
    except UnicodeDecodeError:
        return "the key block holds non-ASCII bytes"
    return start, end


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
    found = key_block(data)
    if isinstance(found, str):
        r.add(path, str(ref), found)
        return None
    # Only the key block goes to the master (what Go reads of the file), with a line end.
    return Secret(ref, data[found[0] : found[1]].decode("ascii").rstrip("\r\n") + "\n")


@dataclass(frozen=True)
class DeterminedTls:
    certificate: Annotated[
        PemFile | None,
        Key(
            certificate_file,
            None,
            "the master's certificate (/etc/determined/certs/master.crt, master.yaml "
            "security.tls.cert), first in the file, then its intermediates; only CERTIFICATE "
            "blocks. With `private_key` the master serves only https on `master_port`. It must "
            "name `master_host` (a DNS subjectAltName entry): agents, trial containers and the "
            "deploy check that name. Without `ca_certificate` the file ends at a self-signed root",
        ),
    ]
    private_key: Annotated[
        Secret | None,
        Key(
            private_key_file,
            None,
            "the certificate's private key (/etc/determined/certs/master.key, 0600 root); a "
            "secret, unencrypted",
        ),
    ]
    ca_certificate: Annotated[
        PemFile | None,
        Key(
            ca_file,
            None,
            "the CA that issued the certificate, ending at its self-signed root: the agents' "
            "security.tls.master_cert and the deploy's own clients trust it; the master's copy "
            "of the certificate gets the root appended (Determined hands trials that file as "
            "their only master CA); unset: the certificate file's own root",
        ),
    ]

    @property
    def enabled(self) -> bool:
        return self.certificate is not None and self.private_key is not None


OFF = DeterminedTls(None, None, None)

SECTION = Section(holds_secrets=True, doc="the master's certificate and key; see TLS below")


# --- the rules across keys (deploy/cluster/rules.py calls check_tls) --------------------------


def check_tls(r: Reader, m: Map, tls: DeterminedTls | None, master_host: str | None) -> None:
    """The keys of determined.tls together, and with master_host."""
    tls = tls or OFF
    halves_given(
        r,
        m,
        "determined.tls",
        tls.ca_certificate,
        " (Determined: 'TLS cert file provided without a key file')",
        " (Determined: 'TLS key file provided without a cert file')",
    )
    if not r.resolve_secrets or not tls.enabled or not tls.certificate or not tls.certificate.text:
        return
    if tls.ca_certificate is not None and not tls.ca_certificate.text:
        return  # reported by its own check
    problem = pair_problem(tls, master_host)
    if problem is not None:
        r.add(*problem)


def pair_problem(tls: DeterminedTls, host: str | None) -> tuple[str, str, str] | None:
    """(key, shown value, what) of the first problem of the certificate with its key, the
    name and the root; None when the master and its clients accept them."""
    assert tls.certificate is not None and tls.private_key is not None
    certs = x509.load_pem_x509_certificates(tls.certificate.text.encode())
    leaf = certs[0]
    shown = str(SecretRef("file", tls.certificate.path))
    mismatch = key_mismatch(certs, tls.private_key)
    if mismatch is not None:
        if mismatch == "order":
            return (
                "determined.tls.certificate",
                shown,
                "the first certificate must be the master's (the one of determined.tls.private_key), "
                "then its intermediates",
            )
        return (
            "determined.tls.private_key",
            str(tls.private_key.reference),
            "is not the key of determined.tls.certificate (Go: 'tls: private key does not match public key')",
        )
    if host is None:
        return None
    if not names_host(leaf, host):
        names = ", ".join(san_names(leaf)) or "none"
        return (
            "determined.tls.certificate",
            shown,
            f"does not name {host}, master_host (it names: {names}): agents, trials and the "
            f"deploy check that name; add DNS:{host}",
        )
    chain = served_certificates(tls, host)
    if isinstance(chain, str):
        return ("determined.tls.certificate", shown, chain)
    return None


def _self_signed(cert: x509.Certificate) -> bool:
    return cert.subject == cert.issuer and _issued(cert, cert)


def served_certificates(tls: DeterminedTls, host: str) -> list[x509.Certificate] | str:
    """The master's certificate file as the master gets it: the configured chain, then what
    ca_certificate adds up to its root (Determined wants the full chain, see the module
    docstring); or why no client would accept it (one line)."""
    assert tls.certificate is not None
    certs = x509.load_pem_x509_certificates(tls.certificate.text.encode())
    if tls.ca_certificate is not None:
        roots = x509.load_pem_x509_certificates(tls.ca_certificate.text.encode())
        ca_key = "determined.tls.ca_certificate"
    elif _self_signed(certs[-1]):
        roots, ca_key = [certs[-1]], "determined.tls.certificate"
    else:
        return (
            "does not end at a self-signed root and determined.tls.ca_certificate is not set: "
            "Determined hands trials this file as their only master CA ('must contain a full "
            "certificate chain that goes all the way to a root certificate'): append the root "
            "or name it in ca_certificate"
        )
    if len(certs) == 1 and _self_signed(certs[0]) and certs[0] in roots:
        return certs  # its own root (not a CA's end-entity: no path to build)
    chain = verified_chain(certs, roots, host, ca_key)
    if isinstance(chain, str):
        return chain
    return certs + [c for c in chain if c not in certs]


def served_chain(tls: DeterminedTls, host: str) -> str:
    """master.crt's text (re-encoded PEM); checked when the file was loaded."""
    chain = served_certificates(tls, host)
    assert not isinstance(chain, str), chain
    return _pem(chain)


def agent_ca(tls: DeterminedTls, host: str) -> str:
    """master-ca.crt's text: ca_certificate, else the root the master's chain ends at (only
    the root: a renewed certificate under the same root leaves the file, and so the agents,
    alone)."""
    if tls.ca_certificate is not None:
        return tls.ca_certificate.text
    chain = served_certificates(tls, host)
    assert not isinstance(chain, str), chain
    return _pem(chain[-1:])
