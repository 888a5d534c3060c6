"""The deploy's MinIO users (Determined's bucket-only one, pg-backup's backups-only one): the
model keys, the policies, the console options, the deploy's admin-API calls
(deploy/minio_admin.py, roles/minio/iam.py) and what each user's keys may do, against the MinIO
stand-in.

The stand-in runs as a process on 127.0.0.1 (like tests/unit/test_standin_minio.py); the
cluster file is tests/unit/test_storage_roles.py's, whose storage node is 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import io
import json
from pathlib import Path

import pytest
from minio import Minio
from minio.credentials import StaticProvider
from minio.deleteobjects import DeleteObject
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin
from pyinfra.api import FunctionCommand

from deploy import minio_admin
from deploy.cluster import ClusterError, load_cluster, storage_keys
from roles.minio import iam as roles_minio_iam
from roles.minio import server as minio
from tests.unit.optest import run_op
from tests.unit.test_standin_minio import MinioProcess
from tests.unit.test_storage_roles import NASTY, write_cluster
from tests.verify.test_storage import parse_env_file

ROOT_USER, ROOT_SECRET = "lab-root-user", "lab-Root-Secret-1"


def _load_pg_backup_program():
    path = Path(__file__).resolve().parents[2] / "files" / "postgresql" / "pg-backup"
    loader = importlib.machinery.SourceFileLoader("pg_backup_program_iam", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


pg_backup_program = _load_pg_backup_program()


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
    assert c.storage.backup_user == "pg-backup"
    assert c.storage.console == "localhost"


@pytest.mark.parametrize("key", ["determined_user", "backup_user"])
def test_users_must_not_be_the_root_user_and_it_is_not_shown(env, tmp_path, key):
    path = cluster_file(tmp_path, **{key: ROOT_USER})
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    assert e.value.problems == [
        f"{path}: storage.{key}: (not shown): must not be storage.access_key (MinIO's root user)"
    ]
    assert ROOT_USER not in str(e.value.problems)


def test_backup_user_must_not_be_determineds(env, tmp_path):
    path = cluster_file(tmp_path, backup_user="determined")
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    assert e.value.problems == [
        f"{path}: storage.backup_user: 'determined': must differ from storage.determined_user "
        "(trials hold its keys)"
    ]


@pytest.mark.parametrize("prefix", ["backups", "backups/team-a", "backups/postgresql"])
def test_checkpoint_prefix_must_not_be_under_backups(env, tmp_path, prefix):
    path = cluster_file(tmp_path, prefix=prefix)
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    (problem,) = e.value.problems
    assert problem.startswith(f"{path}: storage.prefix: '{prefix}': must not be under backups/")


def test_checkpoint_prefix_beside_backups_is_fine(env, tmp_path):
    assert load_cluster(cluster_file(tmp_path, prefix="backupsets/a")).storage.prefix == "backupsets/a"


@pytest.mark.parametrize(
    ("key", "value", "what"),
    [
        ("determined_user", "ab", "3 to 20 letters"),
        ("determined_user", "'a,b=c'", "3 to 20 letters"),
        ("determined_user", "abcdefghijklmnopqrstu", "3 to 20 letters"),
        ("backup_user", "'pg backup'", "3 to 20 letters"),
        ("console", "public", "must be one of localhost, all, disabled"),
    ],
)
def test_bad_values(env, tmp_path, key, value, what):
    with pytest.raises(ClusterError) as e:
        load_cluster(cluster_file(tmp_path, **{key: value}))
    (problem,) = e.value.problems
    assert f"storage.{key}:" in problem and what in problem


# --- secret and policy ------------------------------------------------------------------------


def test_derived_secret_keys(env, tmp_path):
    """The model derives each user's key once, at load (deploy/cluster/storage_keys.py)."""
    c = load_cluster(cluster_file(tmp_path))
    key = c.storage.determined_secret.value
    assert len(key) == minio_admin.SECRET_KEY_LENGTH
    assert key == load_cluster(cluster_file(tmp_path)).storage.determined_secret.value
    assert ROOT_SECRET not in key and key.replace("-", "").replace("_", "").isalnum()
    other = load_cluster(cluster_file(tmp_path, determined_user="trials"))
    assert other.storage.determined_secret.value != key
    # pg-backup's is its own: a trial holding Determined's key cannot compute it.
    backup = c.storage.backup_secret.value
    assert len(backup) == minio_admin.SECRET_KEY_LENGTH and backup != key
    assert backup == storage_keys.derive_secret(ROOT_SECRET, "pg-backup")
    # The users the deploy makes carry them; no repr shows one.
    assert [u.secret for u in minio_admin.users(c.storage)] == [
        c.storage.determined_secret,
        c.storage.backup_secret,
    ]
    shown = repr(c) + repr(c.storage.determined_secret) + repr(minio_admin.users(c.storage))
    assert key not in shown and backup not in shown and ROOT_SECRET not in shown
    # Without resolving secrets there is no root password to derive from: unresolved too.
    unresolved = load_cluster(cluster_file(tmp_path), resolve_secrets=False).storage.determined_secret
    assert not unresolved.resolved


