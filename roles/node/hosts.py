"""/etc/hosts: every node by management name and `<hostname>-<its IPoIB interface>` (like
`gpu-node1-ib0`: the model's Node.ipoib_name), no DNS needed. deploy/cluster/rules.py accepts
that name in storage.endpoint_url.

The agent resolves names once at start and fails with only 'Failed to resolve hostname'
otherwise, so every node carries the whole map.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import files, server

from deploy.cluster import Cluster, Node

MARKER = "# {mark} gpu-cluster managed hosts"


def hosts_block(cluster: Cluster) -> str:
    lines = []
    for n in cluster.nodes:
        lines.append(f"{n.address}\t{n.hostname}")
    for n in cluster.nodes:
        lines.append(f"{n.ipoib_address}\t{n.ipoib_name}")  # the model's naming convention
    return "\n".join(lines)


@deploy("Hosts")
def apply(cluster: Cluster, node: Node) -> None:
    server.hostname(name="Hostname", hostname=node.hostname)
    # Debian and Ubuntu installers map the hostname to 127.0.1.1, which would make a
    # node announce itself as loopback; the managed block maps it to its real address.
    files.line(
        name="Drop the installer's 127.0.1.1 hostname line",
        path="/etc/hosts",
        line=r"^127\.0\.1\.1\s",
        present=False,
    )
    files.block(
        name="Cluster hosts block",
        path="/etc/hosts",
        content=hosts_block(cluster),
        marker=MARKER,
    )
