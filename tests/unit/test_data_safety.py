"""Data safety without a lab: MinIO's data-mount drop-in, preflight's data_dir rule, and the
database backup program (files/postgresql/pg-backup) against the lab's MinIO stand-in."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import importlib.machinery
import importlib.util
import io
import types
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from minio.credentials import Credentials
from minio.signer import sign_v4_s3
from pyinfra.context import ctx_host
from pyinfra.facts.deb import DebPackages

from deploy.cluster import load_cluster
from roles.minio import server as minio
from roles.node import preflight
from roles.postgresql import backup as pg_backup
from roles.shared.ops import env_file
from tests.unit.labfiles import lab_text
from tests.unit.test_standin_determined import postgres  # noqa: F401 - the fixture
from tests.unit.test_standin_minio import PASSWORD, REGION, USER, MinioProcess

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "files" / "postgresql" / "pg-backup"
LAB = REPO / "inventories" / "lab" / "cluster.yaml"


def load_program() -> types.ModuleType:
    loader = importlib.machinery.SourceFileLoader("pg_backup_program", str(PROGRAM))
    spec = importlib.util.spec_from_loader("pg_backup_program", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


prog = load_program()


@pytest.fixture(scope="module")
def lab_cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lab")
    path = directory / "cluster.yaml"
    path.write_text(lab_text(directory, LAB.read_text()))
    return load_cluster(path)


def test_data_dir_problem_names_path_and_both_ways_out():
    assert preflight.data_dir_problem("/mnt/data", True, False) is None
    assert preflight.data_dir_problem("/mnt/data", False, True) is None
    problem = preflight.data_dir_problem("/mnt/data", False, False)
    assert problem is not None
    assert "storage.data_dir /mnt/data is not a mount point" in problem
    assert "mount the data disk at /mnt/data" in problem
    assert "storage.data_on_root_disk: true" in problem


def test_drop_in_requires_the_mount(lab_cluster):
    text = minio.data_mount_drop_in(lab_cluster)
    assert "RequiresMountsFor=/mnt/data\n" in text
    assert "AssertPathIsMountPoint=/mnt/data\n" in text
    root_disk = dataclasses.replace(lab_cluster.storage, data_on_root_disk=True)
    cluster = dataclasses.replace(lab_cluster, storage=root_disk)
    text = minio.data_mount_drop_in(cluster)
    assert "RequiresMountsFor=/mnt/data\n" in text and "\nAssertPathIsMountPoint=" not in text


def test_backup_conf_holds_no_secret(lab_cluster):
    text = pg_backup.conf(lab_cluster)
    assert lab_cluster.storage.secret_key.value not in text
    assert lab_cluster.storage.access_key.value not in text
    assert 'PGB_PREFIX="backups/postgresql/"' in text and 'PGB_KEEP="14"' in text


def test_backup_keys_are_pg_backups_own(lab_cluster):
    """/etc/pg-backup/s3.env: storage.backup_user's keys (deploy/minio_admin.py), not the
    master's (Determined's, which every trial holds), and what the program reads."""
    storage = lab_cluster.storage
    text = pg_backup.s3_env(lab_cluster)
    assert prog.S3_ENV == pg_backup.S3_ENV == "/etc/pg-backup/s3.env"
    assert storage.secret_key.value not in text and storage.determined_secret.value not in text
    assert f'AWS_ACCESS_KEY_ID="{storage.backup_user}"' in text
    assert f'AWS_SECRET_ACCESS_KEY="{storage.backup_secret.value}"' in text
    assert pg_backup.S3_ENV in pg_backup.conf(lab_cluster)


def test_role_writes_the_keys_with_secret_file(monkeypatch, lab_cluster):
    """The role's operations: the keys only through shared_ops.secret_file (root 0600, content
    never in pyinfra's output), everything else plain files without a secret."""
    calls = []

    class Recorder:
        def __init__(self, module):
            self.module = module

        def __getattr__(self, name):
            return lambda *args, **kwargs: calls.append((f"{self.module}.{name}", kwargs)) or name

    for module in ("files", "systemd"):
        monkeypatch.setattr(pg_backup, module, Recorder(module))
    monkeypatch.setattr(pg_backup, "packages", lambda *a, **kw: None)
    monkeypatch.setattr(pg_backup, "any_changed", lambda *ops: ops)
    monkeypatch.setattr(pg_backup, "secret_file", lambda **kw: calls.append(("secret_file", kw)))
    pg_backup.apply._inner(cluster=lab_cluster, node=lab_cluster.master_node)
    (secret,) = [kw for name, kw in calls if name == "secret_file"]
    assert secret["dest"] == pg_backup.S3_ENV and "mode" not in secret  # secret_file's 600 root
    assert secret["content"].data.decode() == pg_backup.s3_env(lab_cluster)
    assert "not shown" in str(secret["content"])
    plain = [kw for name, kw in calls if name == "files.put"]
    assert pg_backup.S3_ENV not in [kw["dest"] for kw in plain]
    shown = [
        str(kw) + (kw["src"].getvalue() if isinstance(kw.get("src"), io.StringIO) else "") for kw in plain
    ]
    for secret_value in (
        lab_cluster.storage.secret_key.value,
        lab_cluster.storage.backup_secret.value,
    ):
        assert not any(secret_value in text for text in shown)


