"""The ordered plan: the article's checklist, one role per line.

Each host runs its roles in this order. pyinfra does not order one host's operations
against another's (it runs them in rounds by position), so where a role depends on another
host a barrier says so: an operation every host calls from the same line is one shared
step that all hosts reach before any goes past it. Reordering or skipping a role is moving
or deleting its line.
"""

from pyinfra import host
from pyinfra.api import operation

from roles import (
    apt_proxy,
    cuda,
    determined_agent,
    determined_master,
    docker,
    firewall,
    hosts,
    ipoib,
    minio,
    mofed,
    nccl,
    nvidia_driver,
    postgresql,
    preflight,
)


@operation(is_idempotent=True)
def barrier(reason: str):
    """No command and no change: a point every host reaches before any goes on."""
    host.noop(reason)
    return
    yield


def run() -> None:
    roles = host.data.node.roles
    preflight.apply()
    apt_proxy.apply()
    hosts.apply()
    ipoib.apply()
    firewall.apply()
    if "agent" in roles:
        nvidia_driver.apply()
    if "agent" in roles:
        cuda.apply()
    if "agent" in roles:
        nccl.apply()
    mofed.apply()
    if "storage" in roles:
        minio.apply()
    if "master" in roles:
        postgresql.apply()
    if "master" in roles:
        determined_master.apply()
    if "agent" in roles:
        docker.apply()
    barrier(
        name="Master and storage ready before agents register", reason="every host is past the master's roles"
    )
    if "agent" in roles:
        determined_agent.apply()
