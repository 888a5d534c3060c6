"""Determined's bucket-only MinIO user: the model keys, the policy, the console options, and
the deploy's admin-API calls (deploy/minio_iam.py) against the MinIO stand-in.

The stand-in runs as a process on 127.0.0.1 (like tests/unit/test_standin_minio.py); the
cluster file is tests/unit/test_storage_roles.py's, whose storage node is 127.0.0.1.
"""

from __future__ import annotations

import io
import json

import pytest
from minio import Minio
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin

from deploy import minio_iam
from deploy.cluster import ClusterError, load_cluster
from roles import minio
from tests.unit.test_standin_minio import MinioProcess
from tests.unit.test_storage_roles import NASTY, write_cluster
from tests.verify.test_storage import parse_env_file

ROOT_USER, ROOT_SECRET = "lab-root-user", "lab-Root-Secret-1"


@pytest.fixture
def env(monkeypatch):
    for k, v in {**NASTY, "T_ACCESS": ROOT_USER, "T_SECRET": ROOT_SECRET}.items():
        monkeypatch.setenv(k, v)


def cluster_file(tmp_path, port=9000, prefix=None, **storage):
    path = write_cluster(tmp_path, storage_port=port, prefix=prefix)
    if storage:
        text = path.read_text().replace(
            "storage:\n", "storage:\n" + "".join(f"  {k}: {v}\n" for k, v in storage.items())
        )
        path.write_text(text)
    return path


# --- model ------------------------------------------------------------------------------------


def test_defaults(env, tmp_path):
    c = load_cluster(cluster_file(tmp_path))
    assert c.storage.determined_user == "determined"
    assert c.storage.console == "localhost"


def test_determined_user_must_not_be_the_root_user_and_is_not_shown(env, tmp_path):
    path = cluster_file(tmp_path, determined_user=ROOT_USER)
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    assert e.value.problems == [
        f"{path}: storage.determined_user: (not shown): must not be storage.access_key (MinIO's root user)"
    ]
    assert ROOT_USER not in str(e.value.problems)


@pytest.mark.parametrize(
    ("key", "value", "what"),
    [
        ("determined_user", "ab", "3 to 20 letters"),
        ("determined_user", "'a,b=c'", "3 to 20 letters"),
        ("determined_user", "abcdefghijklmnopqrstu", "3 to 20 letters"),
        ("console", "public", "must be one of localhost, all, disabled"),
    ],
)
def test_bad_values(env, tmp_path, key, value, what):
    with pytest.raises(ClusterError) as e:
        load_cluster(cluster_file(tmp_path, **{key: value}))
    (problem,) = e.value.problems
    assert f"storage.{key}:" in problem and what in problem


# --- secret and policy ------------------------------------------------------------------------


def test_derived_secret_key(env, tmp_path):
    c = load_cluster(cluster_file(tmp_path))
    key = minio_iam.determined_secret_key(c.storage)
    assert len(key) == minio_iam.SECRET_KEY_LENGTH
    assert key == minio_iam.determined_secret_key(c.storage)
    assert ROOT_SECRET not in key and key.replace("-", "").replace("_", "").isalnum()
    other = load_cluster(cluster_file(tmp_path, determined_user="trials"))
    assert minio_iam.determined_secret_key(other.storage) != key


