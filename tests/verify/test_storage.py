"""Checkpoint storage: MinIO up, the bucket in the right region, the master's keys work.

Least privilege: the keys in master.yaml and the master's environment (so in every trial) are
Determined's own MinIO user (storage.determined_user, deploy/minio_admin.py), confined to the
checkpoint bucket; MinIO's root keys are only in /etc/default/minio; the console listens
where storage.console says.

storage.tls: MinIO serves the configured certificate, which names endpoint_url's host and
chains to storage.tls.ca_certificate (a client's own handshake decides), and plain http on the
S3 port gets no S3 answer; every node trusts the CA (or holds none without one).

The article's symptom "checkpoint save fails with Permission denied -> bucket policy or wrong
keys -> test with an S3 client against the endpoint" is test_master_credentials_write_and_read:
it uses the keys the master's service really gets (its 0600 environment file, read over SSH),
not the ones cluster.yaml says it should have.

Secret values never reach an assertion message: comparisons are made into booleans first,
because pytest prints both sides of a failed `==`.
"""

import contextlib
import dataclasses
import datetime
import hashlib
import http.client
import io
import json
import re
import shlex
import socket
import ssl
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest
import urllib3
import yaml
from minio import Minio
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin

from deploy import minio_admin, minio_node, s3

ENV_FILES = {
    "storage": ("/etc/default/minio",),
    "master": ("/etc/determined/master.yaml", "/etc/determined/master-s3.env", "/etc/pg-backup/s3.env"),
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


def _get(cluster, url: str) -> int | str:
    """GET with the deploy's own pool: over https the certificate is checked by endpoint_url's
    host and against storage.tls.ca_certificate (deploy/s3.py pool)."""
    try:
        return s3.pool(cluster, retries=0).request("GET", url).status
    except urllib3.exceptions.HTTPError as e:
        return f"{type(e).__name__}: {e}"


def _scheme(cluster) -> str:
    return "https" if s3.secure(cluster) else "http"


def test_minio_service(storage, host_of):
    h = host_of(storage)
    service = h.service("minio")
    assert service.is_enabled and service.is_running
    binary = h.file("/usr/local/bin/minio")
    assert binary.user == "root" and binary.mode == 0o755
    assert h.user("minio-user").exists


def test_minio_ready_from_controller(storage, cluster):
    url = f"{_scheme(cluster)}://{storage.address}:{cluster.storage.port}/minio/health/ready"
    got = _get(cluster, url)
    assert got == 200, f"{url}: MinIO is not ready: {got} (journalctl -u minio on {storage.hostname})"


def test_minio_ready_on_node(storage, host_of, cluster):
    port = cluster.storage.port
    if s3.secure(cluster):
        # By the certificate's name, checked against the node's system store (roles/minio/tls.py).
        name = urlsplit(cluster.storage.endpoint_url).hostname
        where = f"--resolve {shlex.quote(f'{name}:{port}:127.0.0.1')} https://{name}:{port}"
    else:
        where = f"http://127.0.0.1:{port}"
    code = host_of(storage).check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' {where}/minio/health/ready"
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
        s3.endpoint(cluster),
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        secure=s3.secure(cluster),
        http_client=s3.pool(cluster),
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
    """The deploy's own reading through the admin API (root keys): nothing left to repair, for
    Determined's user and for pg-backup's (storage.backup_user)."""
    problems = []
    for user in minio_admin.users(cluster.storage):
        try:
            problems += minio_admin.read_state(cluster, user).problems
        except minio_admin.IamError as e:
            problems.append(str(e))
    assert not problems, "; ".join(problems)


def test_master_keys_confined_to_the_bucket(master_s3_env, cluster):
    """The keys trials hold cannot create buckets, touch another bucket, see other buckets,
    list, read or delete the database backups (harmless if allowed: nothing is written there),
    or use the admin API (put/get/delete in the bucket: test_master_credentials_write_and_read)."""
    key, secret, region = (
        master_s3_env["AWS_ACCESS_KEY_ID"],
        master_s3_env["AWS_SECRET_ACCESS_KEY"],
        master_s3_env["AWS_DEFAULT_REGION"],
    )
    client = _client(cluster, key, secret, region)
    other = f"verify-not-{uuid.uuid4().hex[:12]}"
    refused: dict[str, str | None] = {}  # S3Error.code may be None: then it counts as allowed
    for what, call in (
        ("create a bucket", lambda: client.make_bucket(other, location=region)),
        ("write to another bucket", lambda: client.put_object(other, "x", io.BytesIO(b"x"), 1)),
        ("delete the bucket", lambda: client.remove_bucket(cluster.storage.bucket)),
        ("list the backups", lambda: list(client.list_objects(cluster.storage.bucket, prefix=BACKUP_PREFIX))),
        ("read a backup", lambda: client.stat_object(cluster.storage.bucket, f"{BACKUP_PREFIX}verify-none")),
        (
            "delete a backup",
            lambda: client.remove_object(cluster.storage.bucket, f"{BACKUP_PREFIX}verify-none"),
        ),
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
        endpoint=s3.endpoint(cluster),
        credentials=StaticProvider(key, secret),
        region=region,
        secure=s3.secure(cluster),
        http_client=s3.pool(cluster),
    )
    try:
        admin.policy_list()
        code = "allowed"
    except MinioAdminException as e:
        code = minio_admin.error_code(e)
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
    assert h.run(f"mountpoint -q -- {shlex.quote(data_dir)}").rc == 0, f"{data_dir} is not a mount point"
    drop_in = h.file("/etc/systemd/system/minio.service.d/10-data-mount.conf")
    assert f"AssertPathIsMountPoint={data_dir}" in drop_in.content_string


BACKUP_PREFIX = "backups/postgresql/"
# Nightly (docs/operations.md: 02:30 plus up to 30 min of random delay): a day, the delay and
# the run's own time. A product promise, not read from the deployed timer: a timer changed to
# weekly would otherwise verify itself.
BACKUP_MAX_AGE = datetime.timedelta(hours=26)
# How long after its due time (NextElapseUSecRealtime, the random delay included) a first run
# may still be going before "has not run" is a finding: pg_dump and the upload take minutes.
FIRST_RUN_GRACE = datetime.timedelta(hours=1)
SERVICE_PROPERTIES = (
    "ActiveState",
    "Result",
    "ExecMainStatus",
    "ExecMainStartTimestamp",
    "ExecMainExitTimestamp",
)
TIMER_PROPERTIES = ("NextElapseUSecRealtime",)


def test_backup_timer_active(cluster, host_of):
    h = host_of(cluster.master_node)
    timer = h.service("pg-backup.timer")
    assert timer.is_enabled and timer.is_running, "pg-backup.timer is not enabled and active"
    result = h.check_output("systemctl show -p Result --value pg-backup.service")
    assert result == "success", f"the last backup run ended with {result!r} (journalctl -u pg-backup)"


def systemd_properties(text: str) -> dict[str, str]:
    """`systemctl show -p NAME...` output: NAME=value lines (a value may hold '=')."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def systemd_time(value: str) -> datetime.datetime | None:
    """A timestamp as `TZ=UTC systemctl show` prints it ("Tue 2026-12-01 02:41:12 UTC": systemd's
    format_timestamp, English weekday whatever the locale); None when unset ("", "n/a", "0").
    A zone other than UTC raises: the command sets TZ=UTC, so anything else is misread."""
    value = value.strip()
    if value in ("", "n/a", "0"):
        return None
    parts = value.split()
    if len(parts) != 4 or parts[3] != "UTC":
        raise ValueError(f"not a systemd UTC timestamp: {value!r}")
    stamp = datetime.datetime.strptime(f"{parts[1]} {parts[2]}", "%Y-%m-%d %H:%M:%S")
    return stamp.replace(tzinfo=datetime.UTC)


# systemd's own lines about a unit in `journalctl -u UNIT -o cat`: not the program's words.
_SYSTEMD_LINE = re.compile(r"^(pg-backup\.service: |Starting |Started |Finished |Failed to start |Stopped )")


def last_error_line(journal: str) -> str:
    """What the last run said last (its error, for a run that failed): the last line of the
    program's own output after systemd's last "Starting ..." line, else systemd's own line on
    how it ended ("Main process exited, code=exited, status=1/FAILURE"), else ""."""
    lines = [line.strip() for line in journal.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Starting ")]
    run = lines[starts[-1] + 1 :] if starts else lines
    own = [line for line in run if not _SYSTEMD_LINE.match(line)]
    ended = [line for line in run if "Main process exited" in line or "Failed with result" in line]
    return (own or ended or [""])[-1]


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str  # "pass", "skip" or "fail"
    message: str


def _at(stamp: datetime.datetime) -> str:
    return f"{stamp:%Y-%m-%d %H:%M} UTC"


def first_run_verdict(
    timer: dict[str, str],
    now: datetime.datetime,
    *,
    unscheduled: str,
    pending: Callable[[str], str],
    overdue: Callable[[str], str],
) -> Verdict:
    """For a timer's service that has not run yet (the backup, the restore drill): FAIL when the
    timer schedules no run, skip until its next elapse (FIRST_RUN_GRACE after it), FAIL from
    then on. `pending` and `overdue` get that elapse as text."""
    due = systemd_time(timer.get("NextElapseUSecRealtime", ""))
    if due is None:
        return Verdict("fail", unscheduled)
    if now < due + FIRST_RUN_GRACE:
        return Verdict("skip", pending(_at(due)))
    return Verdict("fail", overdue(_at(due)))


def backup_verdict(
    service: dict[str, str],
    timer: dict[str, str],
    newest: datetime.datetime | None,
    now: datetime.datetime,
    journal: str = "",
) -> Verdict:
    """Whether the database backups are as recent as the nightly schedule promises.

    From pg-backup.service's own record of its last run (ExecMain*, Result), never from the
    timer's LastTriggerUSec: a Persistent= timer stamps its file when first started (systemd
    src/core/timer.c timer_start touches the stamp file, and reads its time back at the next
    start), so right after the deploy it says "triggered" although the service never ran.
    - the last run failed: FAIL with what its journal said last;
    - the newest backup is at most BACKUP_MAX_AGE old: pass;
    - else, a run in progress: skip (its result decides next time);
    - else, no run yet (ExecMainStartTimestamp unset: none since the deploy or the boot): skip
      until the timer's next elapse (FIRST_RUN_GRACE after it), FAIL from then on;
    - else it ran and succeeded, and still no recent backup: FAIL."""
    started = systemd_time(service.get("ExecMainStartTimestamp", ""))
    ended = systemd_time(service.get("ExecMainExitTimestamp", ""))
    running = service.get("ActiveState") in ("activating", "deactivating", "reloading")
    result, status = service.get("Result", ""), service.get("ExecMainStatus", "")
    if not running and (result not in ("", "success") or (started and status not in ("", "0"))):
        if started:
            when = f"started {_at(started)}" + (f", ended {_at(ended)}" if ended else "")
            how = f"result {result}, exit status {status}"
        else:  # refused before its process started (Result=resources: a file it needs is gone)
            when, how = "it did not start", f"result {result}"
        said = last_error_line(journal) or "nothing in its journal"
        return Verdict("fail", f"the last run of pg-backup.service failed ({when}; {how}): {said}")
    age = now - newest if newest is not None else None
    if age is not None and age <= BACKUP_MAX_AGE:
        return Verdict("pass", f"newest backup {age.total_seconds() / 3600:.1f} h old")
    what = (
        f"no backup under {BACKUP_PREFIX}"
        if age is None
        else f"newest backup is {age.total_seconds() / 3600:.1f} h old "
        f"(at most {BACKUP_MAX_AGE.total_seconds() / 3600:g} h: nightly)"
    )
    if running:
        since = f" since {_at(started)}" if started else ""
        return Verdict("skip", f"{what}; pg-backup.service is running{since}: its result decides")
    if started is None:
        return first_run_verdict(
            timer,
            now,
            unscheduled=f"{what}; pg-backup.service has not run and pg-backup.timer schedules no run",
            pending=lambda due: f"{what} yet: pg-backup.service has not run, its first run is due {due}",
            overdue=lambda due: (
                f"{what}; pg-backup.service has not run although pg-backup.timer was due {due}"
            ),
        )
    last = f"{_at(started)} to {_at(ended)}" if ended else _at(started)
    return Verdict("fail", f"{what} although pg-backup.service last ran {last} and succeeded")


def test_latest_backup_recent(cluster, host_of):
    """The newest object under backups/postgresql/ is at most a day (and a margin) old, listed
    with pg-backup's own keys (its 0600 file on the master, storage.backup_user), judged with
    what systemd says of pg-backup.service's last run (backup_verdict)."""
    h = host_of(cluster.master_node)
    keys = parse_env_file(h.file("/etc/pg-backup/s3.env").content_string)
    client = _client(
        cluster,
        keys.get("AWS_ACCESS_KEY_ID", ""),
        keys.get("AWS_SECRET_ACCESS_KEY", ""),
        cluster.storage.region,
    )
    try:
        objects = list(client.list_objects(cluster.storage.bucket, prefix=BACKUP_PREFIX, recursive=True))
    except S3Error as e:  # the nightly backup signs with the same keys: it fails the same way
        pytest.fail(f"pg-backup's keys cannot list {cluster.storage.bucket}/{BACKUP_PREFIX}: {e.code}")

    def show(unit: str, names: tuple[str, ...]) -> dict[str, str]:
        # TZ=UTC: timestamps in one zone systemd_time reads, whatever the node's own.
        flags = " ".join(f"-p {name}" for name in names)
        return systemd_properties(h.check_output(f"TZ=UTC LC_ALL=C systemctl show {flags} {unit}"))

    verdict = backup_verdict(
        show("pg-backup.service", SERVICE_PROPERTIES),
        show("pg-backup.timer", TIMER_PROPERTIES),
        max((o.last_modified for o in objects if o.last_modified), default=None),
        # The master's clock, the one its timer and its service's timestamps run on.
        datetime.datetime.fromtimestamp(int(h.check_output("date +%s")), datetime.UTC),
        h.run("journalctl -u pg-backup.service -n 50 --no-pager -o cat").stdout,
    )
    if verdict.outcome == "skip":
        pytest.skip(verdict.message)
    assert verdict.outcome == "pass", verdict.message


