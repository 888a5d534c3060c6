"""Cross-node checks: every node resolves and reaches every other on both networks.

Each node probes all its peers on both networks in one command (not one SSH session per pair:
at 32 nodes that is ~2,000 sessions, and sshd's MaxStartups throttling then fails probes
that have nothing to do with the network); each (node, peer) pair is still its own cell.
"""

import functools
import json
import shlex

from roles.hosts import ib_name

# No ping on a minimal node; a TCP connect to sshd by name proves /etc/hosts and the path.
# A refused or reset connect is tried again: sshd drops excess unauthenticated connections.
PROBE = """
import json, socket, sys, time
result = {}
for name in sys.argv[1:]:
    error = ""
    for attempt in range(3):
        try:
            socket.create_connection((name, 22), 3).close()
            error = ""
            break
        except OSError as e:
            error = str(e)
            time.sleep(0.5)
    result[name] = error
print(json.dumps(result))
"""


@functools.cache
def _probe(host, names: tuple[str, ...]) -> dict[str, str]:
    command = "python3 -c " + shlex.quote(PROBE) + " " + " ".join(map(shlex.quote, names))
    return json.loads(host.check_output(command))


def _errors(node, host_of, cluster) -> dict[str, str]:
    """{peer name: error or ""} for every node's management and IPoIB name, from one command."""
    names = tuple(n.hostname for n in cluster.nodes) + tuple(
        ib_name(n.hostname, n.ipoib_interface) for n in cluster.nodes
    )
    return _probe(host_of(node), names)


def test_reaches_peer_on_management(node, peer, host_of, cluster):
    error = _errors(node, host_of, cluster)[peer.hostname]
    assert error == "", f"{node.hostname} -> {peer.hostname}: {error}"


def test_reaches_peer_on_ipoib(node, peer, host_of, cluster):
    name = ib_name(peer.hostname, peer.ipoib_interface)
    error = _errors(node, host_of, cluster)[name]
    assert error == "", f"{node.hostname} -> {name}: {error}"