def test_policy_without_prefix(env, tmp_path):
    storage = load_cluster(cluster_file(tmp_path)).storage
    doc = minio_iam.policy_document(storage)
    assert doc["Version"] == "2012-10-17"
    allow = [s for s in doc["Statement"] if s["Effect"] == "Allow"]
    assert allow == [
        {
            "Effect": "Allow",
            "Action": ["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
            "Resource": ["arn:aws:s3:::det-checkpoints"],
        },
        {
            "Effect": "Allow",
            "Action": [
                "s3:AbortMultipartUpload",
                "s3:DeleteObject",
                "s3:GetObject",
                "s3:ListMultipartUploadParts",
                "s3:PutObject",
            ],
            "Resource": ["arn:aws:s3:::det-checkpoints/*"],
        },
    ]
    assert {"Effect": "Deny", "Action": ["admin:CreateServiceAccount", "admin:CreateUser"]} in doc[
        "Statement"
    ]
    assert not any(a == "*" or a.endswith(":*") for s in doc["Statement"] for a in s["Action"])
    assert minio_iam.policy_name(storage) == "determined-checkpoints"


def test_policy_with_prefix_covers_the_database_backups(env, tmp_path):
    from roles import pg_backup

    storage = load_cluster(cluster_file(tmp_path, prefix="team-a/runs")).storage
    (objects,) = [s for s in minio_iam.policy_document(storage)["Statement"] if "s3:PutObject" in s["Action"]]
    assert objects["Resource"] == [
        "arn:aws:s3:::det-checkpoints/team-a/runs/*",
        f"arn:aws:s3:::det-checkpoints/{pg_backup.PREFIX}*",
    ]
    assert minio_iam.BACKUP_PREFIX == pg_backup.PREFIX


def test_canonical_ignores_order_and_layout_only(env, tmp_path):
    doc = minio_iam.policy_document(load_cluster(cluster_file(tmp_path)).storage)
    shuffled = json.loads(json.dumps(doc))
    shuffled["Statement"].reverse()
    for st in shuffled["Statement"]:
        st["Action"].reverse()
    assert minio_iam.canonical(shuffled) == minio_iam.canonical(doc)
    wider = json.loads(json.dumps(doc))
    wider["Statement"][0]["Resource"] = ["arn:aws:s3:::*"]
    assert minio_iam.canonical(wider) != minio_iam.canonical(doc)


# --- console ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("console", "opts", "browser"),
    [
        ("localhost", "--address :9000 --console-address 127.0.0.1:9001", None),
        ("all", "--address :9000 --console-address :9001", None),
        ("disabled", "--address :9000", "off"),
    ],
)
def test_console_options(env, tmp_path, console, opts, browser):
    c = load_cluster(cluster_file(tmp_path, console=console))
    values = parse_env_file(minio.env_content(c))
    assert values["MINIO_OPTS"] == opts
    assert values.get("MINIO_BROWSER") == browser


# --- against the stand-in ---------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    srv = MinioProcess(
        tmp_path / "data",
        tmp_path,
        {"MINIO_ROOT_USER": ROOT_USER, "MINIO_ROOT_PASSWORD": ROOT_SECRET, "MINIO_SITE_REGION": "us-east-1"},
    )
    srv.wait_ready()
    yield srv
    srv.kill()


@pytest.fixture
def deployed(env, tmp_path, server):
    cluster = load_cluster(cluster_file(tmp_path, port=server.port))
    root = server.client(ROOT_SECRET, "us-east-1", ROOT_USER)
    root.make_bucket("det-checkpoints", location="us-east-1")
    root.make_bucket("other-bucket", location="us-east-1")
    assert minio_iam.read_state(cluster).problems  # nothing there yet
    done = minio_iam.ensure(cluster)
    assert [d.split(" (")[0] for d in done] == [
        "wrote policy determined-checkpoints",
        "wrote user determined",
        "set policy determined-checkpoints on user determined",
    ]
    return cluster


def trial_client(server, cluster) -> Minio:
    return server.client(minio_iam.determined_secret_key(cluster.storage), "us-east-1", "determined")


def test_second_ensure_changes_nothing(deployed):
    assert minio_iam.read_state(deployed).problems == []
    assert minio_iam.ensure(deployed) == []


