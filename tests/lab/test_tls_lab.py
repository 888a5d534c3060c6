"""storage.tls on the lab: the lab's cluster.yaml plus a certificate for the storage node from a
throwaway CA, deployed, verified, deployed again, and switched back to plain http.

- MinIO answers only TLS: the deploy's own client (the CA from cluster.yaml, the name
  endpoint_url's host) gets 200, plain http gets Go's "Client sent an HTTP request to an HTTPS
  server." and no S3;
- verify is green with TLS on, its smoke experiment included (a trial container saves and
  restores a checkpoint through boto3 with AWS_CA_BUNDLE from master.yaml's
  task_container_defaults), and pg-backup takes a backup over https (the master's system store);
- a second deploy changes nothing;
- the plain lab deploy switches it off again (certs directory and CA gone, http back) and a
  deploy after that changes nothing either: the lab is left as it was found.
"""

from __future__ import annotations

import http.client
import xml.etree.ElementTree as ET

import pytest
import yaml

from deploy import s3
from deploy.cluster import load_cluster
from roles.minio import tls as minio_tls
from tests.unit.tls_material import make_ca, make_server, write

from .conftest import run_verify
from .test_smoke_lab import RESTORE, SAVE

pytestmark = pytest.mark.lab

PLAIN_HTTP_ANSWER = "Client sent an HTTP request to an HTTPS server."


def _tls_copy(lab, tmp_path):
    """cluster.yaml with storage.tls, its inventory, and the loaded cluster."""
    node = lab.storage_node
    ca = make_ca("dtlab storage test CA")
    server = make_server(ca, [node.hostname, str(node.address)])
    pki = tmp_path / "pki"
    pki.mkdir()
    raw = yaml.safe_load(lab.path.read_text())
    raw["storage"]["tls"] = {
        "certificate": {"file": write(pki / "minio.crt", server.cert_pem)},
        "private_key": {"file": write(pki / "minio.key", server.key_pem(), 0o600)},
        "ca_certificate": {"file": write(pki / "ca.crt", ca.cert_pem)},
    }
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(raw, sort_keys=False))
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(cluster)!r}))\n")
    return cluster, inventory, load_cluster(cluster)


def _plain_http(cluster) -> tuple[int | None, str]:
    conn = http.client.HTTPConnection(str(cluster.storage_node.address), cluster.storage.port, timeout=10)
    try:
        conn.request("GET", "/minio/health/ready")
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return None, repr(e)
    finally:
        conn.close()


def _ready(cluster, scheme: str) -> int:
    url = f"{scheme}://{cluster.storage_node.address}:{cluster.storage.port}/minio/health/ready"
    return s3.pool(cluster, retries=0).request("GET", url).status


def test_tls_on_verified_idempotent_and_off_again(deployed, deploy, lab, lab_ssh, tmp_path):
    cluster, inventory, tls = _tls_copy(lab, tmp_path)
    assert tls.storage.endpoint_url == f"https://{lab.storage_node.hostname}:{lab.storage.port}"
    storage, master = lab.storage_node.hostname, lab.master_node.hostname
    try:
        run = deploy(inventory=inventory)
        assert run.returncode == 0, run.stderr[-4000:]
        assert tls.storage.tls.private_key.value not in run.stdout + run.stderr

        # MinIO answers only TLS.
        assert _ready(tls, "https") == 200
        status, body = _plain_http(tls)
        assert status != 200 and (status is None or PLAIN_HTTP_ANSWER in body), (status, body)
        mode = lab_ssh(storage, f"stat -c '%U %a' {minio_tls.CERTS_DIR}/private.key").stdout.split()
        assert mode == [minio_tls.USER, "600"]

        # Trials get the agents' whole bundle (public CAs too), not the private CA alone.
        defaults = yaml.safe_load(lab_ssh(master, "cat /etc/determined/master.yaml").stdout)[
            "task_container_defaults"
        ]
        assert f"AWS_CA_BUNDLE={minio_tls.CONTAINER_BUNDLE}" in defaults["environment_variables"]
        assert minio_tls.SYSTEM_BUNDLE in [m["host_path"] for m in defaults["bind_mounts"]]

        # pg-backup over https, trusting the CA through the master's system store.
        lab_ssh(master, "systemctl start pg-backup.service")
        assert (
            lab_ssh(master, "systemctl show -p Result --value pg-backup.service").stdout.strip() == "success"
        )

        verify = run_verify("-n", "4", cluster=cluster)
        assert verify.returncode == 0, verify.stdout[-6000:]
        junit = tmp_path / "smoke.xml"
        smoke = run_verify("-k", "test_smoke", f"--junitxml={junit}", cluster=cluster, smoke=True)
        assert smoke.returncode == 0, smoke.stdout[-6000:]
        passed = {
            case.get("name", "").split("@")[0]
            for case in ET.parse(junit).getroot().iter("testcase")
            if not any(e.tag in ("failure", "error", "skipped") for e in case)
        }
        assert {SAVE, RESTORE} <= passed, smoke.stdout[-6000:]

        again = deploy(inventory=inventory)
        assert again.returncode == 0, again.stderr[-4000:]
        assert again.changed_operations() == []
    finally:
        restored = deploy()
    assert restored.returncode == 0, restored.stderr[-4000:]
    assert _ready(lab, "http") == 200
    assert lab_ssh(storage, f"test -e {minio_tls.CERTS_DIR}", check=False).returncode == 1
    for node in lab.nodes:
        assert lab_ssh(node.hostname, f"test -e {minio_tls.SYSTEM_CA}", check=False).returncode == 1
    verify = run_verify("-n", "4", "-k", "test_storage or test_trial_container")
    assert verify.returncode == 0, verify.stdout[-6000:]
    second = deploy()
    assert second.returncode == 0, second.stderr[-4000:]
    assert second.changed_operations() == []
