"""The deploy's MinIO users on the lab (deploy/minio_admin.py, roles/minio/iam.py): Determined's
bucket-only user and pg-backup's backups-only user.

- the deploy made both users, their policies and the mappings (read back through the admin
  API);
- a second deploy changes nothing, on any host;
- the keys trials get (master.yaml's checkpoint_storage) work in the bucket and are refused a
  bucket creation, another bucket and the admin API, even changing their own password, and
  reading, listing, overwriting and deleting the database backups (backups/postgresql/);
- pg-backup signs with its own keys from its own root-only file and still takes a backup;
- a policy widened and a secret changed on the server are repaired by the next deploy;
- the console answers on the node's 127.0.0.1 and not on its management address.
"""

from __future__ import annotations

import io
import json
import shlex
import socket
import uuid

import pytest
import yaml
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin

from deploy import minio_admin, s3
from roles.postgresql import backup as pg_backup

pytestmark = pytest.mark.lab

# roles/minio/server.py's operation: "MinIO object storage | MinIO user <name>: ..." in pyinfra's results.
IAM_OPERATION = "| MinIO user "


def iam_changes(run) -> list[str]:
    return [op for op in run.changed_operations() if IAM_OPERATION in op]


def trial_keys(cluster, lab_ssh) -> tuple[str, str]:
    """The keys in the deployed master.yaml: what Determined hands to every trial."""
    text = lab_ssh(cluster.master_node.hostname, "cat /etc/determined/master.yaml").stdout
    storage = (yaml.safe_load(text) or {}).get("checkpoint_storage") or {}
    return storage.get("access_key", ""), storage.get("secret_key", "")


def test_deploy_made_users_policies_and_mappings(deployed, lab):
    for user in minio_admin.users(lab.storage):
        assert minio_admin.read_state(lab, user).problems == []
        info = json.loads(minio_admin.admin_client(lab).user_info(user.name))
        assert info["status"] == "enabled"
        assert info["policyName"] == user.policy


def test_second_deploy_changes_nothing(deployed, lab, deploy):
    run = deploy()
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.changed_operations() == []


def _code(call) -> str:
    try:
        call()
    except S3Error as e:
        return e.code
    return "allowed"


def test_pg_backup_signs_with_its_own_keys(deployed, lab, lab_ssh):
    master = lab.master_node.hostname
    assert lab_ssh(master, f"stat -c '%U %G %a' {pg_backup.S3_ENV}").stdout.split() == ["root", "root", "600"]
    assert lab_ssh(master, f"sed -n 's/^AWS_ACCESS_KEY_ID=//p' {pg_backup.S3_ENV}").stdout.strip() == (
        f'"{lab.storage.backup_user}"'
    )
    lab_ssh(master, "systemctl start pg-backup.service")  # oneshot: returns when done
    journal = lab_ssh(master, "journalctl -u pg-backup --no-pager -n 20").stdout
    assert "backed up determined" in journal, journal
    listed = lab_ssh(master, "pg-backup list").stdout.split()
    assert listed and all(k.startswith(pg_backup.PREFIX) for k in listed), listed


def test_trial_keys_are_denied_the_backups(deployed, lab, lab_ssh):
    """With the keys every trial gets: a backup can be neither read, listed, overwritten nor
    deleted; checkpoints still work (test_trial_keys_work_in_the_bucket_only)."""
    master, bucket = lab.master_node.hostname, lab.storage.bucket
    listed = lab_ssh(master, "pg-backup list").stdout.split()
    if not listed:
        lab_ssh(master, "systemctl start pg-backup.service")
        listed = lab_ssh(master, "pg-backup list").stdout.split()
    newest = listed[-1]
    root = s3.client(lab)
    before = root.stat_object(bucket, newest)
    key, secret = trial_keys(lab, lab_ssh)
    trial = s3.client(lab, key, secret)
    refused = {
        "read": _code(lambda: trial.get_object(bucket, newest).read()),
        "stat": _code(lambda: trial.stat_object(bucket, newest)),
        "list backups/postgresql/": _code(lambda: list(trial.list_objects(bucket, pg_backup.PREFIX))),
        "list backups/": _code(lambda: list(trial.list_objects(bucket, "backups/", recursive=True))),
        "overwrite": _code(lambda: trial.put_object(bucket, newest, io.BytesIO(b"x"), 1)),
        "write a newer one": _code(
            lambda: trial.put_object(bucket, f"{pg_backup.PREFIX}zz-by-a-trial.dump", io.BytesIO(b"x"), 1)
        ),
        "delete": _code(lambda: trial.remove_object(bucket, newest)),
    }
    assert refused == dict.fromkeys(refused, "AccessDenied")
    after = root.stat_object(bucket, newest)
    assert (after.etag, after.size) == (before.etag, before.size)
    assert lab_ssh(master, "pg-backup list").stdout.split() == listed