def test_read_env_undoes_env_file_escapes(tmp_path):
    tricky = 'a"b\\c`d$e f'
    path = tmp_path / "env"
    path.write_text(env_file("header", {"AWS_SECRET_ACCESS_KEY": tricky, "X": "plain"}))
    assert prog.read_env(str(path)) == {"AWS_SECRET_ACCESS_KEY": tricky, "X": "plain"}


def test_expired_keeps_the_newest():
    keys = [f"backups/postgresql/determined-2026110{d}T023000Z-nightly.dump" for d in range(1, 6)]
    assert prog.expired(list(reversed(keys)), 3) == keys[:2]
    assert prog.expired(keys[:2], 3) == []


def test_signature_matches_minio_py():
    now = dt.datetime(2026, 11, 30, 2, 30, tzinfo=dt.UTC)
    payload = "a" * 64
    ours = prog.sign(
        "PUT", "10.0.0.1:9000", "/bucket/backups/x.dump", {}, {"content-length": 5}, payload,
        "AKID", "SECRET", "eu-west-3", now,
    )  # fmt: skip
    headers = {
        "Host": "10.0.0.1:9000",
        "x-amz-content-sha256": payload,
        "x-amz-date": now.strftime("%Y%m%dT%H%M%SZ"),
        "Content-Length": "5",
    }
    theirs = sign_v4_s3(
        method="PUT",
        url=urlsplit("http://10.0.0.1:9000/bucket/backups/x.dump"),
        region="eu-west-3",
        headers=headers,
        credentials=Credentials("AKID", "SECRET"),
        content_sha256=payload,
        date=now,
    )
    assert ours["authorization"] == theirs["Authorization"]


