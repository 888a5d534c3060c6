"""Checks run against any cluster.yaml: the lab in CI, real nodes in production.

Expected values come from the same model the deploy used. Fixtures:
- `cluster`: the model;
- `node`, `agent`, `master`, `storage`: parametrised over the matching nodes (ids = hostnames);
- `peer`: parametrised over every node, for cross-node checks (node x peer);
- `host_of(node)`: a testinfra Host reached over SSH with the cluster's SSH settings.
"""

import functools
import tempfile
from pathlib import Path

import pytest
import testinfra

from deploy.cluster import load_cluster

ROLE_FIXTURES = {"node": None, "peer": None, "agent": "agent", "master": "master", "storage": "storage"}


@functools.cache
def _cluster(path: str):
    return load_cluster(path)


def pytest_generate_tests(metafunc):
    cluster = _cluster(metafunc.config.getoption("--cluster"))
    for fixture, role in ROLE_FIXTURES.items():
        if fixture in metafunc.fixturenames:
            nodes = [n for n in cluster.nodes if role is None or role in n.roles]
            metafunc.parametrize(fixture, nodes, ids=[n.hostname for n in nodes], scope="session")


@pytest.fixture(scope="session")
def cluster(pytestconfig):
    return _cluster(pytestconfig.getoption("--cluster"))


def ssh_config_text(cluster) -> str:
    ssh = cluster.ssh
    lines = ["Host *", f"  User {ssh.user}", f"  Port {ssh.port}"]
    if ssh.key_file:
        lines.append(f"  IdentityFile {ssh.key_file}")
    lines.append(f"  StrictHostKeyChecking {'yes' if ssh.strict_host_key_checking else 'no'}")
    if ssh.known_hosts_file:
        lines.append(f"  UserKnownHostsFile {ssh.known_hosts_file}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def host_of(cluster):
    workdir = Path(tempfile.mkdtemp(prefix="verify-ssh-"))
    config = workdir / "ssh_config"
    config.write_text(ssh_config_text(cluster))
    cache = {}
    unreachable = {}

    def get(node):
        if node.hostname not in cache:
            cache[node.hostname] = testinfra.get_host(
                f"paramiko://{cluster.ssh.user}@{node.address}:{cluster.ssh.port}",
                ssh_config=str(config),
                ssh_identity_file=cluster.ssh.key_file,
                timeout=10,
            )
        # A node that drops packets costs one connect timeout per worker, not one per check.
        if node.hostname in unreachable:
            exc, tb = unreachable[node.hostname]
            raise exc.with_traceback(tb)
        try:
            cache[node.hostname].backend.client  # connect now, once (a cached property)
        except Exception as e:
            unreachable[node.hostname] = (e, e.__traceback__)
            raise
        return cache[node.hostname]

    return get