def _secret(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return "{file: " + str(path) + "}"


def test_given_secret_keys_replace_the_derived_ones(env, tmp_path):
    own, backup = "Trials-Own-Key+/=._~-0123456789abcdef", "b" * 40
    c = load_cluster(
        cluster_file(
            tmp_path,
            determined_secret_key=_secret(tmp_path, "det.key", own),
            backup_secret_key=_secret(tmp_path, "backup.key", backup),
        )
    )
    assert c.storage.determined_secret.value == own
    assert c.storage.backup_secret.value == backup
    only_one = load_cluster(cluster_file(tmp_path, determined_secret_key=_secret(tmp_path, "d.key", own)))
    derived = load_cluster(cluster_file(tmp_path)).storage.backup_secret
    assert only_one.storage.backup_secret == derived


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("short", "must be 8 to 40 letters, digits or '+/=._~-' (MinIO's secret key length)"),
        ("x" * 41, "must be 8 to 40 letters, digits or '+/=._~-' (MinIO's secret key length)"),
        ("has space inside", "must be 8 to 40 letters, digits or '+/=._~-' (MinIO's secret key length)"),
        ('quote"inside1', "must be 8 to 40 letters, digits or '+/=._~-' (MinIO's secret key length)"),
        (ROOT_SECRET, "must differ from storage.secret_key"),
    ],
)
def test_a_given_secret_key_is_checked_and_never_shown(env, tmp_path, text, why):
    reference = _secret(tmp_path, "det.key", text)
    with pytest.raises(ClusterError) as e:
        load_cluster(cluster_file(tmp_path, determined_secret_key=reference))
    lines = str(e.value).splitlines()
    assert len(lines) == 1 and "storage.determined_secret_key" in lines[0] and why in lines[0], lines
    assert text not in str(e.value)


def test_the_two_users_may_not_share_a_given_secret(env, tmp_path):
    same = "Shared-Secret-0123456789"
    with pytest.raises(ClusterError) as e:
        load_cluster(
            cluster_file(
                tmp_path,
                determined_secret_key=_secret(tmp_path, "a.key", same),
                backup_secret_key=_secret(tmp_path, "b.key", same),
            )
        )
    assert "storage.backup_secret_key" in str(e.value)
    assert "must differ from storage.determined_secret_key" in str(e.value)
    assert same not in str(e.value)


