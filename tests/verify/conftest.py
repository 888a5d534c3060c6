"""Checks run against any cluster.yaml: the lab in CI, real nodes in production.

Expected values come from the same model the deploy used. Fixtures:
- `cluster`: the model;
- `node`, `agent`, `master`, `storage`: parametrised over the matching nodes (ids = hostnames);
- `peer`: parametrised over every node (node x peer items; the cross-node checks no longer
  use it: they are one item per node, tests/verify/test_cross_node.py);
- `host_of(node)`: a testinfra Host reached over SSH with the cluster's SSH settings, host
  keys checked the way pyinfra checks them (see CheckedParamikoBackend);
- `reach`: what verify's first step found (tests/verify/reach.py): which nodes answer, which
  peers each reaches;
- `answering(nodes)`: for cluster-wide checks, [(node, host)] of the nodes that answered; the
  others are named on the check's cell as not asked.

A node the first step found dead is never connected to again: every check about it (a `node`,
`agent`, `master` or `storage` parameter) reports SSH at setup without running, and
`host_of` raises at once for it (pytest_runtest_setup and host_of below: nothing per check).
"""

import contextlib
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from types import TracebackType

import paramiko
import pytest
import testinfra.host
from testinfra.backend.paramiko import ParamikoBackend

from deploy.cluster import load_cluster
from deploy.sshtuning import set_nodelay
from tests.verify import reach as reach_probe
from tests.verify.master_api import _enabled_slots, poll_agents
from tests.verify.matrix import P_NOT_ASKED, ssh_problem

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
        about = _about(item)
        item.add_marker(pytest.mark.xdist_group(about.hostname if about else _cluster_group(item)))
    # Each node's cross-node checks last: they need every node's probe (verify's first step),
    # the others only their own node's verdict, so they start while a dead node is waited for.
    # (The matrix orders its rows by source location, not by when they ran.)
    items.sort(key=lambda item: item.path.name == "test_cross_node.py")


def _cluster_group(item) -> str:
    """The smoke experiment's checks share one run (a session fixture): one worker of their
    own, so that the other cluster-wide checks do not wait for it (seconds on the lab, longer
    where a trial's image must be pulled first)."""
    return "(smoke)" if item.path.name == "test_smoke.py" else "(cluster)"


def _about(item):
    """The node a check is about (its first `node`/`agent`/`master`/`storage` value), or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return next((params[f] for f in GROUP_BY if f in params), None)


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


def pytest_addoption(parser):
    parser.addoption(
        "--reach-timeout",
        type=float,
        default=reach_probe.DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="verify's first step gives each node this long per stage (TCP connect, SSH banner, "
        "login) and each peer connect this long; a node that does not answer in time is SSH "
        f"and never waited on again (default {reach_probe.DEFAULT_TIMEOUT:g})",
    )
    parser.addoption(
        "--no-smoke",
        action="store_true",
        help="do not submit the smoke experiment (tests/verify/test_smoke.py): for a production "
        "cluster that must not run jobs; its four rows are skipped",
    )


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
    smoke = (
        "smoke experiment: OFF (--no-smoke): no job submitted"
        if config.getoption("--no-smoke")
        else "smoke experiment: ON: four small experiments are submitted to the master and "
        "archived after (--no-smoke for a cluster that must not run jobs)"
    )
    return [line for line in (getattr(config, "verify_host_keys", None), smoke) if line]


# --- verify's first step: who answers, who reaches whom (tests/verify/reach.py) --------------


def _connect(cluster):
    def connect(node, timeout):
        backend = CheckedParamikoBackend(
            f"{cluster.ssh.user}@{node.address}:{cluster.ssh.port}", ssh=cluster.ssh, timeout=timeout
        )
        return backend.client

    return connect


def _probe_into(directory: Path, cluster_path: str, timeout: float) -> None:
    """Run the first step, writing each node's verdict when known and the whole result at the
    end (atomically: the workers wait for the files)."""

    def publish(hostname, dead):
        with contextlib.suppress(OSError):  # the run may have ended without waiting for it
            reach_probe.write_atomically(
                reach_probe.verdict_file(directory, hostname), json.dumps({"dead": dead})
            )

    cluster = _cluster(cluster_path)
    try:
        result = reach_probe.run(cluster, _connect(cluster), ssh_problem, timeout, publish)
    except Exception as e:  # a bug here must not hang the workers: they read the error
        result = reach_probe.Reach(timeout=timeout, error=f"{type(e).__name__}: {e}")
    with contextlib.suppress(OSError):
        reach_probe.write_atomically(directory / reach_probe.RESULT, result.to_json())


@pytest.hookimpl(tryfirst=True)  # before xdist's own (trylast) starts the workers: they overlap
def pytest_sessionstart(session):
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    try:
        cluster_path = config.getoption("--cluster")
        _cluster(cluster_path)
    except Exception:  # a broken cluster.yaml: collection reports it, once
        return
    config.verify_reach_dir = Path(tempfile.mkdtemp(prefix="verify-reach-"))
    config.verify_reach_path = config.verify_reach_dir / reach_probe.RESULT  # read by matrix.py
    timeout = config.getoption("--reach-timeout")
    threading.Thread(
        target=_probe_into, args=(config.verify_reach_dir, cluster_path, timeout), daemon=True
    ).start()


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent under -p no:xdist
def pytest_configure_node(node):
    directory = getattr(node.config, "verify_reach_dir", None)
    if directory is not None:
        node.workerinput["verify_reach"] = str(directory)


def pytest_unconfigure(config):
    directory = getattr(config, "verify_reach_dir", None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def reach_of(config) -> reach_probe.Published:
    """This process's view of the first step (a worker reads the controller's files)."""
    if not hasattr(config, "verify_reach"):
        directory = getattr(config, "workerinput", {}).get("verify_reach") or getattr(
            config, "verify_reach_dir", None
        )
        config.verify_reach = reach_probe.Published(
            Path(directory) if directory else None, config.getoption("--reach-timeout")
        )
        reach_probe.CURRENT = config.verify_reach
    return config.verify_reach


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A check about a node the first step found dead reports SSH at setup, without trying."""
    about = _about(item)
    if about is not None and hasattr(about, "hostname"):
        reach_of(item.config).raise_if_dead(about)


