"""The last lines of a deploy: which hosts failed, why, and the command to re-run for each.

pyinfra prints its Results table and then disconnects; the summary is printed (to stderr,
so `--json` stays pure) when the last connected host has disconnected.

A host whose SSH connection drops mid-run (sshd stopped, node down) must fail alone while the
others finish. pyinfra 3.10 handles SSHException/OSError from its connector, but paramiko
raises a bare EOFError when the transport dies while a command channel is being opened
(pyinfra issue #1220), and a file transfer then fails with pyinfra's own ConnectError: either
aborts the whole run for every host. `install` turns them into the SSHException pyinfra
already handles.
"""

import functools
import shlex
import sys

from paramiko import SSHException
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.connectors.ssh import SSHConnector

from deploy.topology import run_summary_lines

_installed_on: set[int] = set()


def rerun_command(argv: list[str], hostname: str) -> str:
    """The same pyinfra command line, limited to one host (earlier --limit dropped)."""
    args, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg == "--limit":
            skip = True
            continue
        if arg.startswith("--limit="):
            continue
        args.append(arg)
    return shlex.join(["pyinfra", *args, "--limit", hostname])


def summary_lines(failed: dict[str, str], argv: list[str]) -> list[str]:
    if not failed:
        return []
    lines = [f"--> {len(failed)} host(s) failed; the others finished:"]
    for hostname in sorted(failed):
        lines.append(f"    {hostname}: {failed[hostname]}")
        lines.append(f"      re-run: {rerun_command(argv, hostname)}")
    return lines


MAX_DETAIL = 200  # one line of the failed command's stderr, enough to say why


def connection_lost(host) -> bool:
    """The host's SSH transport is gone (sshd stopped, node down or rebooted mid-run)."""
    client = getattr(host.connector, "client", None)
    if client is None:
        return False
    transport = client.get_transport()
    return transport is None or not transport.is_active()


def last_stderr_line(state, host, op_hash) -> str:
    """The failed command's last stderr line: pyinfra printed it above already, this only
    repeats it next to the re-run command (the deploy keeps secrets out of commands)."""
    try:
        lines = state.ops[host][op_hash].operation_meta.stderr_lines
    except (KeyError, RuntimeError, AssertionError, AttributeError):
        return ""
    lines = [line.strip() for line in lines if line.strip()]
    return lines[-1][:MAX_DETAIL] if lines else ""


class FailureSummary(BaseStateCallback):
    def __init__(self):
        self.reasons: dict[str, str] = {}
        self.failed_ops: dict[str, str] = {}
        self.disconnected: set[str] = set()
        self.printed = False

    def record(self, state, host, op_hash) -> None:
        if host.name in self.reasons:
            return
        at = f"'{', '.join(sorted(state.get_op_meta(op_hash).names))}'"
        if connection_lost(host):
            self.reasons[host.name] = f"SSH connection lost at {at}"
        else:
            self.reasons[host.name] = f"failed at {at}"
            self.failed_ops[host.name] = op_hash

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        self.record(state, host, op_hash)

    def operation_end(self, state, op_hash):
        # A fact that cannot be read fails its host without an operation error (pyinfra
        # calls fail_hosts directly): name the operation it happened in all the same.
        for host in list(state.failed_hosts):
            if host in state.activated_hosts:
                self.record(state, host, op_hash)

    def reason(self, state, host) -> str:
        reason = self.reasons.get(host.name, "failed")
        if host.name in self.failed_ops:
            # Read once the operation is complete (its output is attached after this callback).
            detail = last_stderr_line(state, host, self.failed_ops[host.name])
            if detail:
                reason += f": {detail}"
        return reason

    def host_disconnect(self, state, host):
        # A reboot disconnects its host mid-run too: only the final disconnects count.
        if state.current_stage != StateStage.Disconnect:
            return
        self.disconnected.add(host.name)
        if self.printed or len(self.disconnected) < len(state.activated_hosts):
            return
        self.printed = True
        failed = {}
        for h in state.failed_hosts:
            if h not in state.activated_hosts:
                failed[h.name] = "unreachable: SSH connection failed"
            else:
                failed[h.name] = self.reason(state, h)
        for line in run_summary_lines(state) + summary_lines(failed, sys.argv):
            print(line, file=sys.stderr)


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

    wrapper.contains_connection_loss = True
    return wrapper


def contain_connection_loss() -> None:
    """Idempotent: wraps SSHConnector's command and file methods once per process."""
    for name in ("run_shell_command", "put_file", "get_file"):
        method = getattr(SSHConnector, name)
        if not getattr(method, "contains_connection_loss", False):
            setattr(SSHConnector, name, _lost_connection_fails_the_host(method))


def install(state) -> None:
    """Register once per run (deploy.py is executed once per host)."""
    if id(state) in _installed_on:
        return
    _installed_on.add(id(state))
    contain_connection_loss()
    state.add_callback_handler(FailureSummary())
