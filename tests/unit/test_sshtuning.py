import socket
from types import SimpleNamespace

from deploy.sshtuning import set_nodelay


def client_with(sock):
    return SimpleNamespace(get_transport=lambda: SimpleNamespace(sock=sock))


def test_nodelay_is_set_on_a_tcp_connection():
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        assert set_nodelay(client_with(sock)) is True
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_no_tcp_socket_is_left_alone():
    a, b = socket.socketpair()  # what a ProxyCommand channel looks like: not TCP
    with a, b:
        assert set_nodelay(client_with(a)) is False
    assert set_nodelay(None) is False
    assert set_nodelay(SimpleNamespace(get_transport=lambda: None)) is False
