"""Cross-node checks: every node resolves and reaches every other on both networks."""

from roles.hosts import ib_name


def _reach(h, address: str) -> bool:
    # No ping on a minimal node; a TCP connect to sshd proves the path both ways.
    cmd = (
        "python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1], 22), 3)' "
        f"{address}"
    )
    return h.run(cmd).rc == 0


def test_reaches_peer_on_management(node, peer, host_of):
    assert _reach(host_of(node), peer.hostname), f"{node.hostname} -> {peer.hostname}"


def test_reaches_peer_on_ipoib(node, peer, host_of, cluster):
    name = ib_name(peer.hostname, cluster.network.ipoib.interface)
    assert _reach(host_of(node), name), f"{node.hostname} -> {name}"