def test_scoped_key_works_in_the_bucket_and_nowhere_else(deployed, server):
    s3 = trial_client(server, deployed)
    s3.put_object("det-checkpoints", "ckpt/a.bin", io.BytesIO(b"x" * 10), 10)
    assert s3.get_object("det-checkpoints", "ckpt/a.bin").read() == b"x" * 10
    assert [o.object_name for o in s3.list_objects("det-checkpoints", recursive=True)] == ["ckpt/a.bin"]
    s3.remove_object("det-checkpoints", "ckpt/a.bin")
    # MinIO shows a user without ListAllMyBuckets the buckets it may list, not the others.
    assert [b.name for b in s3.list_buckets()] == ["det-checkpoints"]
    for refused in (
        lambda: s3.make_bucket("new-bucket", location="us-east-1"),
        lambda: s3.put_object("other-bucket", "x", io.BytesIO(b"x"), 1),
        lambda: list(s3.list_objects("other-bucket")),
        lambda: s3.remove_bucket("det-checkpoints"),
    ):
        with pytest.raises(S3Error) as e:
            refused()
        assert e.value.code == "AccessDenied"


def test_scoped_key_is_refused_the_admin_api(deployed, server):
    admin = MinioAdmin(
        endpoint=f"127.0.0.1:{server.port}",
        credentials=StaticProvider("determined", minio_iam.determined_secret_key(deployed.storage)),
        region="us-east-1",
        secure=False,
    )
    for call in (
        lambda: admin.user_add("intruder", "intruder-secret-1"),
        lambda: admin.policy_add("all", policy={"Version": "2012-10-17", "Statement": []}),
        lambda: admin.policy_set("readwrite", user="determined"),
        admin.policy_list,
        # Its own password too: the policy denies admin:CreateUser.
        lambda: admin.user_add("determined", "changed-by-a-trial"),
    ):
        with pytest.raises(MinioAdminException) as e:
            call()
        assert minio_iam.error_code(e.value) == "AccessDenied"


def test_drift_is_repaired(deployed, server):
    root = minio_iam.admin_client(deployed)
    root.policy_add(
        "determined-checkpoints",
        policy={
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]}],
        },
    )
    root.user_add("determined", "someone-elses-secret")
    problems = minio_iam.read_state(deployed).problems
    assert [p.split(" ")[0:2] for p in problems] == [
        ["policy", "determined-checkpoints"],
        ["user", "determined's"],
    ]
    done = minio_iam.ensure(deployed)
    assert len(done) == 2 and minio_iam.read_state(deployed).problems == []
    root.policy_set("readwrite", user="determined")
    assert minio_iam.read_state(deployed).mapping
    minio_iam.ensure(deployed)
    assert json.loads(root.user_info("determined"))["policyName"] == "determined-checkpoints"


def test_errors_name_no_secret(env, tmp_path, server):
    cluster = load_cluster(cluster_file(tmp_path, port=server.port))
    bad = minio_iam.admin_client(cluster)
    bad._provider = StaticProvider(ROOT_USER, "wrong-secret-123")
    with pytest.raises(minio_iam.IamError) as e:
        minio_iam.read_state(cluster, bad)
    assert "SignatureDoesNotMatch" in str(e.value)
    assert ROOT_SECRET not in str(e.value) and minio_iam.determined_secret_key(cluster.storage) not in str(
        e.value
    )


def test_stand_in_encrypts_like_madmin(server):
    """list-users answers encrypted with the caller's key: minio-py's decrypt reads it."""
    admin = MinioAdmin(
        endpoint=f"127.0.0.1:{server.port}",
        credentials=StaticProvider(ROOT_USER, ROOT_SECRET),
        region="us-east-1",
        secure=False,
    )
    admin.user_add("someone", "someone-secret-1")
    assert json.loads(admin.user_list()) == {"someone": {"status": "enabled"}}
    admin.policy_add(
        "mine",
        policy={
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}],
        },
    )
    policies = json.loads(admin.policy_list())
    assert {"consoleAdmin", "readwrite", "mine"} <= set(policies)
    assert policies["mine"]["Statement"] == [
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::b/*"]}
    ]
