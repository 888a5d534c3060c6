"""pyinfra's SSH connector: TCP_NODELAY on its connections, and a lost connection failing
only its own host.

TCP_NODELAY: paramiko never sets it. Opening a command channel writes two small SSH packets
back to back; with Nagle the second waits for the node's ACK of the first, which the node's
kernel delays by 40 ms. Every fact and every command then cost about 50 ms of idle wire time
(74 facts on a no-op re-deploy: 3.7 s per host); with TCP_NODELAY the same command measured
5 ms on the lab. pyinfra has no socket option setting, so the connector's `_connect` is
wrapped (a reconnect after a reboot gets it too) and hosts connected before deploy.py ran are
tuned in place. The option itself is deploy/sshtuning.py, which tests/verify uses as well.

SSH loss: a host whose connection drops mid-run (sshd stopped, node down) must fail alone
while the others finish. pyinfra handles SSHException/OSError from its connector, but paramiko
raises a bare EOFError when the transport dies while a command channel is being opened
(pyinfra issue #1220), and a file transfer then fails with pyinfra's own ConnectError: either
aborts the whole run for every host. The connector's command and file methods turn them into
the SSHException pyinfra already handles.
"""

from __future__ import annotations

import functools
from typing import Any

from paramiko import SSHException
from pyinfra.connectors.ssh import SSHConnector

from deploy.pyinfra_ext import connection_lost, wrap_once
from deploy.sshtuning import set_nodelay

FILE_AND_COMMAND_METHODS = ("run_shell_command", "put_file", "get_file")


def _nodelay_after_connect(original):
    @functools.wraps(original)
    def _connect(self):
        result = original(self)
        set_nodelay(getattr(self, "client", None))
        return result

    return _connect


def _lost_connection_fails_the_host(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (SSHException, OSError):
            raise  # pyinfra fails the host for these already
        except EOFError as e:
            raise SSHException("SSH connection lost (EOF from the server)") from e
        except Exception as e:
            # With the transport gone, file transfers fail with pyinfra's ConnectError
            # ("Unable to establish SFTP connection") or an AssertionError instead.
            if connection_lost(self.host):
                raise SSHException(f"SSH connection lost ({type(e).__name__})") from e
            raise

    return wrapper


def patch() -> None:
    """Idempotent: wraps SSHConnector's methods once per process."""
    wrap_once(SSHConnector, "_connect", _nodelay_after_connect)
    for name in FILE_AND_COMMAND_METHODS:
        wrap_once(SSHConnector, name, _lost_connection_fails_the_host)


def tune(host: Any) -> None:
    """TCP_NODELAY on a host connected before the wrapper was in place (no-op otherwise)."""
    set_nodelay(getattr(getattr(host, "connector", None), "client", None))
