"""The ordered plan: the article's checklist, one role per line.

Each host runs its roles in this order, each role given the cluster model and this host's
node (read once from the host data deploy/inventory.py puts there). pyinfra does not order one
host's operations against another's (it runs them in rounds by position), so where a role
depends on another host a barrier says so: an operation every host calls from the same line
is one shared step that all hosts reach before any goes past it. Reordering or skipping a role
is moving or deleting its line.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from deploy import training
from deploy.cluster import Cluster, Node
from roles.apt import proxy as apt_proxy
from roles.determined import agent as determined_agent
from roles.determined import docker, task_images
from roles.determined import master as determined_master
from roles.determined import users as determined_users
from roles.fabric import ipoib, mofed, opensm
from roles.minio import server as minio
from roles.minio import tls as minio_tls
from roles.node import firewall, hosts, preflight
from roles.nvidia import cuda, gpu_services, nccl
from roles.nvidia import driver as nvidia_driver
from roles.postgresql import backup as pg_backup
from roles.postgresql import server as postgresql


@operation(is_idempotent=True)
def barrier(reason: str):
    """No command and no change: a point every host reaches before any goes on."""
    host.noop(reason)
    return
    yield


def run() -> None:
    cluster: Cluster = host.data.cluster
    node: Node = host.data.node
    roles = node.roles
    # Asked of the master once per deploy: what runs on this agent node (deploy/training.py).
    busy = (
        training.busy(cluster, node, host.data.get(training.ACCEPT_KEY))
        if "agent" in roles
        else training.IDLE
    )
    preflight.apply(cluster=cluster, node=node)
    apt_proxy.apply(cluster=cluster, node=node)
    hosts.apply(cluster=cluster, node=node)
    firewall.apply(cluster=cluster, node=node)
    # storage.tls.ca_certificate in every node's trust store (or gone): the master, pg-backup
    # and trial containers (the agents' whole bundle, bind-mounted: so before any Determined
    # role) reach MinIO over https.
    minio_tls.apply(cluster=cluster, node=node)
    # Before the driver: its DKMS build makes nvidia-peermem only against MLNX_OFED's RDMA
    # headers (NVIDIA's GPUDirect RDMA docs: a driver installed first must be reinstalled).
    mofed.apply(cluster=cluster, node=node)
    # After the fabric's stack: the IPoIB interface exists only once ib_ipoib is loaded, which
    # on a bare node MLNX_OFED's openibd does (no rdma-core udev rules before it).
    ipoib.apply(cluster=cluster, node=node)
    # After MLNX_OFED, which installs opensm: on network.subnet_manager's node only.
    opensm.apply(cluster=cluster, node=node)
    if "agent" in roles:
        nvidia_driver.apply(cluster=cluster, node=node, busy=busy)
    if "agent" in roles:
        gpu_services.apply(cluster=cluster, node=node)
    if "agent" in roles:
        cuda.apply(cluster=cluster, node=node)
    if "agent" in roles:
        nccl.apply(cluster=cluster, node=node)
    if "storage" in roles:
        minio.apply(cluster=cluster, node=node)
    if "master" in roles:
        postgresql.apply(cluster=cluster, node=node)
    if "master" in roles:
        pg_backup.apply(cluster=cluster, node=node)
    if "master" in roles:
        determined_master.apply(cluster=cluster, node=node)
    if "master" in roles:
        determined_users.apply(cluster=cluster, node=node)
    if "agent" in roles:
        docker.apply(cluster=cluster, node=node, busy=busy)
    if "agent" in roles:
        task_images.apply(cluster=cluster, node=node)
    barrier(
        name="Master and storage ready before agents register", reason="every host is past the master's roles"
    )
    if "agent" in roles:
        determined_agent.apply(cluster=cluster, node=node, busy=busy)
