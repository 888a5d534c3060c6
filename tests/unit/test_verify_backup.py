"""test_latest_backup_recent's decision (tests/verify/test_storage.py backup_verdict): the text
`TZ=UTC systemctl show -p ...` prints for pg-backup.service and pg-backup.timer, the newest
backup's time and the master's clock -> pass, skip or fail, and why. No node, no lab."""

import datetime
import json

import pytest

from tests.verify.test_storage import (
    BACKUP_MAX_AGE,
    FIRST_RUN_GRACE,
    backup_verdict,
    drill_verdict,
    last_error_line,
    systemd_properties,
    systemd_time,
)

NOW = datetime.datetime(2026, 11, 30, 22, 4, 0, tzinfo=datetime.UTC)

# pg-backup.service as systemctl show prints it: never run in this boot (ExecMain* unset; newer
# systemd prints nothing, older "n/a"), one that succeeded, one that failed, one running now.
NEVER_RAN = """ActiveState=inactive
Result=success
ExecMainStatus=0
ExecMainStartTimestamp=
ExecMainExitTimestamp=
"""
NEVER_RAN_OLD_SYSTEMD = NEVER_RAN.replace("Timestamp=\n", "Timestamp=n/a\n")
SUCCEEDED = """ActiveState=inactive
Result=success
ExecMainStatus=0
ExecMainStartTimestamp=Mon 2026-11-30 02:41:12 UTC
ExecMainExitTimestamp=Mon 2026-11-30 02:41:19 UTC
"""
FAILED = """ActiveState=failed
Result=exit-code
ExecMainStatus=1
ExecMainStartTimestamp=Mon 2026-11-30 02:41:12 UTC
ExecMainExitTimestamp=Mon 2026-11-30 02:41:13 UTC
"""
RUNNING = """ActiveState=activating
Result=success
ExecMainStatus=0
ExecMainStartTimestamp=Mon 2026-11-30 22:03:30 UTC
ExecMainExitTimestamp=
"""
# An EnvironmentFile= gone missing: the unit fails before its process starts.
DID_NOT_START = NEVER_RAN.replace("ActiveState=inactive", "ActiveState=failed").replace(
    "Result=success", "Result=resources"
)

# pg-backup.timer: the deploy at 21:49 started it; the first run is due tonight.
DUE_TONIGHT = "NextElapseUSecRealtime=Tue 2026-12-01 02:47:33 UTC\n"
WAS_DUE = "NextElapseUSecRealtime=Mon 2026-11-30 20:30:00 UTC\n"  # > FIRST_RUN_GRACE ago
NOTHING_SCHEDULED = "NextElapseUSecRealtime=\n"

JOURNAL_FAILED = """Starting pg-backup.service - Back up Determined's PostgreSQL database into MinIO...
backed up determined (81234 bytes) to s3://checkpoints/backups/postgresql/determined-1-nightly.dump
pg-backup.service: Deactivated successfully.
Finished pg-backup.service - Back up Determined's PostgreSQL database into MinIO.
Starting pg-backup.service - Back up Determined's PostgreSQL database into MinIO...
pg-backup: PUT backups/postgresql/determined-2-nightly.dump: HTTP 403 AccessDenied
pg-backup.service: Main process exited, code=exited, status=1/FAILURE
pg-backup.service: Failed with result 'exit-code'.
Failed to start pg-backup.service - Back up Determined's PostgreSQL database into MinIO.
"""


def hours_ago(hours: float) -> datetime.datetime:
    return NOW - datetime.timedelta(hours=hours)


CASES = [
    # (id, service, timer, newest backup, journal, outcome, words in the message)
    # The incident: deployed at 21:49, the timer's Persistent= stamp says 21:49, nothing ran.
    (
        "deployed-15-min-ago",
        NEVER_RAN,
        DUE_TONIGHT,
        None,
        "",
        "skip",
        "first run is due 2026-12-01 02:47 UTC",
    ),
    ("older-systemd-n/a", NEVER_RAN_OLD_SYSTEMD, DUE_TONIGHT, None, "", "skip", "has not run"),
    # A rebuilt master: the bucket kept last week's backups, its own timer has not fired yet.
    ("rebuilt-master", NEVER_RAN, DUE_TONIGHT, hours_ago(80), "", "skip", "80.0 h old"),
    ("first-run-overdue", NEVER_RAN, WAS_DUE, None, "", "fail", "was due 2026-11-30 20:30 UTC"),
    ("no-run-scheduled", NEVER_RAN, NOTHING_SCHEDULED, None, "", "fail", "schedules no run"),
    ("recent", SUCCEEDED, DUE_TONIGHT, hours_ago(19.4), "", "pass", "19.4 h old"),
    # A backup the deploy took (before-<version>) counts though the service never ran.
    ("recent-from-the-deploy", NEVER_RAN, DUE_TONIGHT, hours_ago(0.2), "", "pass", "0.2 h old"),
    (
        "last-run-failed",
        FAILED,
        DUE_TONIGHT,
        hours_ago(43),
        JOURNAL_FAILED,
        "fail",
        "result exit-code, exit status 1): pg-backup: PUT backups/postgresql/determined-2-nightly.dump: "
        "HTTP 403 AccessDenied",
    ),
    # A failed run is a finding even while an older backup is still within the day.
    ("failed-but-recent-object", FAILED, DUE_TONIGHT, hours_ago(2), JOURNAL_FAILED, "fail", "HTTP 403"),
    (
        "failed-before-start",
        DID_NOT_START,
        DUE_TONIGHT,
        None,
        "",
        "fail",
        "it did not start; result resources",
    ),
    ("stale", SUCCEEDED, DUE_TONIGHT, hours_ago(27), "", "fail", "27.0 h old (at most 26 h"),
    (
        "ran-but-no-object",
        SUCCEEDED,
        DUE_TONIGHT,
        None,
        "",
        "fail",
        "last ran 2026-11-30 02:41 UTC to 2026-11-30 02:41 UTC and succeeded",
    ),
    ("running-first", RUNNING, DUE_TONIGHT, None, "", "skip", "running since 2026-11-30 22:03 UTC"),
]


