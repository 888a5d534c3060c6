"""python -m deploy experiment new|lint ... (see __init__.py); python -m deploy.experiment is
its alias for one release."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.experiment import lint, template
from deploy.experiment.target import Target, TargetError, load


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


PROG = "python -m deploy.experiment"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    add_commands(p)
    return p


def add_commands(p: argparse.ArgumentParser) -> None:
    """`new` and `lint` as subcommands of `p`: this module's parser, and python -m deploy's
    `experiment` verb (deploy/cli.py), which lists them in its own --help."""
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in (("new", "write an experiment for the cluster"), ("lint", "check an experiment")):
        s = sub.add_parser(name, help=what)
        s.add_argument("--cluster", required=True, metavar="FILE", help="the cluster file (cluster.yaml)")
        s.add_argument(
            "--nvlink-slots",
            type=_positive,
            metavar="N",
            help="largest slots_per_trial inside one NVLink domain (python -m deploy verify prints it)",
        )
    new = sub.choices["new"]
    new.add_argument("--slots", type=_positive, default=1, metavar="N", help="slots_per_trial (default 1)")
    new.add_argument(
        "--example",
        choices=template.EXAMPLES,
        default=template.EXAMPLES[0],
        help="the model: a Core API linear fit (default), or a classifier that audits its fairness",
    )
    new.add_argument("--out", metavar="DIR", help="write DIR/experiment.yaml and DIR/model/ (default: print)")
    check = sub.choices["lint"]
    check.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    check.add_argument("experiment", metavar="EXPERIMENT_YAML")
    check.add_argument("model_dir", nargs="?", metavar="MODEL_DIR")


def new(args: argparse.Namespace, target: Target) -> int:
    warning = template.slots_warning(target, args.slots)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if args.out is None:
        print(template.experiment_yaml(target, args.slots, args.example), end="")
        print(f"# --- {template.MODEL_DIR}/train.py (written with --out DIR) ---")
        print("\n".join(f"# {line}".rstrip() for line in template.train_py(args.example).splitlines()))
        return 0
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"{out}: not a directory", file=sys.stderr)
        return 2
    try:
        written = template.write(target, args.slots, out, args.example)
    except OSError as e:
        print(f"{out}: cannot write ({e.strerror})", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    args = parser(prog).parse_args(argv)
    try:
        target = load(args.cluster, args.nvlink_slots)
    except TargetError as e:
        print("\n".join(e.lines), file=sys.stderr)
        return 2
    if args.command == "new":
        return new(args, target)
    problems = lint.lint(args.experiment, target, args.model_dir)
    for problem in problems:
        print(problem)
    failing = [p for p in problems if args.strict or not p.warning]
    if not problems:
        print(f"{args.experiment}: ok")
    return 1 if failing else 0


if __name__ == "__main__":
    from deploy.cli import alias_note

    alias_note("deploy.experiment", "experiment new|lint --cluster FILE")
    sys.exit(main())
