"""Checkpoint storage: MinIO up, the bucket in the right region, the master's keys work.

Least privilege: the keys in master.yaml and the master's environment (so in every trial) are
Determined's own MinIO user (storage.determined_user, deploy/minio_iam.py), confined to the
checkpoint bucket; MinIO's root keys are only in /etc/default/minio; the console listens
where storage.console says.

The article's symptom "checkpoint save fails with Permission denied -> bucket policy or wrong
keys -> test with an S3 client against the endpoint" is test_master_credentials_write_and_read:
it uses the keys the master's service really gets (its 0600 environment file, read over SSH),
not the ones cluster.yaml says it should have.

Secret values never reach an assertion message: comparisons are made into booleans first,
because pytest prints both sides of a failed `==`.
"""

import contextlib
import datetime
import io
import urllib.error
import urllib.request
import uuid

import pytest
import yaml
from minio import Minio
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin

from deploy import minio_iam, s3

ENV_FILES = {
    "storage": ("/etc/default/minio",),
    "master": ("/etc/determined/master.yaml", "/etc/determined/master-s3.env"),
}


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=value / KEY="value" lines as systemd's EnvironmentFile= reads them (the subset the
    deploy writes: one line per variable, double quotes with \\" \\\\ \\` \\$ escapes)."""
    values = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, raw = line.split("=", 1)
        if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
            out, chars = [], iter(raw[1:-1])
            for c in chars:
                if c == "\\":
                    nxt = next(chars, "")
                    out.append(nxt if nxt in '"\\`$' else "\\" + nxt)
                else:
                    out.append(c)
            values[key.strip()] = "".join(out)
        else:
            values[key.strip()] = raw.strip()
    return values


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_minio_service(storage, host_of):
    h = host_of(storage)
    service = h.service("minio")
    assert service.is_enabled and service.is_running
    binary = h.file("/usr/local/bin/minio")
    assert binary.user == "root" and binary.mode == 0o755
    assert h.user("minio-user").exists


def test_minio_ready_from_controller(storage, cluster):
    url = f"http://{storage.address}:{cluster.storage.port}/minio/health/ready"
    assert _get(url) == 200, f"{url}: MinIO is not ready (journalctl -u minio on {storage.hostname})"


def test_minio_ready_on_node(storage, host_of, cluster):
    code = host_of(storage).check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{cluster.storage.port}/minio/health/ready"
    )
    assert code == "200"


def test_minio_site_region_matches(storage, host_of, cluster):
    # Legacy MINIO_REGION would win over MINIO_SITE_REGION: it must not say something else.
    env = parse_env_file(host_of(storage).file("/etc/default/minio").content_string)
    assert env.get("MINIO_SITE_REGION") == cluster.storage.region
    assert env.get("MINIO_REGION", cluster.storage.region) == cluster.storage.region


def test_bucket_exists_in_region(cluster):
    problem = s3.bucket_problem(cluster)
    assert problem is None, problem


@pytest.fixture(scope="session")
def master_s3_env(cluster, host_of):
    """The S3 variables determined-master.service gets from its drop-in environment file."""
    h = host_of(cluster.master_node)
    drop_in = h.file("/etc/systemd/system/determined-master.service.d/10-s3.conf")
    assert "EnvironmentFile=/etc/determined/master-s3.env" in drop_in.content_string
    return parse_env_file(h.file("/etc/determined/master-s3.env").content_string)


def _client(cluster, access_key, secret_key, region) -> Minio:
    return Minio(
        s3.endpoint(cluster), access_key=access_key, secret_key=secret_key, region=region, secure=False
    )


def test_master_env_has_region_and_keys(master_s3_env, cluster, host_of):
    assert sorted(master_s3_env) == ["AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION", "AWS_SECRET_ACCESS_KEY"]
    assert master_s3_env["AWS_DEFAULT_REGION"] == cluster.storage.region
    # The master downloads checkpoints with the AWS default credential chain: the variables
    # must be in the running process, not only in the file. Only names and the region shown.
    h = host_of(cluster.master_node)
    pid = h.check_output("systemctl show -p MainPID --value determined-master")
    lines = h.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ | grep '^AWS_' || true")
    process = dict(line.split("=", 1) for line in lines.splitlines() if "=" in line)
    same = all(process.get(k) == v for k, v in master_s3_env.items())
    assert same, (
        f"determined-master (pid {pid}) runs without master-s3.env's values "
        f"(it has {sorted(process)}): restart it"
    )


