"""The Determined master on the master node (PostgreSQL comes first, from roles/postgresql/server).

configure: /etc/determined/master.yaml (0600, from files/determined/master.yaml.j2), the S3
           environment file (0600), the unit drop-in that loads it, and with determined.tls
           the certificate and key (roles/determined/tls.py). Written BEFORE the
           package: its postinst (re)starts the master through deb-systemd-invoke whenever the
           unit is enabled (always on an upgrade), and dpkg keeps an existing master.yaml (a
           conffile) instead of the package's default (port 8080, database host determined-db),
           so no start ever sees the default configuration.
install:   determined-master <version> from sources.determined_master, sha256-verified;
           skipped when that version is installed; when another version is, the database is
           backed up into MinIO first (roles/postgresql/backup.py): the new master migrates its schema
activate:  enabled and running; restarted only when its configuration changed and the package
           did not (an upgrade's postinst has already restarted it with the files in place);
           then waited for until GET /health answers 200 on master_port (https by master_host,
           checked against the master's CA, with determined.tls)
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import deploy
from pyinfra.operations import files, systemd

from deploy.cluster import Cluster, Node
from deploy.determined_node import health_check
from roles.determined import tls as determined_tls
from roles.determined.common import CONFIG_DIR, install_determined
from roles.minio import tls as minio_tls
from roles.postgresql import backup as pg_backup
from roles.shared.ops import SecretBytes, env_file, packages, secret_file, wait_for_http
from roles.shared.templates import files_path, render

MASTER_YAML = f"{CONFIG_DIR}/master.yaml"
S3_ENV = f"{CONFIG_DIR}/master-s3.env"
DROP_IN = "/etc/systemd/system/determined-master.service.d/10-s3.conf"
SERVICE = "determined-master.service"


def master_yaml(cluster: Cluster) -> str:
    storage = cluster.storage
    determined = cluster.determined
    return render(
        "determined/master.yaml.j2",
        port=cluster.master_port,
        db=cluster.database,
        db_password=cluster.database.password.value,
        storage=storage,
        # Determined's bucket-only MinIO user (roles/minio/iam.py): trials get these keys.
        access_key=storage.determined_user,
        secret_key=storage.determined_secret.value,
        # The storage node by address where cluster.yaml names it (the model's trial_endpoint).
        endpoint_url=cluster.trial_endpoint,
        admin_password=determined.admin_password.value,
        # The references the agents pull (roles/determined/task_images.py): via sources.registry if set.
        image_gpu=cluster.task_refs.gpu,
        image_cpu=cluster.task_refs.cpu,
        shm_size_bytes=determined.shm_size_bytes,
        fabric_interface=cluster.dtrain_interface,
        nccl_ib_hca=cluster.network.nccl_ib_hca,
        # storage.tls.ca_certificate: the node's bundle with it (roles/minio/tls.py), read-only.
        storage_ca=minio_tls.trial_bundle(cluster),
        tls=determined_tls.master_security(cluster),
    )


def s3_env(cluster: Cluster) -> str:
    storage = cluster.storage
    return env_file(
        "S3 credentials and region for determined-master.service (roles/determined/master.py),\n"
        "loaded by its drop-in 10-s3.conf. 0600 root.",
        {
            "AWS_ACCESS_KEY_ID": storage.determined_user,
            "AWS_SECRET_ACCESS_KEY": storage.determined_secret.value,
            "AWS_DEFAULT_REGION": storage.region,
        },
    )


@deploy("Determined master")
def apply(cluster: Cluster, node: Node) -> None:

    packages(["curl", "ca-certificates"], "download and health-check tools")

    # configure (before the package: see the module docstring)
    files.directory(name=f"{CONFIG_DIR}", path=CONFIG_DIR, user="root", group="root", mode="755")
    config = secret_file(
        name=f"Master configuration {MASTER_YAML}",
        dest=MASTER_YAML,
        content=SecretBytes(master_yaml(cluster)),
    )
    env = secret_file(
        name=f"Master S3 environment {S3_ENV}", dest=S3_ENV, content=SecretBytes(s3_env(cluster))
    )
    drop_in = files.put(
        name="Master unit drop-in loading the S3 environment",
        src=str(files_path("determined/10-s3.conf")),
        dest=DROP_IN,
        user="root",
        group="root",
        mode="644",
    )
    # Before the package too: a master.yaml naming them would not start without them.
    certs = determined_tls.master_files(cluster)

    # install
    pg_backup.before_version_change(cluster)
    package = install_determined(cluster, "master")

    # activate
    def config_changed_alone() -> bool:
        changed = any(op.did_change() for op in (config, env, drop_in, *certs))
        return changed and not package.did_change()

    restart = systemd.service(
        name="Restart the master for its new configuration",
        service=SERVICE,
        running=True,
        restarted=True,
        daemon_reload=True,
        _if=config_changed_alone,
    )
    running = systemd.service(name="Master enabled and running", service=SERVICE, running=True, enabled=True)
    url, resolve, env_vars = health_check(cluster)
    with_env: dict[str, Any] = {"_env": env_vars} if env_vars else {}
    wait_for_http(
        url,
        "the Determined master",
        resolve=resolve,
        _if=lambda: any(op.did_change() for op in (package, restart, running)),
        **with_env,
    )
