"""python -m tests.verify [--cluster FILE] [pytest args...]: check every node, read-only.

Runs tests/verify against the nodes of a cluster.yaml (the lab's by default), in parallel,
writes JUnit XML to reports/verify-junit.xml, and exits non-zero when any check fails.
"""

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.verify", description=__doc__)
    parser.add_argument("--cluster", default=str(REPO / "inventories" / "lab" / "cluster.yaml"))
    parser.add_argument("-n", "--workers", default="4", help="parallel workers (pytest-xdist)")
    args, rest = parser.parse_known_args(argv)
    reports = REPO / "reports"
    reports.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", args.workers,
           "--cluster", args.cluster, f"--junitxml={reports / 'verify-junit.xml'}",
           str(REPO / "tests" / "verify"), *rest]
    return subprocess.call(cmd, cwd=REPO)


if __name__ == "__main__":
    sys.exit(main())
