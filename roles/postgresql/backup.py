"""Backups of Determined's PostgreSQL database, shipped off the master into MinIO.

install:   /usr/local/sbin/pg-backup (files/postgresql/pg-backup: Python's standard library
           only, as curl's --aws-sigv4 needs curl 7.75 and Ubuntu 20.04 ships 7.68)
configure: /etc/pg-backup/pg-backup.conf (endpoint, bucket, prefix, database, how many to keep;
           no secrets) and /etc/pg-backup/s3.env (root 0600, shared_ops.secret_file: the keys
           of pg-backup's own MinIO user, storage.backup_user), both read by the program, so
           the keys are never in argv or in pyinfra's output
activate:  pg-backup.timer enabled and running: a `pg_dump -Fc` every night into
           s3://<bucket>/backups/postgresql/ with its manifest (row counts at dump time), the
           newest database.backup_keep kept; pg-backup-drill.timer: every week the newest
           backup restored into a scratch database and checked against its manifest

The backups go into the checkpoint bucket under their own prefix, signed by their own MinIO
user (deploy/minio_admin.py, made by roles/minio/iam.py): it may put, get, delete and list under
backups/postgresql/ and nothing else, and Determined's user (whose keys every trial holds) is
denied backups/ outright. So a trial can neither read a dump (password hashes, experiment
metadata) nor overwrite or delete one, and this program's keys cannot touch a checkpoint.

roles/determined/master.py calls before_version_change() right before it installs another
determined-master version, whose first start migrates the schema.
"""

from __future__ import annotations

import io

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from deploy import minio_admin
from deploy.cluster import Cluster, Node
from roles.shared.ops import SecretBytes, env_file, packages, secret_file
from roles.shared.templates import files_path

PROGRAM = "/usr/local/sbin/pg-backup"
CONF_DIR = "/etc/pg-backup"
CONF = f"{CONF_DIR}/pg-backup.conf"
S3_ENV = f"{CONF_DIR}/s3.env"  # files/postgresql/pg-backup reads the same path
UNITS = ("pg-backup.service", "pg-backup.timer", "pg-backup-drill.service", "pg-backup-drill.timer")
PREFIX = minio_admin.BACKUP_PREFIX


def conf(cluster: Cluster) -> str:
    return env_file(
        "Settings of /usr/local/sbin/pg-backup (roles/postgresql/backup.py). No secrets: the S3 keys\n"
        f"come from {S3_ENV} (root 0600).",
        {
            "PGB_ENDPOINT": cluster.storage.endpoint_url,
            "PGB_BUCKET": cluster.storage.bucket,
            "PGB_REGION": cluster.storage.region,
            "PGB_PREFIX": PREFIX,
            "PGB_DATABASE": cluster.database.name,
            "PGB_KEEP": str(cluster.database.backup_keep),
        },
    )


def s3_env(cluster: Cluster) -> str:
    storage = cluster.storage
    return env_file(
        "S3 keys of pg-backup's own MinIO user (storage.backup_user: backups/postgresql/ only),\n"
        "read by /usr/local/sbin/pg-backup (roles/postgresql/backup.py). 0600 root.",
        {
            "AWS_ACCESS_KEY_ID": storage.backup_user,
            "AWS_SECRET_ACCESS_KEY": storage.backup_secret.value,
        },
    )


def before_version_change(cluster: Cluster):
    """A backup right now when another determined-master version is installed than the pinned
    one (the new one migrates the schema at its first start); a failed backup stops the host
    before the upgrade. Nothing on a first install: there is no database to keep yet."""
    installed = host.get_fact(DebPackages).get("determined-master", ())
    version = cluster.determined.version
    if not installed or version in installed:
        return None
    return server.shell(
        name=f"Back up the database before determined-master {', '.join(installed)} -> {version}",
        # version is checked N.N.N by the model: nothing to quote
        commands=[f"{PROGRAM} backup --reason before-{version}"],
    )


@deploy("PostgreSQL backups into MinIO")
def apply(cluster: Cluster, node: Node) -> None:
    # install
    packages(["python3", "ca-certificates"], "the backup program's interpreter")
    # Read at each run, like the settings below: a change needs no restart.
    files.put(
        name=f"Backup program {PROGRAM}",
        src=str(files_path("postgresql/pg-backup")),
        dest=PROGRAM,
        user="root",
        group="root",
        mode="755",
    )

    # configure
    files.directory(name=CONF_DIR, path=CONF_DIR, user="root", group="root", mode="755")
    files.put(
        name=f"Backup settings {CONF}",
        src=io.StringIO(conf(cluster)),
        dest=CONF,
        user="root",
        group="root",
        mode="644",
    )
    secret_file(name=f"Backup S3 keys {S3_ENV}", dest=S3_ENV, content=SecretBytes(s3_env(cluster)))
    units = [
        files.put(
            name=f"Backup unit {unit}",
            src=str(files_path(f"postgresql/{unit}")),
            dest=f"/etc/systemd/system/{unit}",
            user="root",
            group="root",
            mode="644",
        )
        for unit in UNITS
    ]

    # activate
    systemd.daemon_reload(name="Reload systemd for the backup units", _if=any_changed(*units))
    systemd.service(
        name="Nightly backup timer enabled and running",
        service="pg-backup.timer",
        running=True,
        enabled=True,
    )
    systemd.service(
        name="Weekly restore drill timer enabled and running",
        service="pg-backup-drill.timer",
        running=True,
        enabled=True,
    )
