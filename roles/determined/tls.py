"""determined.tls on the nodes: the master's certificate and key, and the CA its clients trust.

Determined 0.38.0 reads master.yaml's security.tls.cert and .key once, at start
(master/internal/config/config.go ReadCertificate, from master/internal/core.go): a change of
either restarts the master (roles/determined/master.py). The agents read
security.tls.master_cert when they connect (agent/internal/agent.go tlsConfig); a new CA
restarts them with their agent.yaml (roles/determined/agent.py, roles/determined/domains.py).

/etc/determined/certs/ (0755 root), only with determined.tls:
  master node  master.crt (0644): the chain Determined serves and hands trials, re-encoded, ending
               at its root (deploy/cluster/master_tls.py served_chain); master.key (0600)
  every node   master-ca.crt (0644): ca_certificate, else the root of the master's chain. Agents
  with a role  name it in agent.yaml's security.tls.master_cert; on the master it is what the
               deploy's own checks there (the start-up wait, files/determined/master-users.py)
               trust.
Without determined.tls the directory is removed, keys and all: a stale private key has no
business on a node, and master.yaml / agent.yaml no longer name it.
"""

from __future__ import annotations

import io

from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from deploy.cluster import Cluster
from deploy.cluster.master_tls import agent_ca, served_chain
from deploy.determined_node import CERTS_DIR, MASTER_CA, MASTER_CRT, MASTER_KEY
from roles.shared.ops import SecretBytes, secret_file


def enabled(cluster: Cluster) -> bool:
    return cluster.determined.tls.enabled


def master_security(cluster: Cluster) -> dict[str, str] | None:
    """master.yaml's security.tls, or None."""
    return {"cert": MASTER_CRT, "key": MASTER_KEY} if enabled(cluster) else None


def agent_security(cluster: Cluster) -> dict[str, str] | None:
    """agent.yaml's security.tls (besides enabled: true), or None."""
    if not enabled(cluster):
        return None
    return {"master_cert": MASTER_CA, "master_cert_name": cluster.master_host}


def _certs_dir() -> None:
    files.directory(
        name=f"Determined TLS directory {CERTS_DIR}", path=CERTS_DIR, user="root", group="root", mode="755"
    )


def _removed() -> list[OperationMeta]:
    return [
        files.directory(
            name=f"No Determined certificates without determined.tls ({CERTS_DIR} removed)",
            path=CERTS_DIR,
            present=False,
        )
    ]


def _ca(cluster: Cluster) -> OperationMeta:
    return files.put(
        name=f"The master's CA {MASTER_CA}",
        src=io.StringIO(agent_ca(cluster.determined.tls, cluster.master_host)),
        dest=MASTER_CA,
        user="root",
        group="root",
        mode="644",
    )


def master_files(cluster: Cluster) -> list[OperationMeta]:
    """The master node's certificate, key and CA (or the directory gone): a change restarts
    the master."""
    tls = cluster.determined.tls
    if not tls.enabled:
        return _removed()
    assert tls.private_key is not None  # enabled: certificate and key were both given
    _certs_dir()
    crt = files.put(
        name=f"Master certificate {MASTER_CRT}",
        src=io.StringIO(served_chain(tls, cluster.master_host)),
        dest=MASTER_CRT,
        user="root",
        group="root",
        mode="644",
    )
    key = secret_file(
        name=f"Master private key {MASTER_KEY}",
        dest=MASTER_KEY,
        content=SecretBytes(tls.private_key.value),
    )
    return [crt, key, _ca(cluster)]


def agent_files(cluster: Cluster) -> list[OperationMeta]:
    """An agent node's master-ca.crt (or the directory gone): a change restarts its agents.
    On a node that is master and agent, the master's role has written the same file."""
    if not enabled(cluster):
        return _removed()
    _certs_dir()
    return [_ca(cluster)]