@pytest.fixture(scope="session")
def reach(pytestconfig) -> reach_probe.Published:
    return reach_of(pytestconfig)


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
            # Every stage bounded alike (paramiko's defaults: banner 15 s, login 30 s): a node
            # that accepts the TCP connect but hangs costs `timeout` too.
            timeout=self.timeout,
            banner_timeout=self.timeout,
            auth_timeout=self.timeout,
            allow_agent=True,
        )
        return client


@pytest.fixture(scope="session")
def host_of(cluster, reach):
    cache: dict[str, testinfra.host.Host] = {}
    # Host.backend is typed as testinfra's BaseBackend: keep our own, whose `client` connects.
    backends: dict[str, CheckedParamikoBackend] = {}
    unreachable: dict[str, tuple[BaseException, TracebackType | None]] = {}

    def get(node):
        reach.raise_if_dead(node)  # found dead before the checks: no second wait
        if node.hostname not in cache:
            backend = CheckedParamikoBackend(
                f"{cluster.ssh.user}@{node.address}:{cluster.ssh.port}",
                ssh=cluster.ssh,
                timeout=10,
            )
            cache[node.hostname] = testinfra.host.Host(backend)
            backends[node.hostname] = backend
            backend.set_host(cache[node.hostname])
        # A node that drops packets costs one connect timeout per worker, not one per check.
        if node.hostname in unreachable:
            exc, tb = unreachable[node.hostname]
            raise exc.with_traceback(tb)
        try:
            client = backends[node.hostname].client  # connect now, once (a cached property)
            set_nodelay(client)  # 50 ms less per command: see deploy/sshtuning.py
        except Exception as e:
            unreachable[node.hostname] = (e, e.__traceback__)
            raise
        return cache[node.hostname]

    return get


@pytest.fixture
def answering(host_of, reach, record_property):
    """For a cluster-wide check: answering(nodes) -> [(node, host)] of the nodes that answered
    verify's first step. The others are not asked; the matrix names them beside the check's
    cell instead of turning the whole check SSH."""

    def ask(nodes) -> list:
        nodes = list(nodes)
        skipped = [n.hostname for n in nodes if reach.dead(n.hostname)]
        if skipped:
            record_property(P_NOT_ASKED, json.dumps(skipped))
        return [(n, host_of(n)) for n in nodes if n.hostname not in skipped]

    return ask


@pytest.fixture(scope="session")
def registered_agents(cluster, reach):
    """{agent id: agent} from the master, once every answering agent node's enabled agents
    offer its slots (one poll per worker for every registration check). A dead node's agents
    are not waited for: its own checks report SSH."""
    alive = [n for n in cluster.agents if not reach.dead(n.hostname)]

    def done(agents):
        by_id = {a["id"]: a for a in agents}
        return all(_enabled_slots(n, by_id) == n.slots for n in alive)

    return {a["id"]: a for a in poll_agents(cluster, done)}