def test_minio_takes_a_given_secret_key(env, tmp_path, server):
    own = "Given-Trial-Secret-0123456789"
    cluster = load_cluster(
        cluster_file(tmp_path, port=server.port, determined_secret_key=_secret(tmp_path, "det.key", own))
    )
    server.client(ROOT_SECRET, "us-east-1", ROOT_USER).make_bucket("det-checkpoints", location="us-east-1")
    user = minio_admin.determined(cluster.storage)
    minio_admin.ensure(cluster, user)
    assert minio_admin.read_state(cluster, user).problems == []
    server.client(own, "us-east-1", "determined").put_object("det-checkpoints", "a", io.BytesIO(b"x"), 1)


DENY_ADMIN = {"Effect": "Deny", "Action": ["admin:CreateServiceAccount", "admin:CreateUser"]}
DENY_BACKUPS = [
    {"Effect": "Deny", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::det-checkpoints/backups/*"]},
    {
        "Effect": "Deny",
        "Action": ["s3:ListBucket"],
        "Resource": ["arn:aws:s3:::det-checkpoints"],
        "Condition": {"StringLike": {"s3:prefix": ["backups/*"]}},
    },
]


def test_policy_without_prefix(env, tmp_path):
    storage = load_cluster(cluster_file(tmp_path)).storage
    user = minio_admin.determined(storage)
    doc = user.document
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
    assert [s for s in doc["Statement"] if s["Effect"] == "Deny"] == [*DENY_BACKUPS, DENY_ADMIN]
    # A wildcard only where it takes rights away.
    assert not any(a == "*" or a.endswith(":*") for s in allow for a in s["Action"])
    assert (user.name, user.policy) == ("determined", "determined-checkpoints")


def test_policy_with_prefix_leaves_the_backups_out(env, tmp_path):
    storage = load_cluster(cluster_file(tmp_path, prefix="team-a/runs")).storage
    doc = minio_admin.determined_policy(storage)
    (objects,) = [s for s in doc["Statement"] if "s3:PutObject" in s["Action"] and s["Effect"] == "Allow"]
    assert objects["Resource"] == ["arn:aws:s3:::det-checkpoints/team-a/runs/*"]
    assert [s for s in doc["Statement"] if s["Effect"] == "Deny"] == [*DENY_BACKUPS, DENY_ADMIN]


def test_backup_policy_is_what_pg_backup_does_under_its_prefix(env, tmp_path):
    from roles.postgresql import backup as pg_backup

    storage = load_cluster(cluster_file(tmp_path, prefix="team-a/runs")).storage
    user = minio_admin.backup(storage)
    assert (user.name, user.policy) == ("pg-backup", "pg-backup-postgresql")
    assert user.document == {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": ["arn:aws:s3:::det-checkpoints"],
                "Condition": {"StringLike": {"s3:prefix": ["backups/postgresql/*"]}},
            },
            {
                "Effect": "Allow",
                "Action": ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"],
                "Resource": ["arn:aws:s3:::det-checkpoints/backups/postgresql/*"],
            },
            DENY_ADMIN,
        ],
    }
    assert pg_backup.PREFIX == minio_admin.BACKUP_PREFIX
    assert minio_admin.BACKUP_PREFIX.startswith(minio_admin.RESERVED_PREFIX)
    assert [u.name for u in minio_admin.users(storage)] == ["determined", "pg-backup"]


def test_canonical_ignores_order_and_layout_only(env, tmp_path):
    doc = minio_admin.determined_policy(load_cluster(cluster_file(tmp_path)).storage)
    shuffled = json.loads(json.dumps(doc))
    shuffled["Statement"].reverse()
    for st in shuffled["Statement"]:
        st["Action"].reverse()
    assert minio_admin.canonical(shuffled) == minio_admin.canonical(doc)
    wider = json.loads(json.dumps(doc))
    wider["Statement"][0]["Resource"] = ["arn:aws:s3:::*"]
    assert minio_admin.canonical(wider) != minio_admin.canonical(doc)


def test_canonical_reads_conditions_as_minio_prints_them(env, tmp_path):
    doc = minio_admin.backup_policy(load_cluster(cluster_file(tmp_path)).storage)
    printed = json.loads(json.dumps(doc))
    # MinIO prints a condition's values as an array in set order; a lone string means the same.
    printed["Statement"][0]["Condition"] = {"StringLike": {"s3:prefix": "backups/postgresql/*"}}
    assert minio_admin.canonical(printed) == minio_admin.canonical(doc)
    printed["Statement"][0]["Condition"] = {"StringLike": {"s3:prefix": ["backups/*"]}}
    assert minio_admin.canonical(printed) != minio_admin.canonical(doc)


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
    for user in minio_admin.users(cluster.storage):
        assert minio_admin.read_state(cluster, user).problems  # nothing there yet
        done = minio_admin.ensure(cluster, user)
        assert [d.split(" (")[0] for d in done] == [
            f"wrote policy {user.policy}",
            f"wrote user {user.name}",
            f"set policy {user.policy} on user {user.name}",
        ]
    return cluster


def trial_client(server, cluster) -> Minio:
    return server.client(cluster.storage.determined_secret.value, "us-east-1", "determined")


def backup_client(server, cluster) -> Minio:
    return server.client(cluster.storage.backup_secret.value, "us-east-1", "pg-backup")


def test_second_ensure_changes_nothing(deployed):
    for user in minio_admin.users(deployed.storage):
        assert minio_admin.read_state(deployed, user).problems == []
        assert minio_admin.ensure(deployed, user) == []


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
        credentials=StaticProvider("determined", deployed.storage.determined_secret.value),
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
        assert minio_admin.error_code(e.value) == "AccessDenied"


def test_drift_is_repaired(deployed, server):
    root = minio_admin.admin_client(deployed)
    root.policy_add(
        "determined-checkpoints",
        policy={
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]}],
        },
    )
    root.user_add("determined", "someone-elses-secret")
    problems = minio_admin.read_state(deployed).problems
    assert [p.split(" ")[0:2] for p in problems] == [
        ["policy", "determined-checkpoints"],
        ["user", "determined's"],
    ]
    done = minio_admin.ensure(deployed)
    assert len(done) == 2 and minio_admin.read_state(deployed).problems == []
    root.policy_set("readwrite", user="determined")
    assert minio_admin.read_state(deployed).mapping
    minio_admin.ensure(deployed)
    assert json.loads(root.user_info("determined"))["policyName"] == "determined-checkpoints"


def _code(call) -> str:
    try:
        call()
    except S3Error as e:
        return e.code
    return "allowed"


def test_trial_keys_are_denied_the_backups(deployed, server):
    """Read, list, overwrite, delete under backups/: AccessDenied, checkpoints still work."""
    root = server.client(ROOT_SECRET, "us-east-1", ROOT_USER)
    dump = "backups/postgresql/determined-20261130T023000Z-nightly.dump"
    root.put_object("det-checkpoints", dump, io.BytesIO(b"PGDMP"), 5)
    s3 = trial_client(server, deployed)
    s3.put_object("det-checkpoints", "ckpt/b.bin", io.BytesIO(b"y"), 1)
    refused = {
        "get": _code(lambda: s3.get_object("det-checkpoints", dump)),
        "stat": _code(lambda: s3.stat_object("det-checkpoints", dump)),
        "overwrite": _code(lambda: s3.put_object("det-checkpoints", dump, io.BytesIO(b"x"), 1)),
        "write beside": _code(lambda: s3.put_object("det-checkpoints", "backups/other", io.BytesIO(b"x"), 1)),
        "delete": _code(lambda: s3.remove_object("det-checkpoints", dump)),
        "list backups/postgresql/": _code(
            lambda: list(s3.list_objects("det-checkpoints", "backups/postgresql/"))
        ),
        "list backups/": _code(lambda: list(s3.list_objects("det-checkpoints", "backups/", recursive=True))),
    }
    assert refused == dict.fromkeys(refused, "AccessDenied")
    # minio-py's remove_objects (DeleteObjects) reports a refusal per key, not as an exception.
    errors = list(s3.remove_objects("det-checkpoints", [DeleteObject(dump)]))
    assert [e.code for e in errors] == ["AccessDenied"]
    assert root.get_object("det-checkpoints", dump).read() == b"PGDMP"
    # The rest of the bucket as before: checkpoints listed, read and deleted.
    assert [o.object_name for o in s3.list_objects("det-checkpoints", "ckpt/")] == ["ckpt/b.bin"]
    assert s3.get_object("det-checkpoints", "ckpt/b.bin").read() == b"y"
    s3.remove_object("det-checkpoints", "ckpt/b.bin")


def test_backup_keys_do_what_pg_backup_does_and_nothing_else(deployed, server, tmp_path):
    """files/postgresql/pg-backup's own requests with its own keys, then what it must not do."""
    storage = deployed.storage
    conf = {"PGB_ENDPOINT": f"http://127.0.0.1:{server.port}", "PGB_BUCKET": "det-checkpoints"}
    keys = {"AWS_ACCESS_KEY_ID": "pg-backup", "AWS_SECRET_ACCESS_KEY": storage.backup_secret.value}
    bucket = pg_backup_program.Bucket({**conf, "PGB_REGION": "us-east-1"}, keys)
    prefix = minio_admin.BACKUP_PREFIX
    names = [f"{prefix}determined-2026113{i}T023000Z-nightly.dump" for i in range(3)]
    for name in names:
        bucket.request(
            "PUT", name, body=io.BytesIO(b"PGDMP"), size=5, payload_hash=hashlib.sha256(b"PGDMP").hexdigest()
        )
    assert bucket.list(prefix) == names
    sink = io.BytesIO()
    bucket.request("GET", names[-1], sink=sink)
    assert sink.getvalue() == b"PGDMP"
    for old in pg_backup_program.expired(bucket.list(prefix), 1):
        bucket.request("DELETE", old)
    assert bucket.list(prefix) == names[-1:]

    root = server.client(ROOT_SECRET, "us-east-1", ROOT_USER)
    root.put_object("det-checkpoints", "ckpt/c.bin", io.BytesIO(b"z"), 1)
    s3 = backup_client(server, deployed)
    refused = {
        "read a checkpoint": _code(lambda: s3.get_object("det-checkpoints", "ckpt/c.bin")),
        "write a checkpoint": _code(lambda: s3.put_object("det-checkpoints", "ckpt/d", io.BytesIO(b"x"), 1)),
        "delete a checkpoint": _code(lambda: s3.remove_object("det-checkpoints", "ckpt/c.bin")),
        "list the bucket": _code(lambda: list(s3.list_objects("det-checkpoints", recursive=True))),
        "list checkpoints": _code(lambda: list(s3.list_objects("det-checkpoints", "ckpt/"))),
        "write elsewhere under backups/": _code(
            lambda: s3.put_object("det-checkpoints", "backups/other", io.BytesIO(b"x"), 1)
        ),
        "another bucket": _code(lambda: list(s3.list_objects("other-bucket", prefix))),
        "make a bucket": _code(lambda: s3.make_bucket("new-bucket", location="us-east-1")),
    }
    assert refused == dict.fromkeys(refused, "AccessDenied")
    with pytest.raises(pg_backup_program.Failure, match="HTTP 403 AccessDenied"):
        bucket.list("ckpt/")
    admin = MinioAdmin(
        endpoint=f"127.0.0.1:{server.port}",
        credentials=StaticProvider("pg-backup", keys["AWS_SECRET_ACCESS_KEY"]),
        region="us-east-1",
        secure=False,
    )
    for call in (lambda: admin.user_add("pg-backup", "changed-by-someone"), admin.policy_list):
        with pytest.raises(MinioAdminException) as e:
            call()
        assert minio_admin.error_code(e.value) == "AccessDenied"


def test_backup_user_drift_is_repaired(deployed, server):
    user = minio_admin.backup(deployed.storage)
    root = minio_admin.admin_client(deployed)
    root.policy_set("readwrite", user=user.name)
    root.user_add(user.name, "someone-elses-secret")
    state = minio_admin.read_state(deployed, user)
    assert state.mapping and state.user and not state.policy
    minio_admin.ensure(deployed, user)
    assert minio_admin.read_state(deployed, user).problems == []
    assert minio_admin.read_state(deployed).problems == []  # Determined's untouched


def test_role_operation_is_a_noop_when_minio_matches(deployed):
    noops = []
    for user in minio_admin.users(deployed.storage):
        commands, said = run_op(roles_minio_iam.scoped_user, {}, deployed, user)  # reads no fact
        assert commands == []
        noops += said
    assert noops == [
        "user determined has policy determined-checkpoints",
        "user pg-backup has policy pg-backup-postgresql",
    ]


def test_role_operation_repairs_through_the_controller(deployed):
    user = minio_admin.backup(deployed.storage)
    minio_admin.admin_client(deployed).policy_set("readwrite", user=user.name)
    (command,), noops = run_op(roles_minio_iam.scoped_user, {}, deployed, user)
    assert isinstance(command, FunctionCommand) and noops == []
    assert minio_admin.read_state(deployed, user).mapping  # nothing done until pyinfra runs it
    logged = []
    assert command.function(None, type("H", (), {"log": lambda self, line, f: logged.append(line)})())
    assert logged == [
        f"set policy {user.policy} on user pg-backup "
        f"(user pg-backup has policies ['readwrite'], not [{user.policy}])"
    ]
    assert minio_admin.read_state(deployed, user).problems == []


def test_errors_name_no_secret(env, tmp_path, server):
    cluster = load_cluster(cluster_file(tmp_path, port=server.port))
    bad = minio_admin.admin_client(cluster)
    bad._provider = StaticProvider(ROOT_USER, "wrong-secret-123")
    with pytest.raises(minio_admin.IamError) as e:
        minio_admin.read_state(cluster, admin=bad)
    assert "SignatureDoesNotMatch" in str(e.value)
    assert ROOT_SECRET not in str(e.value) and cluster.storage.determined_secret.value not in str(e.value)


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


def test_stand_in_refuses_listing_conditions_elsewhere_like_minio(server):
    """minio/pkg policy: s3:prefix only with ListBucket(Versions); the deploy's policies pass."""
    admin = MinioAdmin(
        endpoint=f"127.0.0.1:{server.port}",
        credentials=StaticProvider(ROOT_USER, ROOT_SECRET),
        region="us-east-1",
        secure=False,
    )
    statement = {
        "Effect": "Deny",
        "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads"],
        "Resource": ["arn:aws:s3:::b"],
        "Condition": {"StringLike": {"s3:prefix": ["backups/*"]}},
    }
    with pytest.raises(MinioAdminException) as e:
        admin.policy_add("bad", policy={"Version": "2012-10-17", "Statement": [statement]})
    assert minio_admin.error_code(e.value) == "XMinioMalformedIAMPolicy"


def test_an_unreachable_minio_is_named_with_its_cause(env, tmp_path):
    """The admin API on a port nothing listens on: one line naming the endpoint and why
    (urllib3's MaxRetryError alone names only the URL), no root keys."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = load_cluster(cluster_file(tmp_path, port=port))
    with pytest.raises(minio_admin.IamError) as e:
        minio_admin.read_state(c)
    text = str(e.value)
    assert f"MinIO at 127.0.0.1:{port} is not reachable: MaxRetryError (NewConnectionError:" in text
    assert "Connection refused" in text
    assert ROOT_SECRET not in text and ROOT_USER not in text
