"""Determined's TLS files on the nodes and the master's health check on its own node: named
once here for the roles that write them and wait (roles/determined/tls.py,
roles/determined/master.py) and for tests/verify, which checks them. No role module: verify
imports none (tests/unit/test_shape.py).

/etc/determined/certs/ (0755 root), only with determined.tls: master.crt and master.key on the
master node (master.yaml's security.tls.cert and .key), master-ca.crt on every node with a role
(agent.yaml's security.tls.master_cert; on the master what the deploy's own checks trust).
"""

from __future__ import annotations

from deploy.cluster import Cluster

# Under roles/determined/common.py's CONFIG_DIR, /etc/determined.
CERTS_DIR = "/etc/determined/certs"
MASTER_CRT = f"{CERTS_DIR}/master.crt"
MASTER_KEY = f"{CERTS_DIR}/master.key"
MASTER_CA = f"{CERTS_DIR}/master-ca.crt"


def health_check(cluster: Cluster) -> tuple[str, str | None, dict[str, str]]:
    """(url, curl --resolve entry, environment) for GET /health on the master's own node: by
    master_host pinned to 127.0.0.1 and checked against master-ca.crt (curl reads
    CURL_CA_BUNDLE) with TLS; plain http to 127.0.0.1 without."""
    port = cluster.master_port
    if not cluster.determined.tls.enabled:
        return f"http://127.0.0.1:{port}/health", None, {}
    name = cluster.master_host
    return f"https://{name}:{port}/health", f"{name}:{port}:127.0.0.1", {"CURL_CA_BUNDLE": MASTER_CA}
