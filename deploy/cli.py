"""python -m deploy VERB --cluster FILE ...: the toolkit's one command line.

Every verb names the cluster the same way, by its cluster file (--cluster FILE, required), and
hands the work to the module that has always done it, with that module's own arguments:

    check --cluster FILE                  deploy.cluster.cli.main(["check", FILE])
    verify --cluster FILE [--reports DIR] [verify's options] [pytest args]
                                          tests.verify.__main__.main(the same arguments)
    rebuild --cluster FILE NODE [--timeout S] [--force] [pyinfra options]
                                          deploy.rebuild.main([INVENTORY, NODE, ...])
    shards --cluster FILE [--shards N] [pyinfra options]
                                          deploy.shards.main([--shards N, INVENTORY, ...])
    experiment new|lint --cluster FILE ...
                                          deploy.experiment.__main__.main(the same arguments)
    short-yaml --cluster FILE             deploy.short_yaml.main([FILE])
    restore-drill --cluster FILE [--backup-first] [pyinfra options]
                                          deploy.restore_drill.main(INVENTORY, FILE, ...)
    upgrade --cluster FILE [-y] [--max-unavailable N] [--canary NODE] [--drain-timeout S]
            [--pause-experiments] [--timeout S] [pyinfra options]
                                          deploy.rolling.main(INVENTORY, options, ...)

rebuild, shards, restore-drill and upgrade run pyinfra, which takes an inventory module rather than
a cluster file: it is inventories/<env>.py for inventories/<env>/cluster.yaml when that module
exists, else one generated for FILE (deploy/inventory.py inventory_for). The deploy itself stays pyinfra's own
command: `pyinfra -y inventories/<env>.py deploy.py`.

The old commands (python -m deploy.cluster check, deploy.rebuild, deploy.shards,
deploy.experiment, deploy.article, tests.verify) still work, as aliases for one release.

A cluster file that cannot be read is one line naming it, exit status 2, before any module is
called; a file with problems is the module's: one line per problem, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from collections.abc import Callable

from deploy.inventory import InventoryError, inventory_for

PROG = "python -m deploy"


def alias_note(old: str, verb: str) -> None:
    """The one line an old command prints before it runs (stderr: its output stays the same)."""
    print(
        f"note: `python -m {old}` is an alias kept for one release: use `{PROG} {verb}`",
        file=sys.stderr,
        flush=True,
    )


def _module(name: str):
    """Imported when its verb runs: verify and experiment pull in pytest and jsonschema
    (0.7 s each), which `check` has no use for."""
    return importlib.import_module(name)


def unreadable(file: str) -> str | None:
    """The one line for a cluster file that cannot be read, or None."""
    try:
        with open(file, "rb"):
            return None
    except OSError as e:
        return f"{file}: cannot read the cluster file ({e.strerror})"


def _inventory(file: str) -> str:
    """The inventory for `file`, as it is shown and passed to pyinfra: relative to the working
    directory when FILE was given so (pyinfra's re-run lines repeat it)."""
    path, generated = inventory_for(file)
    shown = str(path) if os.path.isabs(file) or generated else os.path.relpath(path)
    if generated:
        # Said once, on stderr (stdout stays pyinfra's): the file exists for re-runs by hand.
        print(f"--> {PROG}: no inventory module beside {file}: using {shown} (generated)", file=sys.stderr)
    return shown


# The verbs parsed here: f(their options, the options they pass on, their argv as typed).


def check(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    return _module("deploy.cluster.cli").main(["check", args.cluster])


def short_yaml(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    return _module("deploy.short_yaml").main([args.cluster], prog=f"{PROG} short-yaml")


def rebuild(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    timeout = ["--timeout", str(args.timeout)] if args.timeout is not None else []
    force = ["--force"] if args.force else []
    return _module("deploy.rebuild").main(
        [_inventory(args.cluster), args.node, *timeout, *force, *extra],
        prog=f"{PROG} rebuild",
        cluster_args=["--cluster", args.cluster],
    )


def shards(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    count = ["--shards", str(args.shards)] if args.shards is not None else []
    return _module("deploy.shards").main(
        [*count, _inventory(args.cluster), *extra], prog=f"{PROG} shards", shown_argv=argv
    )


def restore_drill(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    return _module("deploy.restore_drill").main(
        _inventory(args.cluster), args.cluster, args.backup_first, extra
    )


def upgrade(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    # The command that resumes a stopped rollout is the one typed, with -y.
    args.again = shlex.join([*shlex.split(PROG), "upgrade", *argv, *([] if args.yes else ["-y"])])
    return _module("deploy.rolling").main(_inventory(args.cluster), args, extra)


OWN: dict[str, Callable[[argparse.Namespace, list[str], list[str]], int]] = {
    "check": check,
    "short-yaml": short_yaml,
    "rebuild": rebuild,
    "shards": shards,
    "restore-drill": restore_drill,
    "upgrade": upgrade,
}
TAKES_NO_MORE = ("check", "short-yaml")  # the others pass what they do not know to pyinfra


def verify(argv: list[str]) -> int:
    return _module("tests.verify.__main__").main(argv, prog=f"{PROG} verify", require_cluster=True)


def experiment(argv: list[str]) -> int:
    return _module("deploy.experiment.__main__").main(argv, prog=f"{PROG} experiment")


# Verbs whose module parses the whole command line itself (and prints its own --help): their
# arguments go to it untouched, `--` and all.
PASSED_ON: dict[str, Callable[[list[str]], int]] = {"verify": verify, "experiment": experiment}

# One line each in `python -m deploy --help`, written out as they are (argparse would wrap a
# subcommand's help below a name as long as "experiment"): at most 62 characters.
HELP = {
    "check": "validate the cluster file; no host is touched",
    "verify": "check every node, read-only: the checks x nodes matrix",
    "rebuild": "rebuild one node: agents out, deploy it alone, agents back",
    "shards": "the deploy as parallel pyinfra processes, for many nodes",
    "experiment": "new | lint: write or check an experiment configuration",
    "short-yaml": "print the short cluster.yaml (master, agents, storage)",
    "restore-drill": "restore the newest database backup apart, and check it",
    "upgrade": "roll a changed cluster file through, batch by batch",
}


def _cluster_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, metavar="FILE", help="the cluster file (cluster.yaml)")


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The front door's parser, and each verb's own (for the verbs parsed here)."""
    width = max(map(len, HELP)) + 2
    listing = "\n".join(f"  {name:<{width}}{text}" for name, text in HELP.items())
    top = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="One command line for the toolkit; every verb takes --cluster FILE.\n\nverbs:\n"
        + listing,
        epilog=f"`{PROG} VERB --help`: a verb's options.\n"
        "The deploy itself: pyinfra -y inventories/<env>.py deploy.py (docs/operations.md).",
        allow_abbrev=False,
    )
    sub = top.add_subparsers(dest="verb", required=True, metavar="VERB", help="one of the verbs above")
    verbs: dict[str, argparse.ArgumentParser] = {}
    for name, text in HELP.items():
        # allow_abbrev=False: an option meant for pyinfra or pytest is never taken for a
        # prefix of one of ours (--c for --cluster).
        passed_on = name in PASSED_ON
        # No help=: the listing above is the one line per verb.
        verbs[name] = sub.add_parser(name, description=text, add_help=not passed_on, allow_abbrev=False)
        if not passed_on:
            _cluster_option(verbs[name])
    verbs["rebuild"].add_argument("node", metavar="NODE", help="hostname of the node, as in FILE")
    verbs["rebuild"].add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="wait for the master and agents after the deploy (300)",
    )
    verbs["rebuild"].add_argument(
        "--force", action="store_true", help="rebuild although the node runs trials (they are killed)"
    )
    verbs["rebuild"].epilog = "Other options (after NODE) go to pyinfra; docs/operations.md."
    verbs["shards"].add_argument("--shards", type=int, metavar="N", help="agent processes (os.cpu_count())")
    verbs["shards"].epilog = "Other options go to pyinfra (pyinfra --help); deploy.py is implied."
    verbs["restore-drill"].add_argument(
        "--backup-first",
        action="store_true",
        help="take a backup just before (pg-backup backup --reason drill)",
    )
    verbs["restore-drill"].epilog = "Other options go to pyinfra; docs/operations.md."
    up = verbs["upgrade"]
    up.add_argument("-y", "--yes", action="store_true", help="carry the plan out (without: print it)")
    up.add_argument("--max-unavailable", type=int, default=1, metavar="N", help="agent nodes out at once (1)")
    up.add_argument("--canary", metavar="NODE", help="this agent node first, alone")
    up.add_argument(
        "--drain-timeout", type=float, default=600, metavar="SECONDS", help="wait for a node's trials (600)"
    )
    up.add_argument(
        "--pause-experiments",
        action="store_true",
        help="past --drain-timeout, pause the experiments on the node; activate them after",
    )
    up.add_argument(
        "--timeout", type=float, default=300, metavar="SECONDS", help="wait for agents after a deploy (300)"
    )
    up.epilog = "Other options go to pyinfra; docs/operations.md (Rolling changes)."
    return top, verbs


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    top, verbs = parser()
    if not args or args[0] not in verbs:
        top.parse_args(args)  # --help (exit 0), or argparse's usage error naming the verbs (exit 2)
        return 2
    verb, rest = args[0], args[1:]
    if verb in PASSED_ON:
        return PASSED_ON[verb](rest)
    parsed, extra = verbs[verb].parse_known_args(rest)
    if extra and verb in TAKES_NO_MORE:
        verbs[verb].error(f"unrecognized arguments: {' '.join(extra)}")
    problem = unreadable(parsed.cluster)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        return OWN[verb](parsed, extra, rest)
    except InventoryError as e:
        print(e, file=sys.stderr)
        return 2
