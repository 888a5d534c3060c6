"""pyinfra groups built from cluster.yaml.

An inventory module (inventories/<env>.py) calls `groups(path)` and puts the result into its
globals; pyinfra then sees three groups, `master`, `storage` and `agents`, whose hosts are
named by node hostname and reached at the node's management address. Each host's data holds
the SSH settings plus `cluster` (the whole model) and `node` (this host's Node).

A broken cluster.yaml stops the run before pyinfra connects anywhere: every problem goes to
stderr and the process exits with status 2. (pyinfra 3.10 executes the inventory file with
exec() and wraps only Exception subclasses; SystemExit passes through its CLI untouched.)
"""

from __future__ import annotations

import sys
from pathlib import Path

from deploy.cluster import Cluster, ClusterError, Node, load_cluster

GROUPS = {"master": "master", "storage": "storage", "agents": "agent"}  # group -> role


def host_data(cluster: Cluster, node: Node) -> dict:
    ssh = cluster.ssh
    data = {
        "ssh_hostname": str(node.address),
        "ssh_user": ssh.user,
        "ssh_port": ssh.port,
        # pyinfra's values: "yes" rejects unknown host keys, "no" accepts any key.
        "ssh_strict_host_key_checking": "yes" if ssh.strict_host_key_checking else "no",
        "cluster": cluster,
        "node": node,
    }
    if ssh.key_file:
        data["ssh_key"] = ssh.key_file
    if ssh.known_hosts_file:
        data["ssh_known_hosts_file"] = ssh.known_hosts_file
    return data


def groups(cluster_yaml_path: str | Path) -> dict[str, list[tuple[str, dict]]]:
    try:
        cluster = load_cluster(cluster_yaml_path)
    except ClusterError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        print(
            f"{cluster_yaml_path}: {len(e.problems)} problem(s); stopped before connecting to any host",
            file=sys.stderr,
        )
        sys.exit(2)
    return {
        group: [(node.hostname, host_data(cluster, node)) for node in cluster.nodes_with(role)]
        for group, role in GROUPS.items()
    }
