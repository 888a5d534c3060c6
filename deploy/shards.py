"""python -m deploy shards --cluster FILE [--shards N] [PYINFRA OPTIONS...]: the deploy as
several pyinfra processes, so that the controller uses more than one core. (deploy/cli.py: the
inventory is the one beside FILE, or generated. The old form `python -m deploy.shards
[--shards N] INVENTORY [PYINFRA OPTIONS...]` is an alias, for one release.)

pyinfra runs every host in one process on one core (gevent): at a few hundred hosts the
controller's planning is the slow part of a no-op re-deploy. This runs `pyinfra INVENTORY
deploy.py` as several processes, each limited to a shard of the hosts with pyinfra's own
`--limit` (the inventory, deploy.py and the re-run lines stay those of the plain deploy):

phase 1  the master and storage hosts, in one process;
phase 2  every other host (the agents), split into N shards run in parallel; N is
         os.cpu_count() unless --shards says otherwise, and never more than the hosts.

Phase 2 starts when phase 1 has finished, so the master and storage are deployed before any
agent, as deploy/site.py's barrier orders them in one process. If phase 1 fails on its hosts
the agents are still deployed, as the plain deploy does (their roles do not need the master:
an agent keeps retrying its master every 5 s and registers once the master is fixed and
re-deployed with the re-run line printed for it). If phase 1's process stops without naming a
failed host (a crash, a usage error), phase 2 is not started: the same error would stop every
shard; the agents are then listed as not deployed.

Each process writes its failure summary to a JSON file (deploy/summary.py, SUMMARY_FILE_ENV);
at the end one summary names every failed host with why and its re-run command, in the
format of the plain deploy's. Exit status: 0 when every process exited 0, otherwise the
highest exit status of any (1: hosts failed, as pyinfra's); a broken cluster.yaml stops with
2 before any process starts, as the plain deploy does.

The processes run with --yes (they cannot share one confirmation prompt); options that
prompt or that would print one JSON document per process are refused. Each output line is
prefixed with its shard. --limit and --exclude given here select hosts as pyinfra's do (a
group name, else a host-name pattern) before the split.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy.summary import SUMMARY_FILE_ENV, redact_argv, rerun_command, summary_lines

FIRST_GROUPS = ("master", "storage")  # phase 1: what the agents register with and store to
DEPLOY_FILE = "deploy.py"
# pyinfra 3.10 options (pyinfra_cli/cli.py) a sharded run cannot honour: prompts on a shared
# terminal, and --json (one document per process is not pyinfra's format).
REFUSED = {
    "--ssh-password-prompt": "prompts for the SSH password",
    "--use-sudo-password": "prompts for the sudo password",
    "--same-sudo-password": "prompts for the sudo password",
    "--json": "would print one JSON document per process",
}
SELECTORS = ("--limit", "--exclude")
PROG = "python -m deploy.shards"
COMMAND = tuple(shlex.split(PROG))


class ShardError(Exception):
    pass


@dataclass(frozen=True)
class Shard:
    label: str
    hosts: tuple[str, ...]


def inventory_groups(path: str) -> dict[str, list[str]]:
    """The inventory module's groups (lists of host names, or (name, data) tuples), as
    pyinfra reads them: each module-level list is a group. A broken cluster.yaml exits 2 here."""
    try:
        namespace = runpy.run_path(path)
    except SystemExit:
        raise  # deploy.inventory's one-line problems about cluster.yaml, exit 2
    except Exception as e:  # a YAML file given as INVENTORY, a syntax error, ...: no traceback
        raise ShardError(f"{path}: not a pyinfra inventory module ({type(e).__name__})") from None
    groups: dict[str, list[str]] = {}
    for name, value in namespace.items():
        if name.startswith("_") or not isinstance(value, list | tuple):
            continue
        hosts = [h[0] if isinstance(h, tuple) else h for h in value]
        if all(isinstance(h, str) for h in hosts):
            groups[name] = hosts
    return groups


def all_hosts(groups: dict[str, list[str]]) -> list[str]:
    """Every host once, in inventory order."""
    return list(dict.fromkeys(h for hosts in groups.values() for h in hosts))


def matching(groups: dict[str, list[str]], patterns: list[str]) -> set[str]:
    """pyinfra's --limit/--exclude rule: a group name selects its hosts, anything else is an
    fnmatch pattern on host names."""
    hosts = all_hosts(groups)
    found: set[str] = set()
    for pattern in patterns:
        found.update(groups[pattern] if pattern in groups else fnmatch.filter(hosts, pattern))
    return found


def split(hosts: list[str], n: int) -> list[list[str]]:
    """`hosts` in at most `n` contiguous shards whose sizes differ by at most one."""
    n = max(1, min(n, len(hosts)))
    size, extra = divmod(len(hosts), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(hosts[start:end])
        start = end
    return [s for s in out if s]


def plan(
    groups: dict[str, list[str]], shards: int, limit: list[str], exclude: list[str]
) -> tuple[Shard | None, list[Shard]]:
    """Phase 1 (master and storage hosts, one process) and phase 2 (the rest, in shards)."""
    selected = all_hosts(groups)
    if limit:
        chosen = matching(groups, limit)
        selected = [h for h in selected if h in chosen]
    if exclude:
        dropped = matching(groups, exclude)
        selected = [h for h in selected if h not in dropped]
    if not selected:
        raise ShardError("no host matches the given --limit/--exclude")
    first = {h for g in FIRST_GROUPS for h in groups.get(g, ())}
    phase1 = [h for h in selected if h in first]
    rest = [h for h in selected if h not in first]
    parts = split(rest, shards)
    return (
        Shard("master+storage", tuple(phase1)) if phase1 else None,
        [Shard(f"shard {i + 1}/{len(parts)}", tuple(p)) for i, p in enumerate(parts)],
    )


def parse_pyinfra_args(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(the options passed on, --limit patterns, --exclude patterns); refused options raise."""
    passed: list[str] = []
    limit: list[str] = []
    exclude: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in REFUSED:
            raise ShardError(f"{name}: {REFUSED[name]}; run plain pyinfra for this")
        if name == "--shards":
            raise ShardError("--shards: give it before INVENTORY (what follows INVENTORY goes to pyinfra)")
        if name in SELECTORS:
            if not eq:
                if i + 1 >= len(args):
                    raise ShardError(f"{name}: needs a value")
                i += 1
                value = args[i]
            (limit if name == "--limit" else exclude).append(value)
        elif arg in ("-y", "--yes", DEPLOY_FILE):
            pass  # always added once below
        else:
            passed.append(arg)
        i += 1
    return passed, limit, exclude


