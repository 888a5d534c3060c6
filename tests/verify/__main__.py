"""python -m deploy verify --cluster FILE [--reports DIR] [options] [pytest args...]: check
every node, read-only. Its first line names the cluster file it checks.

Runs tests/verify against the nodes of that cluster.yaml, in parallel, after a first step that
asks every node at once whether it answers over SSH and which peers it reaches
(tests/verify/reach.py; `--reach-timeout SECONDS` bounds each wait, default 5: a dead node
costs that once and its column is SSH), prints a checks x nodes matrix with a hint for every
red cell (tests/verify/matrix.py), then each agent node's NVLink domains and the largest
slots_per_trial inside one domain on every agent node (from the topology checks' own
`nvidia-smi topo -m`), writes it all to verify-matrix.md and JUnit XML to verify-junit.xml in
the --reports directory, and exits with pytest's exit status: 0 when every check passed, 1
when any failed (or a node was unreachable); 10 (matrix.EXIT_NOT_PROBED) when none failed but
some cells are n/p (a node answered but its reachability probe did not run). Its last line names
the unreachable nodes first, with the first thing to look at. A cluster file with problems
stops it first, with exit status 2 and one line per problem.

It submits a smoke experiment to the master (tests/verify/test_smoke.py: a checkpoint saved and
restored from inside trials, a two-agent allreduce over the fabric, a single-agent one inside
one container; archived and cleaned up after; a row whose slots others' work holds is skipped
as busy). `--no-smoke` skips it, for a production cluster that must not run jobs; `-k smoke` runs
only it.

--reports DIR (also --drain-unhealthy's drain.log) defaults to one directory per cluster outside
the checkout: $XDG_STATE_HOME/gpu-cluster/reports/<name>, or ~/.local/state/gpu-cluster/
reports/<name> when XDG_STATE_HOME is unset; <name> is <env> for inventories/<env>/cluster.yaml,
else the file's name without .yaml (deploy/state.py). Other options go to pytest.

`python -m tests.verify [--cluster FILE] ...` is this command's alias for one release; without
--cluster it checks the lab's cluster.yaml, and its first line says so.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from deploy.cluster import ClusterError, load_cluster
from deploy.state import reports_dir
from tests.verify.matrix import EXIT_NOT_PROBED, NP

REPO = Path(__file__).resolve().parents[2]
LAB_CLUSTER = REPO / "inventories" / "lab" / "cluster.yaml"
PROG = "python -m tests.verify"
REPORTS_DEFAULT = (
    "$XDG_STATE_HOME/gpu-cluster/reports/<cluster name>, ~/.local/state/gpu-cluster/reports/"
    "<cluster name> without XDG_STATE_HOME; <cluster name>: <env> of inventories/<env>/cluster.yaml, "
    "else the file's name without .yaml"
)


def pytest_command(cluster: str, workers: str, reports: Path, rest: list[str]) -> list[str]:
    # Short tracebacks by default: the matrix carries the overview, tracebacks the detail.
    tb = [] if any(a.startswith("--tb") for a in rest) else ["--tb=short"]
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        workers,
        "--dist",
        "loadgroup",
        "-p",
        "tests.verify.matrix",
        f"--verify-matrix={reports / 'verify-matrix.md'}",
        *tb,
        "--cluster",
        cluster,
        f"--junitxml={reports / 'verify-junit.xml'}",
        str(REPO / "tests" / "verify"),
        *rest,
    ]


# pytest's -l/--showlocals prints every frame's local variables into the terminal and the JUnit
# file: the checks hold the cluster's secrets (admin password, MinIO keys) in locals.
SHOWLOCALS = "-l/--showlocals prints the checks' local variables, secrets included: not allowed here"


def shows_locals(args: list[str]) -> bool:
    for arg in args:
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            if len(name) > 4 and "--showlocals".startswith(name):  # argparse takes a prefix
                return True
        elif arg.startswith("-"):
            for letter in arg[1:]:
                if letter == "l":
                    return True
                if letter in "kmcpoWnr":  # an option taking a value: the rest is its value
                    break
    return False


def unreachable_first(matrix: Path, since: float = 0.0) -> str:
    """This run's matrix report's line naming the unreachable nodes and what to look at first
    (tests/verify/matrix.py dead_first), or "" (none, or no report written since `since`)."""
    try:
        if matrix.stat().st_mtime < since:
            return ""
        lines = matrix.read_text().splitlines()
    except OSError:
        return ""
    found = next((line for line in lines if line.startswith("- **UNREACHABLE ")), "")
    return found.removeprefix("- **").removesuffix("**").replace("\\|", "|")


def run_verdict(status: int) -> str:
    if status == 0:
        return "all checks passed"
    if status == EXIT_NOT_PROBED:
        return f"no check failed, but some cells were not probed ({NP}, exit status {status})"
    return f"FAILED (exit status {status})"


def add_arguments(parser: argparse.ArgumentParser, *, require_cluster: bool) -> None:
    """verify's own options; everything else goes to pytest. python -m deploy's `verify` verb
    adds them to its subparser too (require_cluster: there --cluster has no default)."""
    if require_cluster:
        parser.add_argument("--cluster", required=True, metavar="FILE", help="the cluster file to check")
    else:
        parser.add_argument(
            "--cluster",
            metavar="FILE",
            help=f"the cluster file to check (default: the lab's, {os.path.relpath(LAB_CLUSTER, REPO)})",
        )
    parser.add_argument(
        "--reports",
        metavar="DIR",
        help="write verify-matrix.md, verify-junit.xml and drain.log here (default: one directory "
        f"per cluster, outside the checkout: {REPORTS_DEFAULT})",
    )
    parser.add_argument("-n", "--workers", default="4", help="parallel workers (pytest-xdist)")
    parser.add_argument("--hardware", action="store_true", help="also the bandwidth rows (real GPUs)")
    parser.add_argument(
        "--drain-unhealthy", action="store_true", help="disable agents of nodes with red health rows"
    )
    parser.add_argument(
        "--no-smoke",
        action="store_true",
        help="do not submit the smoke experiment (a cluster that must not run jobs)",
    )


def main(argv: list[str] | None = None, *, prog: str = PROG, require_cluster: bool = False) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, require_cluster=require_cluster)
    args, rest = parser.parse_known_args(argv)
    cluster = args.cluster or str(LAB_CLUSTER)
    # First, before anything can fail: which cluster this run is about. The alias's lab
    # default is named as such, never taken silently.
    print(
        f"verify: cluster {cluster}" + ("" if args.cluster else " (no --cluster given: the lab's)"),
        flush=True,
    )
    if shows_locals(rest):
        print(f"{prog}: {SHOWLOCALS}", file=sys.stderr)
        return 2
    try:
        load_cluster(cluster)  # its problems one line each, here, not as pytest's collection errors
    except ClusterError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return 2
    # Absolute: pytest runs in the checkout, the user typed paths relative to where they are.
    reports = Path(args.reports).absolute() if args.reports else reports_dir(cluster)
    try:
        reports.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"{prog}: --reports {reports}: cannot create the directory ({e.strerror})", file=sys.stderr)
        return 2
    # tests/verify/drain.py: the options of the health rows and the drain; the drain's log goes
    # with the reports (a --drain-log in `rest` comes later and wins).
    flags = ["--hardware"] * args.hardware + ["--drain-unhealthy"] * args.drain_unhealthy
    flags += ["--no-smoke"] * args.no_smoke + [f"--drain-log={reports / 'drain.log'}"]
    rest = ["-p", "tests.verify.drain", *flags, *rest]
    print(
        "verify: smoke experiment OFF (--no-smoke): no job is submitted"
        if args.no_smoke
        else "verify: smoke experiment ON: four small experiments go to the master, archived after "
        "(--no-smoke for a cluster that must not run jobs)",
        flush=True,
    )
    started, wall_started = time.monotonic(), time.time()
    command = pytest_command(os.path.abspath(cluster), args.workers, reports, rest)
    status = subprocess.call(command, cwd=REPO)
    verdict = run_verdict(status)
    dead = unreachable_first(reports / "verify-matrix.md", since=wall_started)
    print(
        f"verify {cluster}: {dead + ' -- ' if dead else ''}{verdict}; "
        f"wall time {time.monotonic() - started:.1f}s; "
        f"matrix: {reports / 'verify-matrix.md'}",
        flush=True,
    )
    return status


if __name__ == "__main__":
    from deploy.cli import alias_note

    alias_note("tests.verify", "verify --cluster FILE")
    sys.exit(main())
