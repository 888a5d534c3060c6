"""python -m tests.verify [--cluster FILE] [pytest args...]: check every node, read-only.

Runs tests/verify against the nodes of a cluster.yaml (the lab's by default), in parallel,
prints a checks x nodes matrix with a hint for every red cell (tests/verify/matrix.py), then
each agent node's NVLink domains and the largest slots_per_trial inside one domain on every
agent node (from the topology checks' own `nvidia-smi topo -m`), writes it all to
reports/verify-matrix.md and JUnit XML to reports/verify-junit.xml, and exits non-zero when
any check fails (pytest's exit status).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.verify", description=__doc__)
    parser.add_argument("--cluster", default=str(REPO / "inventories" / "lab" / "cluster.yaml"))
    parser.add_argument("-n", "--workers", default="4", help="parallel workers (pytest-xdist)")
    args, rest = parser.parse_known_args(argv)
    if shows_locals(rest):
        print(f"python -m tests.verify: {SHOWLOCALS}", file=sys.stderr)
        return 2
    reports = REPO / "reports"
    reports.mkdir(exist_ok=True)
    started = time.monotonic()
    status = subprocess.call(pytest_command(args.cluster, args.workers, reports, rest), cwd=REPO)
    verdict = "all checks passed" if status == 0 else f"FAILED (exit status {status})"
    print(
        f"verify {args.cluster}: {verdict}; wall time {time.monotonic() - started:.1f}s; "
        f"matrix: {reports / 'verify-matrix.md'}",
        flush=True,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
