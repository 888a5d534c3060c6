"""MinIO on the storage node, and the checkpoint bucket in it.

install:   the server binary from sources.minio, sha256-verified, as /usr/local/bin/minio
configure: minio-user, the data directory (created, never emptied), /etc/default/minio
           (0600: it holds the root credentials), the official unit file and a drop-in that
           starts MinIO only with storage.data_dir mounted (unless storage.data_on_root_disk;
           preflight refuses the node before that)
activate:  enabled and running; restarted only when binary, settings or unit changed, then
           waited for until /minio/health/ready answers
bucket:    made from the controller with minio-py (deploy/s3.py) if missing; its location
           must read back as storage.region (MinIO's MINIO_SITE_REGION), or the host fails
iam:       Determined's own user (the bucket, not backups/) and pg-backup's (backups/postgresql/
           only), each with its policy (roles/minio/iam.py); the root keys stay in
           /etc/default/minio and the deploy
console:   storage.console: 127.0.0.1 only (default), every interface, or disabled (MINIO_BROWSER=off)
"""

from __future__ import annotations

import io

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from deploy import s3
from deploy.cluster import Cluster, Node
from roles.minio import iam as minio_iam
from roles.minio import tls as minio_tls
from roles.shared.ops import (
    SecretBytes,
    env_file,
    on_controller,
    packages,
    secret_file,
    verified_binary,
    wait_for_http,
)
from roles.shared.templates import files_path, render

BINARY = "/usr/local/bin/minio"
ENV_FILE = "/etc/default/minio"
UNIT = "/etc/systemd/system/minio.service"
DATA_MOUNT_DROP_IN = "/etc/systemd/system/minio.service.d/10-data-mount.conf"
USER = "minio-user"


def server_options(cluster: Cluster) -> str:
    """MINIO_OPTS. The console's --console-address is ADDRESS:PORT like --address (minio/minio
    cmd/server-main.go, cmd/common-main.go): 127.0.0.1:<port> keeps it off the network."""
    storage = cluster.storage
    options = f"--address :{storage.port}{minio_tls.server_options(cluster)}"
    if storage.console == "localhost":
        return f"{options} --console-address 127.0.0.1:{storage.console_port}"
    if storage.console == "all":
        return f"{options} --console-address :{storage.console_port}"
    return options  # disabled: MINIO_BROWSER=off below, no console listener at all


def env_content(cluster: Cluster) -> str:
    """/etc/default/minio. Its secrets go only into this 0600 file."""
    storage = cluster.storage
    browser = {"MINIO_BROWSER": "off"} if storage.console == "disabled" else {}
    return env_file(
        "MinIO server settings for minio.service (roles/minio/server.py). Holds the root\n"
        "credentials: keep it 0600 root:root; systemd reads it as root.",
        {
            "MINIO_VOLUMES": storage.data_dir,
            "MINIO_OPTS": server_options(cluster),
            "MINIO_ROOT_USER": storage.access_key.value,
            "MINIO_ROOT_PASSWORD": storage.secret_key.value,
            # The region MinIO signs and answers for (MINIO_REGION is the legacy name). Every
            # client, Determined's trial containers included, must sign for the same region.
            "MINIO_SITE_REGION": storage.region,
            **browser,
        },
    )


def data_mount_drop_in(cluster: Cluster) -> str:
    storage = cluster.storage
    return render(
        "minio/10-data-mount.conf.j2", data_dir=storage.data_dir, on_root_disk=storage.data_on_root_disk
    )


@operation()
def bucket(cluster: Cluster):
    """The checkpoint bucket, from the controller: a change only when it has to be made.

    Checked again right before it runs (pyinfra re-runs this body then): on a first deploy
    MinIO is not up while the plan is made, so the plan counts it as a change.
    """
    problem = s3.bucket_problem(cluster)
    if problem is None:
        host.noop(f"bucket {cluster.storage.bucket} exists in region {cluster.storage.region}")
        return
    yield on_controller(
        lambda: [f"created bucket {cluster.storage.bucket}"] if s3.ensure_bucket(cluster) else [],
        s3.BucketError,
    )


@deploy("MinIO object storage")
def apply(cluster: Cluster, node: Node) -> None:
    # Long: MinIO's operations in the order they run (user, data dir, binary, settings, TLS, unit,
    # start, bucket, users): the role reads as its plan
    storage = cluster.storage
    source = cluster.sources.minio

    # install
    packages(["curl", "ca-certificates"], "download and health-check tools")
    binary = verified_binary(
        name="Install the MinIO server binary (sha256-pinned)",
        url=source.url,
        sha256=source.sha256,
        dest=BINARY,
        artifact="MinIO server binary",
    )

    # configure
    server.group(name=f"System group {USER}", group=USER, system=True)
    server.user(
        name=f"System user {USER}",
        user=USER,
        group=USER,
        system=True,
        shell="/usr/sbin/nologin",
        ensure_home=False,
    )
    files.directory(
        name=f"MinIO data directory {storage.data_dir}",
        path=storage.data_dir,
        user=USER,
        group=USER,
        mode="750",
    )
    env = secret_file(
        name=f"MinIO settings and credentials {ENV_FILE}",
        dest=ENV_FILE,
        content=SecretBytes(env_content(cluster)),
    )
    unit = files.put(
        name="MinIO systemd unit (official)",
        src=str(files_path("minio/minio.service")),
        dest=UNIT,
        user="root",
        group="root",
        mode="644",
    )

    files.directory(
        name="MinIO unit drop-in directory",
        path=DATA_MOUNT_DROP_IN.rsplit("/", 1)[0],
        user="root",
        group="root",
        mode="755",
    )
    mount = files.put(
        name=f"MinIO starts only with {storage.data_dir} mounted",
        src=io.StringIO(data_mount_drop_in(cluster)),
        dest=DATA_MOUNT_DROP_IN,
        user="root",
        group="root",
        mode="644",
    )

    certs = minio_tls.certs(cluster)  # storage.tls: public.crt and private.key, or none

    # activate
    changed = any_changed(binary, env, unit, mount, *certs)
    restart = systemd.service(
        name="Restart MinIO for its new binary or settings",
        service="minio.service",
        running=True,
        restarted=True,
        daemon_reload=True,
        _if=changed,
    )
    running = systemd.service(
        name="MinIO enabled and running", service="minio.service", running=True, enabled=True
    )
    ready_url, resolve = minio_tls.ready_check(cluster)
    wait_for_http(ready_url, "MinIO", resolve=resolve, _if=any_changed(restart, running))

    bucket(name=f"Bucket {storage.bucket} in region {storage.region} (from the controller)", cluster=cluster)
    minio_iam.users(cluster)
