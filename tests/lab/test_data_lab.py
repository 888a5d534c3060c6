"""Data safety on the lab: an unmounted data disk is refused, and a database restore works.

- The storage node's data disk unmounted (the lab bind-mounts it at storage.data_dir; the test
  moves that mount aside inside the node and puts it back): MinIO's unit refuses to start
  (AssertPathIsMountPoint=), and a deploy refuses the storage node alone with preflight's
  message naming the node, the path and both ways out.
- The restore rehearsal: a marker table, a backup by the nightly service, a restore drill
  through the front door (`python -m deploy restore-drill`: the dump restored into a scratch
  database and checked against its manifest, the scratch database dropped) and verify's drill
  row green, then the table dropped, `pg-backup restore latest`: the table is back and the
  master answers /health.
"""

import json
import subprocess
import sys
import time

from roles.postgresql.backup import PREFIX

from .conftest import LAB_CLUSTER, run_verify
from .paths import REPO

ASIDE = "/run/dtlab-data-aside"
MARKER = "dtlab_restore_marker"


def _failed_hosts(run) -> set[str]:
    return {h for op in run.results.get("operations", []) for h in op.get("error", [])}


def test_unmounted_data_disk_refused(deployed, deploy, lab_ssh, lab):
    node = lab.storage_node.hostname
    data_dir = lab.storage.data_dir
    assert lab_ssh(node, f"mountpoint -q {data_dir}", check=False).returncode == 0
    lab_ssh(
        node,
        f"systemctl stop minio && mkdir -p {ASIDE} && mount --bind {data_dir} {ASIDE} && umount {data_dir}",
    )
    try:
        assert lab_ssh(node, f"mountpoint -q {data_dir}", check=False).returncode != 0
        start = lab_ssh(node, "systemctl start minio", check=False)
        assert start.returncode != 0, "MinIO started without its data mount"
        status = lab_ssh(node, "systemctl status minio --no-pager", check=False).stdout
        assert f"AssertPathIsMountPoint={data_dir} was not met" in status, status

        run = deploy()
        output = run.stdout + run.stderr
        assert run.returncode != 0
        assert f"preflight failed on {node}: storage.data_dir {data_dir} is not a mount point" in output
        assert f"mount the data disk at {data_dir}" in output
        assert "storage.data_on_root_disk: true" in output
        for other in (n.hostname for n in lab.nodes if n.hostname != node):
            assert f"preflight failed on {other}" not in output
        assert _failed_hosts(run) == {node}, json.dumps(run.results.get("totals"))
    finally:
        lab_ssh(
            node,
            f"mountpoint -q {data_dir} || mount --bind {ASIDE} {data_dir}; "
            f"umount {ASIDE}; rmdir {ASIDE}; systemctl reset-failed minio; systemctl start minio",
        )
    again = deploy(limit=node)
    assert again.returncode == 0, again.stderr[-3000:]


def _psql(lab_ssh, node, sql, check=True):
    return lab_ssh(
        node, f'runuser -u postgres -- psql -v ON_ERROR_STOP=1 -d determined -tAc "{sql}"', check=check
    )


def test_restore_rehearsal(deployed, lab_ssh, lab):
    node = lab.master_node.hostname
    _psql(lab_ssh, node, f"DROP TABLE IF EXISTS {MARKER}; CREATE TABLE {MARKER} (note text)")
    _psql(lab_ssh, node, f"INSERT INTO {MARKER} VALUES ('before the backup')")
    try:
        # The nightly service itself, as the timer starts it (oneshot: returns when done).
        lab_ssh(node, "systemctl start pg-backup.service")
        journal = lab_ssh(node, "journalctl -u pg-backup --no-pager -n 20").stdout
        assert "backed up determined" in journal, journal
        listed = lab_ssh(node, "pg-backup list").stdout.split()
        assert listed and all(k.startswith(PREFIX) for k in listed), listed
        assert len(listed) <= lab.database.backup_keep

        drill = subprocess.run(
            [sys.executable, "-m", "deploy", "restore-drill", "--cluster", str(LAB_CLUSTER)],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        said = drill.stdout + drill.stderr
        assert drill.returncode == 0 and f"drill ok: {listed[-1]}" in said, said[-3000:]
        record = json.loads(lab_ssh(node, "cat /var/lib/pg-backup/last-drill.json").stdout)
        assert record["ok"] is True and record["key"] == listed[-1] and record["tables"] >= 1, record
        gone = _psql(lab_ssh, node, "SELECT count(*) FROM pg_database WHERE datname = 'pgb_drill'")
        assert gone.stdout.strip() == "0"
        row = run_verify("-k", "test_restore_drill_recent", "-rA")
        assert row.returncode == 0 and "PASSED" in row.stdout, row.stdout[-3000:]
        print(f"restore drill: {record}")

        _psql(lab_ssh, node, f"DROP TABLE {MARKER}")
        assert _psql(lab_ssh, node, f"SELECT note FROM {MARKER}", check=False).returncode != 0

        restored = lab_ssh(node, "pg-backup restore latest")
        assert f"from s3://{lab.storage.bucket}/{listed[-1]}" in restored.stdout, restored.stdout
        assert _psql(lab_ssh, node, f"SELECT note FROM {MARKER}").stdout.strip() == "before the backup"

        health = f"curl -fsS -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{lab.master_port}/health"
        for _ in range(60):
            if lab_ssh(node, health, check=False).stdout == "200":
                break
            time.sleep(1)
        else:
            raise AssertionError("the master did not answer /health after the restore")
    finally:
        _psql(lab_ssh, node, f"DROP TABLE IF EXISTS {MARKER}", check=False)