def test_upload_list_retention_download_against_the_standin(tmp_path):
    server = MinioProcess(tmp_path / "data", tmp_path, {
        "MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD, "MINIO_SITE_REGION": REGION,
    })  # fmt: skip
    server.wait_ready()
    try:
        server.client().make_bucket("ckpt", location=REGION)
        conf = {"PGB_ENDPOINT": f"http://127.0.0.1:{server.port}", "PGB_BUCKET": "ckpt"}
        keys = {"AWS_ACCESS_KEY_ID": USER, "AWS_SECRET_ACCESS_KEY": PASSWORD, "AWS_DEFAULT_REGION": REGION}
        bucket = prog.Bucket(conf, keys)
        body = tmp_path / "dump"
        body.write_bytes(b"PGDMP" + bytes(range(256)) * 4000)
        names = [f"backups/postgresql/db-2026113{i}T000000Z-nightly.dump" for i in range(3)]
        for name in names:
            with body.open("rb") as f:
                digest = hashlib.sha256(body.read_bytes()).hexdigest()
                bucket.request("PUT", name, body=f, size=body.stat().st_size, payload_hash=digest)
        assert bucket.list("backups/postgresql/") == names
        sink = io.BytesIO()
        bucket.request("GET", names[-1], sink=sink)
        assert sink.getvalue() == body.read_bytes()
        for old in prog.expired(bucket.list("backups/postgresql/"), 2):
            bucket.request("DELETE", old)
        assert bucket.list("backups/postgresql/") == names[1:]
        wrong = prog.Bucket(conf, {**keys, "AWS_SECRET_ACCESS_KEY": "wrong-secret"})
        with pytest.raises(prog.Failure, match="HTTP 403"):
            wrong.list("backups/postgresql/")
    finally:
        server.kill()


def test_bad_reason_is_one_line(capsys):
    assert prog.main(["backup", "--reason", "x; rm -rf /"]) == 1
    assert capsys.readouterr().err.startswith("pg-backup: reason")


class _Host:
    def __init__(self, installed):
        self.installed = installed

    def get_fact(self, cls, **kwargs):
        assert cls is DebPackages
        return self.installed


@pytest.mark.parametrize(
    ("installed", "backed_up"),
    [({}, False), ({"determined-master": ["0.38.0"]}, False), ({"determined-master": ["0.37.0"]}, True)],
)
def test_backup_only_before_another_version(monkeypatch, lab_cluster, installed, backed_up):
    calls = []
    monkeypatch.setattr(pg_backup.server, "shell", lambda **kw: calls.append(kw))
    with ctx_host.use(_Host(installed)):
        pg_backup.before_version_change(lab_cluster)
    assert bool(calls) == backed_up
    if backed_up:
        assert calls[0]["commands"] == ["/usr/local/sbin/pg-backup backup --reason before-0.38.0"]
        assert "0.37.0 -> 0.38.0" in calls[0]["name"]