# Run inside a trial's image with boto3 (what Determined's checkpoint storage uses); the keys
# come on stdin, never on a command line.
IN_TRIAL = """
import json, sys, uuid
import boto3, botocore.exceptions
c = json.load(sys.stdin)
s3 = boto3.client("s3", endpoint_url=c["endpoint"], aws_access_key_id=c["key"],
                  aws_secret_access_key=c["secret"], region_name=c["region"])
b, dump, mine = c["bucket"], c["dump"], "lab/in-trial-" + uuid.uuid4().hex
def code(call):
    try:
        call()
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"]
    return "allowed"
print(json.dumps({
    "get a backup": code(lambda: s3.get_object(Bucket=b, Key=dump)["Body"].read()),
    "list backups": code(lambda: s3.list_objects_v2(Bucket=b, Prefix=c["prefix"])),
    "overwrite a backup": code(lambda: s3.put_object(Bucket=b, Key=dump, Body=b"x")),
    "delete a backup": code(lambda: s3.delete_object(Bucket=b, Key=dump)),
    "put a checkpoint": code(lambda: s3.put_object(Bucket=b, Key=mine, Body=b"ckpt")),
    "get a checkpoint": code(lambda: s3.get_object(Bucket=b, Key=mine)["Body"].read()),
    "delete a checkpoint": code(lambda: s3.delete_object(Bucket=b, Key=mine)),
}))
"""


def test_a_trial_container_cannot_touch_the_backups(deployed, lab, lab_ssh):
    """The same from inside a task image on an agent, over the endpoint trials get."""
    from .test_scheduler_lab import run_on

    master = lab.master_node.hostname
    listed = lab_ssh(master, "pg-backup list").stdout.split()
    assert listed, "no backup to try (test_pg_backup_signs_with_its_own_keys makes one)"
    text = lab_ssh(master, "cat /etc/determined/master.yaml").stdout
    storage = (yaml.safe_load(text) or {}).get("checkpoint_storage") or {}
    given = {
        "endpoint": storage["endpoint_url"],
        "key": storage["access_key"],
        "secret": storage["secret_key"],
        "region": lab.storage.region,
        "bucket": lab.storage.bucket,
        "prefix": pg_backup.PREFIX,
        "dump": listed[-1],
    }
    image = shlex.quote(lab.task_refs.gpu)
    agent = lab.agents[0].hostname
    run = run_on(
        lab,
        agent,
        f"docker run -i --rm --network bridge {image} python3 -c {shlex.quote(IN_TRIAL)}",
        stdin=json.dumps(given),
    )
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {
        "get a backup": "AccessDenied",
        "list backups": "AccessDenied",
        "overwrite a backup": "AccessDenied",
        "delete a backup": "AccessDenied",
        "put a checkpoint": "allowed",
        "get a checkpoint": "allowed",
        "delete a checkpoint": "allowed",
    }
    assert lab_ssh(master, "pg-backup list").stdout.split() == listed


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
        assert minio_admin.error_code(e.value) == "AccessDenied"


def test_changed_policy_and_secret_are_repaired(deployed, lab, deploy, lab_ssh):
    root = minio_admin.admin_client(lab)
    name, user = minio_admin.determined(lab.storage).policy, lab.storage.determined_user
    root.policy_add(
        name,
        policy={
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]}],
        },
    )
    root.user_add(user, f"changed-{uuid.uuid4().hex}")
    problems = minio_admin.read_state(lab).problems
    assert len(problems) == 2, problems
    run = deploy(limit=lab.storage_node.hostname)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(iam_changes(run)) == 1, run.changed_operations()
    assert minio_admin.read_state(lab).problems == []
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
