"""TCP_NODELAY on a paramiko connection (no pyinfra here: tests/verify's testinfra uses it too).

paramiko leaves Nagle's algorithm on. Opening a command channel writes two small SSH packets
back to back; with Nagle the second waits for the node's delayed ACK of the first (40 ms):
about 50 ms per command instead of 5. The deploy's connections get it from
deploy/pyinfra_ext/ssh.py, verify's from tests/verify/conftest.py.
"""

import socket


def set_nodelay(client) -> bool:
    """TCP_NODELAY on a connected paramiko client; False if it has no TCP socket (yet)."""
    transport = client.get_transport() if client is not None else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False  # a ProxyCommand/jump-host channel: nothing to tune here
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True
