"""The last lines of a deploy: which hosts failed, why, and the command to re-run for each.

pyinfra prints its Results table and then disconnects; the summary is printed (to stderr,
so `--json` stays pure) when the last connected host has disconnected. Only pyinfra's
documented API here (a state callback, the state's hosts and operation meta); whether a
host's SSH connection is gone is asked of deploy/pyinfra_ext, which also keeps that loss
from aborting the other hosts.

With SUMMARY_FILE_ENV set (python -m deploy shards sets it for each of its pyinfra
processes) the same content is written to that file as JSON, {"failed": {host: reason},
"rerun": {host: command}}, instead of printed: the sharded deploy merges the files into one
summary. When every host of a run has failed, pyinfra stops with "No hosts remaining!"
before the final disconnects: the summary is then written (or printed) at the process's exit.
"""

import atexit
import json
import os
import re
import shlex
import sys

from pyinfra.api.state import BaseStateCallback, StateStage

from deploy.pyinfra_ext import connection_lost

_installed_on: set[int] = set()
SUMMARY_FILE_ENV = "GPU_CLUSTER_SUMMARY_FILE"


# pyinfra 3.10's options that take a secret (pyinfra_cli/cli.py: --ssh-password/--password,
# --ssh-key-password/--key-password; the sudo passwords are prompted for, never given in argv)
# and --data KEY=VALUE whose KEY names one: their values never appear in a re-run line.
SECRET_OPTIONS = ("--ssh-password", "--password", "--ssh-key-password", "--key-password")
SECRET_DATA_KEY = re.compile(r"pass|secret|token|credential|auth|private|(^|_)key($|_)", re.IGNORECASE)
HIDDEN = "<hidden>"


def _data_value(value: str) -> str:
    key, sep, _ = value.partition("=")
    return f"{key}={HIDDEN}" if sep and SECRET_DATA_KEY.search(key) else value


def redact_argv(args: list[str]) -> list[str]:
    """`args` with the values of secret-bearing options replaced by <hidden>."""
    out: list[str] = []
    hide = None  # the option whose value comes next
    for arg in args:
        if hide is not None:
            out.append(HIDDEN if hide != "--data" else _data_value(arg))
            hide = None
            continue
        name, eq, value = arg.partition("=")
        if name in SECRET_OPTIONS:
            out.append(f"{name}={HIDDEN}" if eq else arg)
            hide = None if eq else name
        elif name == "--data":
            out.append(f"--data={_data_value(value)}" if eq else arg)
            hide = None if eq else name
        else:
            out.append(arg)
    return out


def rerun_command(argv: list[str], hostname: str) -> str:
    """The same pyinfra command line, limited to one host (earlier --limit dropped), with
    secret option values hidden: type them again (or use pyinfra's prompts) to re-run."""
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
    return shlex.join(["pyinfra", *redact_argv(args), "--limit", hostname])


def summary_lines(failed: dict[str, str], argv: list[str], rerun: dict[str, str] | None = None) -> list[str]:
    """The closing lines; `rerun` gives a host's re-run command where it is already known
    (python -m deploy shards: each process's own), else it is made from `argv`."""
    if not failed:
        return []
    rerun = rerun or {}
    lines = [f"--> {len(failed)} host(s) failed; the others finished:"]
    for hostname in sorted(failed):
        lines.append(f"    {hostname}: {failed[hostname]}")
        lines.append(f"      re-run: {rerun.get(hostname) or rerun_command(argv, hostname)}")
    return lines


MAX_DETAIL = 200  # one line of the failed command's stderr, enough to say why


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

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):  # type: ignore[override]  # pyinfra types callbacks static; this one keeps state
        self.record(state, host, op_hash)

    def operation_end(self, state, op_hash):  # type: ignore[override]  # pyinfra types callbacks static; this one keeps state
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

    def host_disconnect(self, state, host):  # type: ignore[override]  # pyinfra types callbacks static; this one keeps state
        # A reboot disconnects its host mid-run too: only the final disconnects count.
        if state.current_stage != StateStage.Disconnect:
            return
        self.disconnected.add(host.name)
        if len(self.disconnected) < len(state.activated_hosts):
            return
        self.finish(state)

    def finish(self, state) -> None:
        """Print (or write to SUMMARY_FILE_ENV's file) the summary, once."""
        if self.printed:
            return
        self.printed = True
        failed = {}
        for h in state.failed_hosts:
            if h not in state.activated_hosts:
                failed[h.name] = "unreachable: SSH connection failed"
            else:
                failed[h.name] = self.reason(state, h)
        path = os.environ.get(SUMMARY_FILE_ENV)
        if path:
            write_summary_file(path, failed, sys.argv)
            return
        for line in summary_lines(failed, sys.argv):
            print(line, file=sys.stderr)

    def at_exit(self, state) -> None:
        # Only for a run that stopped before its final disconnects (every host failed).
        try:
            if not self.printed and (state.failed_hosts or os.environ.get(SUMMARY_FILE_ENV)):
                self.finish(state)
        except Exception as e:  # at exit, never a traceback over pyinfra's own error
            print(f"(no failure summary: {e})", file=sys.stderr)


def write_summary_file(path: str, failed: dict[str, str], argv: list[str]) -> None:
    """The summary as JSON for python -m deploy shards: failed hosts, why, re-run commands."""
    data = {"failed": failed, "rerun": {h: rerun_command(argv, h) for h in failed}}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def install(state) -> None:
    """Register once per run (deploy.py is executed once per host)."""
    if id(state) in _installed_on:
        return
    _installed_on.add(id(state))
    handler = FailureSummary()
    state.add_callback_handler(handler)
    atexit.register(handler.at_exit, state)
