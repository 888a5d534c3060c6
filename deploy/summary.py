"""The last lines of a deploy: which hosts failed, why, and the command to re-run for each.

pyinfra prints its Results table and then disconnects; the summary is printed (to stderr,
so `--json` stays pure) when the last connected host has disconnected.
"""

import shlex
import sys

from pyinfra.api.state import BaseStateCallback

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


class FailureSummary(BaseStateCallback):
    def __init__(self):
        self.reasons: dict[str, str] = {}
        self.disconnected = 0

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        if host.name not in self.reasons:
            names = state.get_op_meta(op_hash).names
            self.reasons[host.name] = f"failed at '{', '.join(sorted(names))}'"

    def host_disconnect(self, state, host):
        self.disconnected += 1
        if self.disconnected < len(state.activated_hosts):
            return
        failed = {}
        for h in state.failed_hosts:
            if h not in state.activated_hosts:
                failed[h.name] = "unreachable: SSH connection failed"
            else:
                failed[h.name] = self.reasons.get(h.name, "failed")
        for line in run_summary_lines(state) + summary_lines(failed, sys.argv):
            print(line, file=sys.stderr)


def install(state) -> None:
    """Register once per run (deploy.py is executed once per host)."""
    if id(state) in _installed_on:
        return
    _installed_on.add(id(state))
    state.add_callback_handler(FailureSummary())