def test_master_credentials_write_and_read(master_s3_env, cluster):
    client = _client(
        cluster,
        master_s3_env["AWS_ACCESS_KEY_ID"],
        master_s3_env["AWS_SECRET_ACCESS_KEY"],
        master_s3_env["AWS_DEFAULT_REGION"],
    )
    prefix = (cluster.storage.prefix or "").strip("/")
    key = "/".join(p for p in (prefix, "verify", f"{uuid.uuid4().hex}.txt") if p)
    payload = f"written by tests/verify/test_storage.py as {key}".encode()
    try:
        client.put_object(cluster.storage.bucket, key, io.BytesIO(payload), len(payload))
        response = client.get_object(cluster.storage.bucket, key)
        try:
            assert response.read() == payload
        finally:
            response.close()
            response.release_conn()
    except S3Error as e:
        pytest.fail(f"the master's keys cannot write and read {cluster.storage.bucket}: {e.code}")
    finally:
        with contextlib.suppress(S3Error):
            client.remove_object(cluster.storage.bucket, key)


def test_master_keys_are_determined_user_not_root(master_s3_env, cluster, host_of):
    """master.yaml's checkpoint_storage (what trials get) and master-s3.env hold the scoped user."""
    h = host_of(cluster.master_node)
    config = yaml.safe_load(h.file("/etc/determined/master.yaml").content_string) or {}
    storage = config.get("checkpoint_storage") or {}
    root = cluster.storage.access_key.value, cluster.storage.secret_key.value
    yaml_is_root = storage.get("access_key") == root[0] or storage.get("secret_key") == root[1]
    env_is_root = master_s3_env.get("AWS_ACCESS_KEY_ID") == root[0] or (
        master_s3_env.get("AWS_SECRET_ACCESS_KEY") == root[1]
    )
    assert not yaml_is_root, "master.yaml's checkpoint_storage holds MinIO's root keys: every trial has them"
    assert not env_is_root, "master-s3.env holds MinIO's root keys"
    user = cluster.storage.determined_user
    assert storage.get("access_key") == user, f"master.yaml's checkpoint_storage.access_key is not {user}"
    assert master_s3_env.get("AWS_ACCESS_KEY_ID") == user, f"master-s3.env's AWS_ACCESS_KEY_ID is not {user}"


def test_determined_user_and_policy_as_deployed(cluster):
    """The deploy's own reading through the admin API (root keys): nothing left to repair."""
    try:
        problems = minio_iam.read_state(cluster).problems
    except minio_iam.IamError as e:
        problems = [str(e)]
    assert not problems, "; ".join(problems)


def test_master_keys_confined_to_the_bucket(master_s3_env, cluster):
    """The keys trials hold cannot create buckets, touch another bucket, see other buckets
    or use the admin API (put/get/delete in the bucket: test_master_credentials_write_and_read)."""
    key, secret, region = (
        master_s3_env["AWS_ACCESS_KEY_ID"],
        master_s3_env["AWS_SECRET_ACCESS_KEY"],
        master_s3_env["AWS_DEFAULT_REGION"],
    )
    client = _client(cluster, key, secret, region)
    other = f"verify-not-{uuid.uuid4().hex[:12]}"
    refused = {}
    for what, call in (
        ("create a bucket", lambda: client.make_bucket(other, location=region)),
        ("write to another bucket", lambda: client.put_object(other, "x", io.BytesIO(b"x"), 1)),
        ("delete the bucket", lambda: client.remove_bucket(cluster.storage.bucket)),
    ):
        try:
            call()
            refused[what] = "allowed"
        except S3Error as e:
            refused[what] = e.code
    allowed = {what: code for what, code in refused.items() if code != "AccessDenied"}
    assert not allowed, f"the trials' keys may {sorted(allowed)} ({allowed})"
    try:
        seen = sorted(b.name for b in client.list_buckets())
    except S3Error as e:
        seen = [f"refused: {e.code}"]
    # MinIO lists a user the buckets it may list (cmd/bucket-handlers.go ListBucketsHandler).
    assert seen == [cluster.storage.bucket], f"the trials' keys see buckets {seen}"
    admin = MinioAdmin(
        endpoint=s3.endpoint(cluster), credentials=StaticProvider(key, secret), region=region, secure=False
    )
    try:
        admin.policy_list()
        code = "allowed"
    except MinioAdminException as e:
        code = minio_iam.error_code(e)
    assert code == "AccessDenied", (
        f"the trials' keys may use MinIO's admin API (list-canned-policies: {code})"
    )


