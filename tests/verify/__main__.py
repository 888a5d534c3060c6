"""python -m tests.verify [--cluster FILE] [pytest args...]: check every node, read-only.

Runs tests/verify against the nodes of a cluster.yaml (the lab's by default), in parallel,
after a first step that asks every node at once whether it answers over SSH and which peers it
reaches (tests/verify/reach.py; `--reach-timeout SECONDS` bounds each wait, default 5: a dead
node costs that once and its column is SSH), prints a checks x nodes matrix with a hint for
every red cell (tests/verify/matrix.py), then each agent node's NVLink domains and the largest
slots_per_trial inside one domain on every agent node (from the topology checks' own
`nvidia-smi topo -m`), writes it all to reports/verify-matrix.md and JUnit XML to
reports/verify-junit.xml, and exits with pytest's exit status: 0 when every check passed, 1
when any failed (or a node was unreachable); 10 (matrix.EXIT_NOT_PROBED) when none failed but
some cells are n/p (a node answered but its reachability probe did not run). Its last line names
the unreachable nodes first, with the first thing to look at.

It submits a smoke experiment to the master (tests/verify/test_smoke.py: a checkpoint saved and
restored from inside trials, a two-agent allreduce over the fabric, a single-agent one inside
one container; archived and cleaned up after; a row whose slots others' work holds is skipped
as busy). `--no-smoke` skips it, for a production cluster that must not run jobs; `-k smoke` runs
only it.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

from tests.verify.matrix import EXIT_NOT_PROBED, NP

REPO = Path(__file__).resolve().parents[2]


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.verify", description=__doc__)
    parser.add_argument("--cluster", default=str(REPO / "inventories" / "lab" / "cluster.yaml"))
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
    args, rest = parser.parse_known_args(argv)
    # tests/verify/drain.py: the options of the health rows and the drain.
    flags = ["--hardware"] * args.hardware + ["--drain-unhealthy"] * args.drain_unhealthy
    flags += ["--no-smoke"] * args.no_smoke
    rest = ["-p", "tests.verify.drain", *flags, *rest]
    if shows_locals(rest):
        print(f"python -m tests.verify: {SHOWLOCALS}", file=sys.stderr)
        return 2
    print(
        "verify: smoke experiment OFF (--no-smoke): no job is submitted"
        if args.no_smoke
        else "verify: smoke experiment ON: four small experiments go to the master, archived after "
        "(--no-smoke for a cluster that must not run jobs)",
        flush=True,
    )
    reports = REPO / "reports"
    reports.mkdir(exist_ok=True)
    started, wall_started = time.monotonic(), time.time()
    status = subprocess.call(pytest_command(args.cluster, args.workers, reports, rest), cwd=REPO)
    verdict = run_verdict(status)
    dead = unreachable_first(reports / "verify-matrix.md", since=wall_started)
    print(
        f"verify {args.cluster}: {dead + ' -- ' if dead else ''}{verdict}; "
        f"wall time {time.monotonic() - started:.1f}s; "
        f"matrix: {reports / 'verify-matrix.md'}",
        flush=True,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
