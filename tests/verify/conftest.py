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
from deploy.sshtuning import set_nodelay
from tests.verify.master_api import _enabled_slots, poll_agents

ROLE_FIXTURES = {"node": None, "peer": None, "agent": "agent", "master": "master", "storage": "storage"}


@functools.cache
def _cluster(path: str):
    return load_cluster(path)


# The node a check is about: the prober, for a (node, peer) cross-node check.
GROUP_BY = ("node", "agent", "master", "storage")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its hook is a plain one)
def pytest_collection_modifyitems(items):
    """Each node's checks go to one xdist worker (`--dist loadgroup`, tests/verify/__main__.py):
    that worker alone connects to the node and runs its probes, instead of every worker doing it
    again; at 32 nodes that was four SSH connections and four probe rounds per node."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        about = next((params[f] for f in GROUP_BY if f in params), None)
        item.add_marker(pytest.mark.xdist_group(about.hostname if about else "(cluster)"))


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
            client = cache[node.hostname].backend.client  # connect now, once (a cached property)
            set_nodelay(client)  # 50 ms less per command: see deploy/sshtuning.py
        except Exception as e:
            unreachable[node.hostname] = (e, e.__traceback__)
            raise
        return cache[node.hostname]

    return get


@pytest.fixture(scope="session")
def registered_agents(cluster):
    """{agent id: agent} from the master, once every agent node's enabled agents offer its
    slots (one poll per worker for every registration check)."""

    def done(agents):
        by_id = {a["id"]: a for a in agents}
        return all(_enabled_slots(n, by_id) == n.slots for n in cluster.agents)

    return {a["id"]: a for a in poll_agents(cluster, done)}
