"""Load and validate cluster.yaml into a typed, frozen model.

This package is the only place that knows the YAML's shape. `load_cluster(path)` reads the
file, checks everything it can without connecting anywhere, and either returns a `Cluster`
or raises `ClusterError` with every problem found, one line each:

    <file>: <key path>: <value>: <what is wrong>

Secret values never appear in a problem or a repr (see deploy/secrets.py).

    model.py    `Cluster`, composed of the sections, each a dataclass in its own module (ssh.py,
                network.py, preflight_keys.py, nodes.py, versions.py, sources.py,
                storage_keys.py, database.py, determined.py, hardware.py) whose fields declare
                their keys: type, check, default, description; the values derived from the
                keys (Cluster.trial_endpoint, Cluster.task_refs, Storage.determined_secret /
                backup_secret), computed once as the model is built
    keys.py     the key table's machinery: allowed keys, defaults, reading a section, doc rows
    loader.py   PyYAML read as YAML 1.2 with limits (depth, alias expansion); YAML 1.1 surprises
    reader.py   YAML with positions, duplicate keys, problems, unknown keys ("did you mean")
    checks.py   the field checks (ports, CIDRs, URLs, paths, hostnames, ...): nothing that reaches
                a node needs quoting
    rules.py    building the model and the checks that span keys; load_cluster
    docs.py     the key tables of docs/cluster-yaml.md
    cli.py      the command line (users: `python -m deploy check --cluster FILE`, deploy/cli.py)

    python -m deploy.cluster check FILE...     # "FILE: ok (N nodes)" or the problems, exit 0/2
    python -m deploy.cluster docs              # regenerate docs/cluster-yaml.md's key tables
"""

from deploy.cluster import model
from deploy.cluster.cli import main
from deploy.cluster.model import *  # noqa: F403  (the names model.__all__ lists, kept there once)
from deploy.cluster.reader import ClusterError
from deploy.cluster.rules import load_cluster

__all__ = ["ClusterError", "load_cluster", "main"]
__all__ += model.__all__
