"""storage.tls: MinIO's certificate and key, and the CA every node trusts for it.

MinIO serves https exactly when its certs directory holds `public.crt` and `private.key`
(minio/minio cmd/common-main.go getTLSConfig and cmd/config-dir.go at
RELEASE.2025-04-22T22-12-26Z); the directory is `--certs-dir`, default ${HOME}/.minio/certs
(cmd/config-dir.go getDefaultCertsDir). minio-user has no home, so the deploy names
/etc/minio/certs, and only with storage.tls: without the option MinIO never reads that
directory. Without storage.tls the deploy still removes /etc/minio/certs (what it made there):
a stale copy of the private key has no business on the node. /etc/minio itself stays.

certs (storage node, from roles/minio/server.py): public.crt 0644 (the certificates re-encoded, never
the file's own text: deploy/cluster/storage_tls.py) and private.key 0600, both owned by
minio-user (the unit runs MinIO as that user); a change restarts MinIO.
apply (every node, its own role in deploy/site.py, before any Determined role): with
storage.tls.ca_certificate, the CA in /usr/local/share/ca-certificates/ and
update-ca-certificates, which rebuilds /etc/ssl/certs/ca-certificates.crt: the system store Go's
crypto/x509 reads on Linux (the master's AWS SDK), Python's default context on Debian/Ubuntu
(pg-backup), and the bundle trial containers get read-only (AWS_CA_BUNDLE and
REQUESTS_CA_BUNDLE in master.yaml's task_container_defaults): the public CAs plus this one, so
pip, Hugging Face or a public S3 keep working in trials.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
from typing import NamedTuple
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FindInFile
from pyinfra.operations import files, server

from deploy.cluster import Cluster, Node
from deploy.minio_node import CERTS_DIR, CONFIG_DIR, CONTAINER_BUNDLE, SYSTEM_BUNDLE, SYSTEM_CA, USER
from roles.shared.ops import SecretBytes, packages, secret_file


def server_options(cluster: Cluster) -> str:
    """MINIO_OPTS' part for TLS: the certs directory, only when there are certificates."""
    return f" --certs-dir {CERTS_DIR}" if cluster.storage.tls.enabled else ""


class TrialBundle(NamedTuple):
    """The bundle trials trust, as master.yaml's task_container_defaults names it."""

    host_path: str  # the node's whole system bundle, which holds storage.tls.ca_certificate
    container_path: str  # where the trial container sees it, read-only
    ca_sha256: str  # of the CA: a new CA changes master.yaml, so the master restarts


def trial_bundle(cluster: Cluster) -> TrialBundle | None:
    """The bundle trials trust with storage.tls.ca_certificate, for master.yaml; None without."""
    ca = cluster.storage.tls.ca_certificate
    if ca is None:
        return None
    return TrialBundle(SYSTEM_BUNDLE, CONTAINER_BUNDLE, hashlib.sha256(ca.text.encode()).hexdigest())


def certs(cluster: Cluster) -> list:
    """The certificate and key in MinIO's certs directory (or the directory gone): operations
    whose change needs a restart."""
    tls = cluster.storage.tls
    if not tls.enabled or tls.certificate is None or tls.private_key is None:
        return [
            files.directory(
                name=f"No MinIO certificates without storage.tls ({CERTS_DIR} removed)",
                path=CERTS_DIR,
                present=False,
            )
        ]
    files.directory(
        name=f"MinIO TLS directory {CONFIG_DIR}", path=CONFIG_DIR, user="root", group="root", mode="755"
    )
    files.directory(
        name=f"MinIO certs directory {CERTS_DIR}", path=CERTS_DIR, user=USER, group=USER, mode="700"
    )
    public = files.put(
        name=f"MinIO certificate {CERTS_DIR}/public.crt",
        src=io.StringIO(tls.certificate.text),
        dest=f"{CERTS_DIR}/public.crt",
        user=USER,
        group=USER,
        mode="644",
    )
    private = secret_file(
        name=f"MinIO private key {CERTS_DIR}/private.key",
        dest=f"{CERTS_DIR}/private.key",
        content=SecretBytes(tls.private_key.value),
        user=USER,
        group=USER,
        mode="600",
    )
    return [public, private]


def ready_check(cluster: Cluster) -> tuple[str, str | None]:
    """(url, curl --resolve entry) for MinIO's readiness on its own node. With TLS by
    endpoint_url's host, the name the certificate holds, pinned to 127.0.0.1 (an address is
    used as it is), checked against the system store (apply() put the CA there first); plain
    http to 127.0.0.1 without TLS."""
    storage = cluster.storage
    if not storage.tls.enabled:
        return f"http://127.0.0.1:{storage.port}/minio/health/ready", None
    host = urlsplit(storage.endpoint_url).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        shown = f"[{address}]" if address.version == 6 else str(address)
        return f"https://{shown}:{storage.port}/minio/health/ready", None
    return f"https://{host}:{storage.port}/minio/health/ready", f"{host}:{storage.port}:127.0.0.1"


@deploy("Storage CA in the system trust store")
def apply(cluster: Cluster, node: Node) -> None:
    ca = cluster.storage.tls.ca_certificate
    if ca is None:
        removed = files.file(
            name=f"No storage CA without storage.tls.ca_certificate ({SYSTEM_CA})",
            path=SYSTEM_CA,
            present=False,
        )
        server.shell(
            name="Rebuild the system trust store without the storage CA",
            commands=["update-ca-certificates"],
            _if=removed.did_change,
        )
        return
    packages(["ca-certificates"], "the system trust store")
    put = files.put(
        name=f"Storage CA {SYSTEM_CA}",
        src=io.StringIO(ca.text),
        dest=SYSTEM_CA,
        user="root",
        group="root",
        mode="644",
    )
    # Also when the bundle lacks it (a run that stopped between the two): trials mount the
    # bundle, so it must hold the CA before any Determined role runs (deploy/site.py order).
    first_line = ca.text.splitlines()[1]  # base64 only: a literal grep pattern
    bundled = host.get_fact(FindInFile, path=SYSTEM_BUNDLE, pattern=first_line)
    server.shell(
        name=f"Add the storage CA to the system trust store ({SYSTEM_BUNDLE})",
        commands=["update-ca-certificates"],
        _if=lambda: put.did_change() or not bundled,
    )