def pyinfra_argv(inventory: str, options: list[str], hosts: tuple[str, ...]) -> list[str]:
    """One process's command line: the plain deploy's, limited to `hosts`."""
    argv = [sys.executable, "-m", "pyinfra", "-y", *options, inventory, DEPLOY_FILE]
    for h in hosts:
        argv += ["--limit", h]
    return argv


@dataclass
class Outcome:
    shard: Shard
    argv: list[str]  # the plain command line (argv[0] "pyinfra"), without the shard's --limit
    rc: int
    failed: dict[str, str]
    rerun: dict[str, str]
    last_line: str


def _pump(stream, label: str, lines: list[str], lock: threading.Lock) -> None:
    """Copy a process's output, prefixed; keep what outcome() reads (not all of a long deploy's
    output): the lines naming an unreachable host, and the last line."""
    for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        if line.strip():
            if lines and not UNREACHABLE.search(lines[-1]):
                lines.pop()
            lines.append(line)
        with lock:
            sys.stdout.write(f"[{label}] {line}\n")
            sys.stdout.flush()


def run_phase(inventory: str, options: list[str], shards: list[Shard], workdir: Path) -> list[Outcome]:
    """Run the shards in parallel; their output streamed, each line prefixed with its shard."""
    lock = threading.Lock()
    running = []
    for i, shard in enumerate(shards):
        summary_file = workdir / f"{shard.label.replace('/', '-').replace(' ', '-')}-{i}.json"
        env = dict(os.environ, **{SUMMARY_FILE_ENV: str(summary_file)})
        proc = subprocess.Popen(
            pyinfra_argv(inventory, options, shard.hosts),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        lines: list[str] = []
        pump = threading.Thread(target=_pump, args=(proc.stdout, shard.label, lines, lock), daemon=True)
        pump.start()
        running.append((shard, proc, pump, lines, summary_file))
    outcomes = []
    for shard, proc, pump, lines, summary_file in running:
        rc = proc.wait()
        pump.join()
        plain = ["pyinfra", "-y", *options, inventory, DEPLOY_FILE]
        outcomes.append(outcome(shard, plain, rc, summary_file, lines))
    return outcomes


# pyinfra 3.10's line for a host it could not connect to (pyinfra/connectors/ssh.py raises
# "Could not connect (...)", pyinfra/api/host.py connect() prints it after the host prefix),
# printed before deploy.py (and so the summary) is loaded.
UNREACHABLE = re.compile(r"\[(?P<host>[^\]\s]+)\]\s+(?:\x1b\[[0-9;]*m)?Could not connect")


def outcome(shard: Shard, argv: list[str], rc: int, summary_file: Path, lines: list[str]) -> Outcome:
    """What one process left: its summary file, else (it stopped before deploy.py loaded) the
    hosts its output says it could not connect to."""
    try:
        data = json.loads(summary_file.read_text())
    except (OSError, ValueError):
        data = {}
    failed = {h: r for h, r in dict(data.get("failed") or {}).items() if h in shard.hosts}
    for line in lines:
        m = UNREACHABLE.search(line)
        if m and m.group("host") in shard.hosts:
            failed.setdefault(m.group("host"), "unreachable: SSH connection failed")
    rerun = {h: c for h, c in dict(data.get("rerun") or {}).items() if h in failed}
    for h in failed:
        rerun.setdefault(h, rerun_command(argv, h))
    return Outcome(shard, argv, rc, failed, rerun, lines[-1].strip() if lines else "")


def merged_lines(
    outcomes: list[Outcome], not_run: list[str], argv: list[str], command: Sequence[str] = COMMAND
) -> list[str]:
    """One summary in the plain deploy's format; a process that stopped without naming its
    failed hosts has each of its hosts named, with its last output line as the reason.
    `command` + `argv` re-run the hosts phase 1 kept from running."""
    failed: dict[str, str] = {}
    rerun: dict[str, str] = {}
    for o in outcomes:
        failed.update(o.failed)
        rerun.update(o.rerun)
        if o.rc != 0 and not o.failed:
            why = f"its pyinfra process ({o.shard.label}) exited {o.rc} without naming a failed host"
            for h in o.shard.hosts:
                failed[h] = f"{why}: {o.last_line}" if o.last_line else why
                rerun[h] = rerun_command(o.argv, h)
    lines = summary_lines(failed, ["pyinfra"], rerun)
    if not_run:
        again = shlex.join([*command, *redact_argv(argv)])
        lines.append(f"--> {len(not_run)} host(s) not deployed, phase 1 stopped: {', '.join(not_run)}")
        lines.append(f"      re-run: {again}")
    return lines


def main(argv: list[str] | None = None, *, prog: str = PROG, shown_argv: list[str] | None = None) -> int:
    """`prog` is the command as the user typed it, `shown_argv` its arguments (default
    `argv`): python -m deploy passes its own, which name the cluster file, not the inventory
    it derived, so that a re-run line repeats what the user typed."""
    name = prog.removeprefix("python -m ")  # the prefix of this command's own messages
    args = sys.argv[1:] if argv is None else argv
    try:
        return sharded(args, prog, name, args if shown_argv is None else shown_argv)
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached the pyinfra processes too
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def sharded(argv: list[str], prog: str, name: str, shown_argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Every option after INVENTORY is pyinfra's (pyinfra --help); deploy.py is implied.",
    )
    parser.add_argument("--shards", type=int, default=None, help="agent processes (default: os.cpu_count())")
    parser.add_argument("inventory", help="an inventory module, e.g. inventories/prod.py")
    parser.add_argument("pyinfra_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    shards = args.shards if args.shards is not None else (os.cpu_count() or 1)
    if shards < 1:
        print(f"--shards: {shards}: must be 1 or more", file=sys.stderr)
        return 2
    if not Path(args.inventory).is_file():
        print(f"{args.inventory}: no such inventory file", file=sys.stderr)
        return 2
    try:
        options, limit, exclude = parse_pyinfra_args(args.pyinfra_args)
        groups = inventory_groups(args.inventory)  # a broken cluster.yaml exits 2 here
        phase1, phase2 = plan(groups, shards, limit, exclude)
    except ShardError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    outcomes: list[Outcome] = []
    not_run: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-cluster-shards-") as tmp:
        if phase1 is not None:
            outcomes += run_phase(args.inventory, options, [phase1], Path(tmp))
        first = outcomes[0] if outcomes else None
        if first is not None and first.rc != 0 and not first.failed:
            not_run = [h for s in phase2 for h in s.hosts]
        elif phase2:
            outcomes += run_phase(args.inventory, options, phase2, Path(tmp))
    for line in merged_lines(outcomes, not_run, shown_argv, shlex.split(prog)):
        print(line, file=sys.stderr)
    return max([o.rc for o in outcomes] + [1 if not_run else 0])


if __name__ == "__main__":
    from deploy.cli import alias_note

    alias_note("deploy.shards", "shards --cluster FILE")
    sys.exit(main())