@pytest.mark.parametrize(
    ("service", "timer", "newest", "journal", "outcome", "words"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_backup_verdict(service, timer, newest, journal, outcome, words):
    verdict = backup_verdict(systemd_properties(service), systemd_properties(timer), newest, NOW, journal)
    assert (verdict.outcome, words in verdict.message) == (outcome, True), verdict.message


def test_the_bounds_are_inclusive_and_the_grace_counts():
    assert backup_verdict(systemd_properties(SUCCEEDED), {}, NOW - BACKUP_MAX_AGE, NOW).outcome == "pass"
    due = NOW - FIRST_RUN_GRACE + datetime.timedelta(minutes=1)
    timer = {"NextElapseUSecRealtime": f"{due:%a %Y-%m-%d %H:%M:%S} UTC"}
    assert backup_verdict(systemd_properties(NEVER_RAN), timer, None, NOW).outcome == "skip"


def test_systemd_time_reads_only_utc():
    assert systemd_time("Tue 2026-12-01 02:47:33 UTC") == datetime.datetime(
        2026, 12, 1, 2, 47, 33, tzinfo=datetime.UTC
    )
    assert systemd_time("") is systemd_time("n/a") is systemd_time("0") is None
    with pytest.raises(ValueError, match="not a systemd UTC timestamp"):
        systemd_time("Tue 2026-12-01 03:47:33 CET")  # TZ=UTC was not honoured: say so


def test_last_error_line_is_the_last_runs():
    assert last_error_line(JOURNAL_FAILED).startswith("pg-backup: PUT ")
    silent = "Starting x...\npg-backup.service: Main process exited, code=exited, status=2/INVALIDARGUMENT\n"
    assert (
        last_error_line(silent)
        == "pg-backup.service: Main process exited, code=exited, status=2/INVALIDARGUMENT"
    )
    assert last_error_line("") == ""


# --- test_restore_drill_recent: drill_verdict -------------------------------------------------

DRILL_TIMER = "NextElapseUSecRealtime=Sun 2026-12-06 04:12:31 UTC\n"


def _drill(ok: bool = True, at: str = "2026-11-29T04:20:00Z", **more) -> str:
    record = {"key": "backups/postgresql/determined-20261129T023512Z-nightly.dump", "time": at, "ok": ok}
    record.update(tables=5, rows=14, problems=[], seconds=1.2)
    record.update(more)
    return json.dumps(record)


@pytest.mark.parametrize(
    ("text", "timer", "now", "outcome", "says"),
    [
        # Fresh deploy: no drill yet, the first due next Sunday.
        (None, DRILL_TIMER, NOW, "skip", "the first is due 2026-12-06 04:12 UTC"),
        (None, DRILL_TIMER, datetime.datetime(2026, 12, 6, 5, 30, tzinfo=datetime.UTC), "fail", "was due"),
        (None, "NextElapseUSecRealtime=\n", NOW, "fail", "schedules none"),
        (_drill(), DRILL_TIMER, NOW, "pass", "5 tables, 14 rows as at dump time"),
        (
            _drill(ok=False, problems=["table experiments: 3 rows, 12 at dump time"]),
            DRILL_TIMER,
            NOW,
            "fail",
            "failed: table experiments: 3 rows, 12 at dump time",
        ),
        (_drill(at="2026-11-20T04:00:00Z"), DRILL_TIMER, NOW, "fail", "10 days old"),
        ("{not json", DRILL_TIMER, NOW, "fail", "not a drill record"),
        (json.dumps({"ok": True}), DRILL_TIMER, NOW, "fail", "not a drill record"),
    ],
)
def test_drill_verdict(text, timer, now, outcome, says):
    verdict = drill_verdict(text, systemd_properties(timer), now)
    assert verdict.outcome == outcome and says in verdict.message, verdict
    if outcome != "pass":
        assert "python -m deploy restore-drill" in verdict.message or "failed" in verdict.message
