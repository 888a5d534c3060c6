"""Determined's bucket-only MinIO user on the lab (deploy/minio_iam.py, roles/minio_iam.py).

- the deploy made the user, its policy and the mapping (read back through the admin API);
- a second deploy changes nothing there;
- the keys trials get (master.yaml's checkpoint_storage) work in the bucket and are refused a
  bucket creation, another bucket and the admin API, even changing their own password;
- a policy widened and a secret changed on the server are repaired by the next deploy;
- the console answers on the node's 127.0.0.1 and not on its management address.
"""

from __future__ import annotations

import io
import json
import socket
import uuid

import pytest
import yaml
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin

from deploy import minio_iam, s3

pytestmark = pytest.mark.lab

# roles/minio.py's operation: "MinIO object storage | MinIO user <name>: ..." in pyinfra's results.
IAM_OPERATION = "| MinIO user "


def iam_changes(run) -> list[str]:
    return [op for op in run.changed_operations() if IAM_OPERATION in op]


def trial_keys(cluster, lab_ssh) -> tuple[str, str]:
    """The keys in the deployed master.yaml: what Determined hands to every trial."""
    text = lab_ssh(cluster.master_node.hostname, "cat /etc/determined/master.yaml").stdout
    storage = (yaml.safe_load(text) or {}).get("checkpoint_storage") or {}
    return storage.get("access_key", ""), storage.get("secret_key", "")


def test_deploy_made_user_policy_and_mapping(deployed, lab):
    assert minio_iam.read_state(lab).problems == []
    info = json.loads(minio_iam.admin_client(lab).user_info(lab.storage.determined_user))
    assert info["status"] == "enabled"
    assert info["policyName"] == minio_iam.policy_name(lab.storage)


def test_second_deploy_changes_nothing_for_minio(deployed, lab, deploy):
    run = deploy(limit=lab.storage_node.hostname)
    assert run.returncode == 0, run.stderr[-3000:]
    minio_changes = [op for op in run.changed_operations() if "MinIO" in op or "Bucket" in op]
    assert minio_changes == []


def test_trial_keys_work_in_the_bucket_only(deployed, lab, lab_ssh):
    key, secret = trial_keys(lab, lab_ssh)
    not_root = key != lab.storage.access_key.value and secret != lab.storage.secret_key.value
    assert not_root, "master.yaml holds MinIO's root keys"
    assert key == lab.storage.determined_user
    client = s3.client(lab, key, secret)
    bucket = lab.storage.bucket
    name = f"lab/iam-{uuid.uuid4().hex}"
    client.put_object(bucket, name, io.BytesIO(b"checkpoint"), 10)
    response = client.get_object(bucket, name)
    try:
        assert response.read() == b"checkpoint"
    finally:
        response.close()
        response.release_conn()
    client.remove_object(bucket, name)
    assert [b.name for b in client.list_buckets()] == [bucket]
    for refused in (
        lambda: client.make_bucket(f"lab-{uuid.uuid4().hex[:10]}", location=lab.storage.region),
        lambda: client.remove_bucket(bucket),
    ):
        with pytest.raises(S3Error) as e:
            refused()
        assert e.value.code == "AccessDenied"
    admin = MinioAdmin(
        endpoint=s3.endpoint(lab),
        credentials=StaticProvider(key, secret),
        region=lab.storage.region,
        secure=False,
    )
    for call in (
        lambda: admin.user_add("lab-intruder", "lab-intruder-secret"),
        lambda: admin.policy_set("readwrite", user=key),
        lambda: admin.user_add(key, "a-trial-changed-it"),  # denied by the policy's Deny
    ):
        with pytest.raises(MinioAdminException) as e:
            call()
        assert minio_iam.error_code(e.value) == "AccessDenied"


def test_changed_policy_and_secret_are_repaired(deployed, lab, deploy, lab_ssh):
    root = minio_iam.admin_client(lab)
    name, user = minio_iam.policy_name(lab.storage), lab.storage.determined_user
    root.policy_add(
        name,
        policy={
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]}],
        },
    )
    root.user_add(user, f"changed-{uuid.uuid4().hex}")
    problems = minio_iam.read_state(lab).problems
    assert len(problems) == 2, problems
    run = deploy(limit=lab.storage_node.hostname)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(iam_changes(run)) == 1, run.changed_operations()
    assert minio_iam.read_state(lab).problems == []
    key, secret = trial_keys(lab, lab_ssh)
    s3.bucket_location(s3.client(lab, key, secret), lab.storage.bucket, lab.storage.region)
    # Repaired means converged: the next deploy has nothing to do again.
    again = deploy(limit=lab.storage_node.hostname)
    assert again.returncode == 0 and iam_changes(again) == []


def test_console_on_localhost_only(deployed, lab, lab_ssh):
    assert lab.storage.console == "localhost"
    port = lab.storage.console_port
    node = lab.storage_node
    code = lab_ssh(node.hostname, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/").stdout
    assert code == "200"
    with pytest.raises(OSError):
        socket.create_connection((str(node.address), port), timeout=5).close()
