"""The command line (deploy/cluster/__main__.py runs it):

python -m deploy.cluster check FILE...   # "FILE: ok (N nodes)" or the problems, exit 0/2
python -m deploy.cluster docs            # regenerate the key tables of docs/cluster-yaml.md

Users check a file with `python -m deploy check --cluster FILE` (deploy/cli.py calls main
here); `python -m deploy.cluster check` is its alias for one release. `docs` is the
maintainers' command and stays.
"""

from __future__ import annotations

import sys

from deploy.cluster import docs
from deploy.cluster.reader import ClusterError
from deploy.cluster.rules import load_cluster

USAGE = "usage: python -m deploy.cluster check FILE... | python -m deploy.cluster docs"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["docs"]:
        changed = docs.write(docs.DOC)
        print(f"{docs.DOC}: {'updated' if changed else 'up to date'}")
        return 0
    if len(args) < 2 or args[0] != "check":
        print(USAGE, file=sys.stderr)
        return 2
    status = 0
    for file in args[1:]:
        try:
            cluster = load_cluster(file)
        except ClusterError as e:
            for problem in e.problems:
                print(problem, file=sys.stderr)
            status = 2
        else:
            print(f"{file}: ok ({len(cluster.nodes)} nodes)")
    return status
