"""The deploy's MinIO users (Determined's, pg-backup's), made through MinIO's admin API from the
controller.

Called by roles/minio/server.py after the bucket, one operation per user (deploy/minio_admin.py
users()). Each user, its canned policy and the mapping are read back first
(deploy/minio_admin.py read_state): nothing to do is a no-op in pyinfra's plan, and a user whose
policy or secret was changed on the server is written again.

From the controller, not the storage node: the admin API needs MinIO's root keys, which the
controller has anyway, and minio-py's MinioAdmin encrypts the new user's secret with them
(madmin's EncryptData) on the way; on the node it would take MinIO's `mc` (one more pinned
binary) with the root keys in its config or argv. Nothing here prints a key.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from deploy import minio_admin
from deploy.cluster import Cluster
from roles.shared.ops import on_controller


@operation()
def scoped_user(cluster: Cluster, user: minio_admin.User):
    """`user` and its policy: a change only when MinIO differs from cluster.yaml.

    Read again right before it runs (pyinfra re-runs this body then); on a first deploy
    MinIO is not up while the plan is made, so the plan counts it as a change.
    """
    try:
        problems = minio_admin.read_state(cluster, user).problems
    except minio_admin.IamError as e:
        problems = [str(e)]
    if not problems:
        host.noop(f"user {user.name} has policy {user.policy}")
        return
    yield on_controller(lambda: minio_admin.ensure(cluster, user), minio_admin.IamError)


def users(cluster: Cluster) -> None:
    """One operation per user; its name says what the user may touch."""
    for user in minio_admin.users(cluster.storage):
        scoped_user(
            name=f"MinIO user {user.name}: {user.scope} (from the controller)", cluster=cluster, user=user
        )
