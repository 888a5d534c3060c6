"""Checks run against any cluster.yaml: the lab in CI, real nodes in production.

Expected values come from the same model the deploy used. Fixtures:
- `cluster`: the model;
- `node`, `agent`, `master`, `storage`: parametrised over the matching nodes (ids = hostnames);
- `peer`: parametrised over every node, for cross-node checks (node x peer);
- `host_of(node)`: a testinfra Host reached over SSH with the cluster's SSH settings, host
  keys checked the way pyinfra checks them (see CheckedParamikoBackend).
"""

import functools
import logging
import os

import paramiko
import pytest
import testinfra.host
from testinfra.backend.paramiko import ParamikoBackend

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


# testinfra logs every command with its output at DEBUG, paramiko its transport: with pytest's
# --log-level=DEBUG both would land in the terminal and the JUnit file, secrets included.
QUIET_LOGGERS = ("testinfra", "paramiko")


def pytest_configure(config):
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    if config.getoption("showlocals", False):
        raise pytest.UsageError(
            "-l/--showlocals prints the checks' local variables, secrets included: not allowed here"
        )
    try:
        config.verify_host_keys = host_keys_line(_cluster(config.getoption("--cluster")).ssh)
    except Exception:  # a broken cluster.yaml: collection reports it, once
        config.verify_host_keys = None


def known_hosts_files(ssh) -> tuple[str, ...]:
    """The files pyinfra reads host keys from: ssh.known_hosts_file (pyinfra's
    ssh_known_hosts_file, deploy/inventory.py), else ~/.ssh/known_hosts (sshuserclient/client.py
    parse_config's default)."""
    return (os.path.expanduser(ssh.known_hosts_file or "~/.ssh/known_hosts"),)


def host_keys_line(ssh) -> str:
    """verify's header line: how the nodes' host keys are checked."""
    files = known_hosts_files(ssh)
    shown = ", ".join(files)
    if ssh.strict_host_key_checking:
        return f"host keys: checked against {shown}; unknown or different keys refused"
    if not any(os.path.isfile(f) and os.path.getsize(f) for f in files):
        return (
            f"host keys: NOT checked: no known keys in {shown} and "
            "ssh.strict_host_key_checking: false accepts any"
        )
    return (
        f"host keys: a key different from {shown} is refused; "
        "unknown keys ACCEPTED (ssh.strict_host_key_checking: false)"
    )


def pytest_report_header(config):
    return getattr(config, "verify_host_keys", None)


class UnknownHostKey(paramiko.SSHException):
    """A node whose key is not in known_hosts, with strict checking (pyinfra's StrictPolicy)."""


class StrictPolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, files: tuple[str, ...]):
        self.files = files

    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(
            f"no host key for {hostname} in {', '.join(self.files)} (ssh.strict_host_key_checking: true)"
        )


class AcceptPolicy(paramiko.MissingHostKeyPolicy):
    """pyinfra's WarningPolicy without the warning: the header line already says it."""

    def missing_host_key(self, client, hostname, key):
        pass


class CheckedParamikoBackend(ParamikoBackend):
    """testinfra's paramiko backend checks no host key: its client starts from WarningPolicy
    (accept anything), loads no known_hosts file, and reads only StrictHostKeyChecking=no from
    ssh_config (testinfra/backend/paramiko.py `client`, `_load_ssh_config`): an impostor node
    would pass every check. This client decides as pyinfra's SSHClient does
    (pyinfra/connectors/sshuserclient/client.py `connect`, `get_missing_host_key_policy`):
    known keys are loaded from the same file; a key that differs from a known one is refused
    (paramiko's BadHostKeyException), and an unknown one is refused with strict checking
    ("yes" -> StrictPolicy) and accepted without ("no" -> WarningPolicy)."""

    def __init__(self, hostspec: str, *, ssh, timeout: int = 10):
        super().__init__(hostspec, ssh_identity_file=ssh.key_file, timeout=timeout)
        self.known_hosts = known_hosts_files(ssh)
        self.strict = ssh.strict_host_key_checking

    @functools.cached_property
    def client(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        for path in self.known_hosts:
            if os.path.exists(path):
                client.get_host_keys().load(path)  # not load_host_keys: nothing is written back
        client.set_missing_host_key_policy(StrictPolicy(self.known_hosts) if self.strict else AcceptPolicy())
        client.connect(
            hostname=self.host.name,
            port=int(self.host.port) if self.host.port else 22,
            username=self.host.user,
            key_filename=self.ssh_identity_file,
            timeout=self.timeout,
            allow_agent=True,
        )
        return client


@pytest.fixture(scope="session")
def host_of(cluster):
    cache = {}
    unreachable = {}

    def get(node):
        if node.hostname not in cache:
            backend = CheckedParamikoBackend(
                f"{cluster.ssh.user}@{node.address}:{cluster.ssh.port}",
                ssh=cluster.ssh,
                timeout=10,
            )
            cache[node.hostname] = testinfra.host.Host(backend)
            backend.set_host(cache[node.hostname])
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
