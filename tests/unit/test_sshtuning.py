import socket
from types import SimpleNamespace

import pytest

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


# --- deploy/pyinfra_ext/ssh.py against the installed pyinfra: the upgrade gate of its hooks ----


def lost_transport_host(active: bool):
    transport = SimpleNamespace(is_active=lambda: active)
    return SimpleNamespace(connector=SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport)))


def raising(exc):
    def method(self, *args, **kwargs):
        raise exc

    return method


def test_a_lost_connection_becomes_the_error_pyinfra_fails_one_host_for():
    from paramiko import SSHException
    from pyinfra.api.exceptions import ConnectError

    from deploy.pyinfra_ext import ssh

    alive = SimpleNamespace(host=lost_transport_host(True))
    gone = SimpleNamespace(host=lost_transport_host(False))
    with pytest.raises(SSHException, match="EOF"):
        ssh._lost_connection_fails_the_host(raising(EOFError()))(alive)
    with pytest.raises(SSHException, match="ConnectError"):
        ssh._lost_connection_fails_the_host(raising(ConnectError("no SFTP")))(gone)
    # With the connection up, any other error is the command's own business.
    with pytest.raises(ConnectError):
        ssh._lost_connection_fails_the_host(raising(ConnectError("no SFTP")))(alive)
    with pytest.raises(OSError):
        ssh._lost_connection_fails_the_host(raising(OSError("reset")))(gone)


def test_pyinfra_fails_only_the_host_whose_fact_read_raised_ssh_exception(monkeypatch):
    """Contract: an SSHException from the connector fails that host (no exception escapes),
    which is what the containment turns paramiko's EOFError into."""
    from paramiko import SSHException
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.facts import get_fact
    from pyinfra.facts.server import Hostname

    state = State(Inventory((["@local"], {})), Config())
    connect_all(state)
    host = state.inventory.get_host("@local")
    monkeypatch.setattr(host, "run_shell_command", raising(SSHException("lost")).__get__(host))
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # it was the only host
        get_fact(state, host, Hostname)
    assert host in state.failed_hosts


def test_the_connector_methods_wrapped_are_still_there():
    """Contract: the SSH connector still connects in `_connect(self)`, keeps the paramiko
    client in `client`, and runs commands and transfers through these methods."""
    import inspect

    from pyinfra.connectors.ssh import SSHConnector

    from deploy.pyinfra_ext import ssh

    assert list(inspect.signature(SSHConnector._connect).parameters) == ["self"]
    assert "self.client = SSHClient()" in inspect.getsource(SSHConnector._connect)
    for name in ssh.FILE_AND_COMMAND_METHODS:
        assert callable(getattr(SSHConnector, name)), name