@pytest.fixture
def drill_lab(tmp_path, monkeypatch, postgres):  # noqa: F811 - the fixture imported above
    """pg-backup's settings for the unit's PostgreSQL database and a MinIO stand-in bucket."""
    server = MinioProcess(tmp_path / "data", tmp_path, {
        "MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD, "MINIO_SITE_REGION": REGION,
    })  # fmt: skip
    server.wait_ready()
    server.client().make_bucket("ckpt", location=REGION)
    conf, s3 = tmp_path / "pg-backup.conf", tmp_path / "s3.env"
    conf.write_text(
        f'PGB_ENDPOINT="http://127.0.0.1:{server.port}"\nPGB_BUCKET="ckpt"\nPGB_REGION="{REGION}"\n'
        f'PGB_PREFIX="backups/postgresql/"\nPGB_DATABASE="{postgres["name"]}"\nPGB_KEEP="5"\n'
    )
    s3.write_text(
        f'AWS_ACCESS_KEY_ID="{USER}"\nAWS_SECRET_ACCESS_KEY="{PASSWORD}"\nAWS_DEFAULT_REGION="{REGION}"\n'
    )
    monkeypatch.setattr(prog, "CONF", str(conf))
    monkeypatch.setattr(prog, "S3_ENV", str(s3))
    monkeypatch.setattr(prog, "STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(prog, "LAST_DRILL", str(tmp_path / "state" / "last-drill.json"))
    monkeypatch.setattr(prog, "DRILL_DB", f"pgb_drill_{postgres['name']}")  # xdist workers apart
    monkeypatch.setenv("PGPORT", str(postgres["port"]))  # runuser keeps the environment
    db = postgres["name"]
    prog.psql(db, "DROP TABLE IF EXISTS experiments, users; CREATE TABLE experiments (id int)")
    prog.psql(db, "CREATE TABLE users (name text)")
    prog.psql(db, "INSERT INTO experiments SELECT generate_series(1, 12); INSERT INTO users VALUES ('admin')")
    try:
        yield types.SimpleNamespace(
            db=db, bucket=prog.Bucket(prog.read_env(str(conf)), prog.read_env(str(s3)))
        )
    finally:
        server.kill()


@pytest.mark.pg
def test_a_drill_restores_the_dump_apart_and_checks_it_against_its_manifest(drill_lab, capsys):
    import json

    assert prog.main(["backup", "--reason", "test"]) == 0
    (key,) = prog.dumps(drill_lab.bucket, "backups/postgresql/")
    manifest = prog.fetch_manifest(drill_lab.bucket, key)
    assert manifest["tables"] == {"experiments": [12, 12], "users": [1, 1]} and manifest["key"] == key
    assert prog.main(["list"]) == 0 and capsys.readouterr().out.split()[-1] == key  # no manifest listed

    assert prog.main(["drill", "latest"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"drill ok: {key}" in out and "2 tables, 13 rows" in out
    result = json.loads(Path(prog.LAST_DRILL).read_text())
    assert result["ok"] is True and result["key"] == key and result["problems"] == []
    # The scratch database is gone; the live one untouched.
    assert prog.psql("postgres", f"SELECT 1 FROM pg_database WHERE datname = '{prog.DRILL_DB}'") == []
    assert prog.row_counts(drill_lab.db) == {"experiments": 12, "users": 1}

    # A manifest that does not match what the dump holds (a dump cut short, the wrong database).
    manifest["tables"]["experiments"] = [20, 20]
    manifest["tables"]["trials"] = [3, 3]
    body = json.dumps(manifest).encode()
    drill_lab.bucket.request(
        "PUT", key + prog.MANIFEST, body=body, size=len(body), payload_hash=hashlib.sha256(body).hexdigest()
    )
    assert prog.main(["drill", key]) == 1
    err = capsys.readouterr().err
    assert "table experiments: 12 rows, 20 at dump time" in err and "table trials is missing" in err, err
    assert json.loads(Path(prog.LAST_DRILL).read_text())["ok"] is False

    # A dump changed after it was taken: not restored at all.
    drill_lab.bucket.request(
        "PUT", key, body=b"PGDMP-other", size=11, payload_hash=hashlib.sha256(b"PGDMP-other").hexdigest()
    )
    assert prog.main(["drill", key]) == 1
    assert "is not the manifest's" in capsys.readouterr().err


@pytest.mark.pg
def test_restore_latest_refuses_the_dump_of_an_emptier_database(drill_lab, capsys, monkeypatch):
    assert prog.main(["backup", "--reason", "full"]) == 0
    # A master rebuilt on an empty database; the nightly timer dumps it.
    prog.psql(drill_lab.db, "DELETE FROM experiments")
    monkeypatch.setattr(prog, "datetime", types.SimpleNamespace(datetime=_Later, timezone=dt.timezone))
    assert prog.main(["backup", "--reason", "nightly"]) == 0
    older, newest = prog.dumps(drill_lab.bucket, "backups/postgresql/")
    stopped = []
    monkeypatch.setattr(prog.subprocess, "run", lambda *a, **k: stopped.append(a) or _real_run(*a, **k))
    assert prog.main(["restore", "latest"]) == 1
    err = capsys.readouterr().err
    assert f"the newest backup {newest} holds fewer rows than {older} (experiments 0 < 12)" in err, err
    assert "--force" in err and not any("systemctl" in a[0] for a in stopped)  # the master was never stopped


_real_run = prog.subprocess.run


class _Later(dt.datetime):
    """Now plus a minute: the second backup's key sorts after the first one's."""

    @classmethod
    def now(cls, tz=None):
        return dt.datetime.now(tz) + dt.timedelta(minutes=1)