def test_console_listens_as_configured(storage, host_of, cluster):
    """storage.console: localhost (127.0.0.1 only), all, or disabled (nothing listening)."""
    port = cluster.storage.console_port
    lines = host_of(storage).check_output(f"ss -Htln 'sport = :{port}'").splitlines()
    local = sorted({line.split()[3].rsplit(":", 1)[0] for line in lines if len(line.split()) >= 4})
    mode = cluster.storage.console
    if mode == "disabled":
        assert not local, f"something listens on the console port {port}: {local}"
    elif mode == "localhost":
        assert local, f"nothing listens on 127.0.0.1:{port} (MinIO's console)"
        outside = [a for a in local if a not in ("127.0.0.1", "[::1]")]
        assert not outside, f"MinIO's console listens on {outside}:{port}, not only on localhost"
    else:
        assert local, f"nothing listens on the console port {port}"
        outside = [a for a in local if a not in ("127.0.0.1", "[::1]")]
        assert outside, f"MinIO's console listens on {local}:{port} only, not on every interface"


def test_wrong_secret_refused(master_s3_env, cluster):
    client = _client(
        cluster,
        master_s3_env["AWS_ACCESS_KEY_ID"],
        master_s3_env["AWS_SECRET_ACCESS_KEY"] + "-wrong",
        master_s3_env["AWS_DEFAULT_REGION"],
    )
    with pytest.raises(S3Error) as refused:
        client.bucket_exists(cluster.storage.bucket)
    assert refused.value.code in ("SignatureDoesNotMatch", "AccessDenied", "InvalidAccessKeyId")


def test_secret_files_are_0600_root(node, host_of):
    paths = [p for role, files in ENV_FILES.items() if role in node.roles for p in files]
    if not paths:
        pytest.skip(f"{node.hostname} holds no storage or master secrets")
    h = host_of(node)
    for path in paths:
        f = h.file(path)
        assert f.exists, path
        assert (f.user, f.group, f.mode) == ("root", "root", 0o600), path


def test_data_dir_is_mount_point(storage, host_of, cluster):
    """MinIO's objects on their own disk: an unmounted disk means an empty root-disk directory."""
    if cluster.storage.data_on_root_disk:
        pytest.skip("storage.data_on_root_disk: true (the root disk is intended)")
    h = host_of(storage)
    data_dir = cluster.storage.data_dir
    assert h.run(f"mountpoint -q -- {data_dir}").rc == 0, f"{data_dir} is not a mount point"
    drop_in = h.file("/etc/systemd/system/minio.service.d/10-data-mount.conf")
    assert f"AssertPathIsMountPoint={data_dir}" in drop_in.content_string


BACKUP_PREFIX = "backups/postgresql/"
# Nightly at 02:30 plus up to 30 min of random delay: a day and a margin.
BACKUP_MAX_AGE = 26 * 3600


def test_backup_timer_active(cluster, host_of):
    h = host_of(cluster.master_node)
    timer = h.service("pg-backup.timer")
    assert timer.is_enabled and timer.is_running, "pg-backup.timer is not enabled and active"
    result = h.check_output("systemctl show -p Result --value pg-backup.service")
    assert result == "success", f"the last backup run ended with {result!r} (journalctl -u pg-backup)"


def test_latest_backup_recent(master_s3_env, cluster, host_of):
    """The newest object under backups/postgresql/ is at most a day (and a margin) old."""
    client = _client(
        cluster,
        master_s3_env["AWS_ACCESS_KEY_ID"],
        master_s3_env["AWS_SECRET_ACCESS_KEY"],
        master_s3_env["AWS_DEFAULT_REGION"],
    )
    try:
        objects = list(client.list_objects(cluster.storage.bucket, prefix=BACKUP_PREFIX, recursive=True))
    except S3Error as e:  # the nightly backup signs with the same keys: it fails the same way
        pytest.fail(f"the master's keys cannot list {cluster.storage.bucket}/{BACKUP_PREFIX}: {e.code}")
    if not objects:
        h = host_of(cluster.master_node)
        last = h.check_output("systemctl show -p LastTriggerUSec --value pg-backup.timer")
        if last in ("", "n/a", "0"):
            pytest.skip("no backup yet: the timer has not elapsed since the deploy")
        pytest.fail(f"no backup under {BACKUP_PREFIX} although the timer ran ({last})")
    newest = max(o.last_modified for o in objects)
    age = (datetime.datetime.now(datetime.UTC) - newest).total_seconds()
    assert age <= BACKUP_MAX_AGE, f"newest backup is {age / 3600:.1f} h old"
