"""What the Determined master and agent roles share: the configuration directory, the
sha256-pinned package, and the agent configuration both agent layouts render.

The roles themselves are roles/determined/master.py, roles/determined/agent.py (per_node, and
the dispatch by agent_layout) and roles/determined/domains.py (per_domain).
"""

from __future__ import annotations

from pyinfra.api.operation import OperationMeta

from deploy.cluster import Cluster
from roles.determined.tls import agent_security
from roles.shared.ops import verified_deb
from roles.shared.templates import render

CONFIG_DIR = "/etc/determined"


def install_determined(cluster: Cluster, kind: str) -> OperationMeta:
    """The sha256-pinned determined-<kind> package (kind: master or agent) from
    sources.determined_<kind>, unless that version is installed."""
    version = cluster.determined.version
    source = getattr(cluster.sources, f"determined_{kind}")
    return verified_deb(
        name=f"Install determined-{kind} {version} (sha256-pinned)",
        package=f"determined-{kind}",
        version=version,
        url=cluster.sources.determined_url(kind, version),
        sha256=source.sha256,
        artifact=f"determined-{kind} {version} package",
    )


def agent_config(cluster: Cluster, agent_id: str, visible_gpus: str | None, path: str) -> str:
    """An agent's configuration file at `path` (visible_gpus None: every GPU of the node)."""
    determined = cluster.determined
    return render(
        "determined/agent.yaml.j2",
        path=path,
        master_host=cluster.master_host,
        master_port=cluster.master_port,
        container_master_host=str(cluster.master_node.address),
        agent_id=agent_id,
        resource_pool=determined.resource_pool,
        slot_type=determined.slot_type,
        visible_gpus=visible_gpus,
        tls=agent_security(cluster),
    )