LAST_DRILL = "/var/lib/pg-backup/last-drill.json"  # files/postgresql/pg-backup writes it
# pg-backup-drill.timer runs weekly (with up to 30 min of random delay): a day of margin.
DRILL_MAX_AGE = datetime.timedelta(days=8)


def drill_verdict(text: str | None, timer: dict[str, str], now: datetime.datetime) -> Verdict:
    """Whether the newest backup was proven to restore lately, from pg-backup's own record of its
    last drill (`text`: the file's content, None when there is none):
    - none yet: skip until pg-backup-drill.timer's next elapse (FIRST_RUN_GRACE after it), FAIL
      from then on, and FAIL when the timer schedules no drill;
    - the last drill failed: FAIL with what it found;
    - it passed at most DRILL_MAX_AGE ago: pass; older: FAIL."""
    now_text = "`python -m deploy restore-drill --cluster FILE` runs one now"
    if text is None:
        return first_run_verdict(
            timer,
            now,
            unscheduled=f"no restore drill yet, and pg-backup-drill.timer schedules none; {now_text}",
            pending=lambda due: f"no restore drill yet: the first is due {due}; {now_text}",
            overdue=lambda due: f"no restore drill although pg-backup-drill.timer was due {due}; {now_text}",
        )
    try:
        record = json.loads(text)
        when = datetime.datetime.strptime(record["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
        ok, key = record["ok"] is True, str(record["key"])
    except (ValueError, KeyError, TypeError):
        return Verdict("fail", f"{LAST_DRILL} is not a drill record pg-backup wrote; {now_text}")
    if not ok:
        found = "; ".join(str(p) for p in record.get("problems") or []) or "no reason recorded"
        return Verdict("fail", f"the restore drill of {key} at {_at(when)} failed: {found}")
    age = now - when
    if age > DRILL_MAX_AGE:
        return Verdict(
            "fail",
            f"the last restore drill ({key}) is {age.days} days old (weekly, at most "
            f"{DRILL_MAX_AGE.days}); {now_text}",
        )
    return Verdict(
        "pass",
        f"{key} restored {age.total_seconds() / 3600:.1f} h ago: {record.get('tables')} tables, "
        f"{record.get('rows')} rows as at dump time",
    )


def test_restore_drill_recent(cluster, host_of):
    """The newest backup restores: the last drill (pg-backup drill, weekly from
    pg-backup-drill.timer or `python -m deploy restore-drill`) passed, at most a week and a day
    ago, judged by drill_verdict on the master's clock."""
    h = host_of(cluster.master_node)
    record = h.file(LAST_DRILL)
    timer = systemd_properties(
        h.check_output(f"TZ=UTC LC_ALL=C systemctl show -p {TIMER_PROPERTIES[0]} pg-backup-drill.timer")
    )
    verdict = drill_verdict(
        record.content_string if record.exists else None,
        timer,
        datetime.datetime.fromtimestamp(int(h.check_output("date +%s")), datetime.UTC),
    )
    if verdict.outcome == "skip":
        pytest.skip(verdict.message)
    assert verdict.outcome == "pass", verdict.message


# --- storage.tls ---------------------------------------------------------------------------


def test_minio_serves_the_configured_certificate(storage, cluster):
    """A client's own handshake: the certificate names endpoint_url's host and chains to
    storage.tls.ca_certificate (else the controller's system store), and it is the one
    cluster.yaml names (not one left from before)."""
    tls = cluster.storage.tls
    if not tls.enabled:
        pytest.skip("storage.tls is not set: MinIO serves plain http")
    name = urlsplit(cluster.storage.endpoint_url).hostname
    context = ssl.create_default_context(cadata=tls.ca_certificate.text if tls.ca_certificate else None)
    try:
        with (
            socket.create_connection((str(storage.address), cluster.storage.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=name) as conn,
        ):
            served = conn.getpeercert(binary_form=True) or b""
    except (ssl.SSLError, OSError) as e:
        pytest.fail(f"no TLS session with MinIO at {storage.address}:{cluster.storage.port} as {name}: {e}")
    configured = ssl.PEM_cert_to_DER_cert(
        tls.certificate.text.split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
    )
    assert hashlib.sha256(served).digest() == hashlib.sha256(configured).digest(), (
        "MinIO serves another certificate than storage.tls.certificate"
    )


def test_minio_serves_no_plain_http(storage, cluster):
    if not cluster.storage.tls.enabled:
        pytest.skip("storage.tls is not set: plain http is MinIO's protocol")
    conn = http.client.HTTPConnection(str(storage.address), cluster.storage.port, timeout=10)
    try:
        conn.request("GET", "/minio/health/ready")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException):
        status = None  # the connection dropped: no plain http either
    finally:
        conn.close()
    assert status != 200, f"MinIO answers plain http on {storage.address}:{cluster.storage.port}"


def test_minio_certs_as_configured(storage, host_of, cluster):
    """public.crt (the configured certificates) and private.key (0600 minio-user) in the certs
    directory with storage.tls; without it no directory: MinIO, started without --certs-dir,
    would not read it (cmd/config-dir.go getDefaultCertsDir: ${HOME}/.minio/certs), but a
    stale copy of the private key has no business on the node."""
    h = host_of(storage)
    tls = cluster.storage.tls
    certs = h.file(minio_node.CERTS_DIR)
    if not tls.enabled:
        assert not certs.exists, f"{minio_node.CERTS_DIR} exists without storage.tls: a stale private key"
        return
    public, private = (
        h.file(f"{minio_node.CERTS_DIR}/public.crt"),
        h.file(f"{minio_node.CERTS_DIR}/private.key"),
    )
    assert public.exists and public.content_string == tls.certificate.text, (
        "public.crt is not storage.tls.certificate"
    )
    assert (private.user, private.mode) == (minio_node.USER, 0o600), "private.key is not 0600 minio-user"


def test_storage_ca_trusted(node, host_of, cluster):
    """storage.tls.ca_certificate in the node's system store (the master's Go runtime,
    pg-backup's Python, and the file trial containers mount), or not there without one."""
    h = host_of(node)
    ca = cluster.storage.tls.ca_certificate
    copy = h.file(minio_node.SYSTEM_CA)
    if ca is None:
        assert not copy.exists, f"{minio_node.SYSTEM_CA} is left without storage.tls.ca_certificate"
        return
    assert copy.exists and copy.content_string == ca.text, f"{minio_node.SYSTEM_CA} is not the configured CA"
    # update-ca-certificates(8) appends each certificate to the bundle: compare without line ends.
    bundle = "".join(h.file("/etc/ssl/certs/ca-certificates.crt").content_string.split())
    first = "".join(ca.text.split("-----END CERTIFICATE-----")[0].split())
    assert first in bundle, "the CA is not in /etc/ssl/certs/ca-certificates.crt: update-ca-certificates"
