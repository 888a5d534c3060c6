"""`python -m deploy restore-drill --cluster FILE [--backup-first] [pyinfra options]`: prove that
the newest database backup restores.

It runs `pg-backup drill latest` (files/postgresql/pg-backup, installed on the master node by
roles/postgresql/backup.py) on the master node through pyinfra's own ad-hoc command, `pyinfra
-y INVENTORY --limit MASTER exec -- ...`: the deploy's SSH settings and host-key checks, and
pyinfra's output. The drill restores the dump into a scratch database (pgb_drill), compares
every table's row count with the manifest pg-backup wrote beside the dump at dump time, drops
the scratch database, and records the result in /var/lib/pg-backup/last-drill.json, which
verify's test_restore_drill_recent row reads. pg-backup-drill.timer runs the same drill every
week; this command runs one now. `--backup-first` takes a backup just before (`pg-backup backup
--reason drill`), for a cluster whose first nightly backup has not run yet.

The live database is only read (pg_dump's snapshot, row counts); the master keeps running.
Exit status: pyinfra's (non-zero when the drill failed: its reason is in pyinfra's output), 2
on bad usage.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from deploy.cluster import ClusterError, load_cluster
from deploy.rebuild import pyinfra_executable

REPO = Path(__file__).resolve().parent.parent
PROGRAM = "/usr/local/sbin/pg-backup"


def command(backup_first: bool) -> list[str]:
    drill = [PROGRAM, "drill", "latest"]
    if not backup_first:
        return drill
    # One shell line, so that no drill runs when the backup failed.
    return ["sh", "-c", f"{PROGRAM} backup --reason drill && {PROGRAM} drill latest"]


def exec_argv(inventory: str, host: str, extra: list[str], command: list[str]) -> list[str]:
    """pyinfra's ad-hoc command on one host of the inventory (also the upgrade's dump)."""
    return [pyinfra_executable(), "-y", inventory, "--limit", host, *extra, "exec", "--", *command]


def argv(inventory: str, master: str, backup_first: bool, extra: list[str]) -> list[str]:
    return exec_argv(inventory, master, extra, command(backup_first))


def main(inventory: str, cluster_file: str, backup_first: bool, extra: list[str]) -> int:
    try:
        cluster = load_cluster(cluster_file, resolve_secrets=False)
    except ClusterError as e:
        print("\n".join(e.problems), file=sys.stderr)
        return 2
    master = cluster.master_node.hostname
    line = argv(inventory, master, backup_first, extra)
    print(f"--> restore-drill: on {master}: {' '.join(line)}", file=sys.stderr, flush=True)
    return subprocess.run(line, cwd=REPO, stdin=subprocess.DEVNULL, check=False).returncode
