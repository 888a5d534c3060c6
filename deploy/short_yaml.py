"""The short cluster.yaml (master_host, master_port, agents, storage), derived from ours.

    python -m deploy short-yaml --cluster inventories/prod/cluster.yaml

Some operators keep this short file next to their runbooks: it is the shape of the article
this toolkit grew from. This derives it from the model so the two never disagree. It carries
secret references, never secret values, and no `region` key (Determined rejects one; see
docs/cluster-yaml.md).

The verb is named after what it writes, a short cluster.yaml, rather than after that article,
a document the toolkit's users do not have (the old name, `python -m deploy.article FILE`,
stays an alias for one release: deploy/article.py); and not "summary", which is already the
deploy's closing summary of failed hosts (deploy/summary.py).
"""

from __future__ import annotations

import sys

import yaml

from deploy.cluster import Cluster, ClusterError, load_cluster
from deploy.secrets import Secret


class _Flow(dict):
    """A mapping written inline, so a reference reads `{env: NAME}` as in cluster.yaml."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)
)


def _reference(secret: Secret) -> _Flow:
    ref = secret.reference
    return _Flow({ref.kind: ref.target})


def render_short_yaml(cluster: Cluster) -> str:
    storage = {
        "type": "s3",
        "bucket": cluster.storage.bucket,
        "endpoint_url": cluster.storage.endpoint_url,
        "access_key": _reference(cluster.storage.access_key),
        "secret_key": _reference(cluster.storage.secret_key),
    }
    if cluster.storage.prefix:
        storage["prefix"] = cluster.storage.prefix
    document = {
        "master_host": str(cluster.master_node.address),
        "master_port": cluster.master_port,
        "agents": [{"host": str(a.address), "slots": a.slots} for a in cluster.agents],
        "storage": storage,
    }
    header = (
        f"# The short cluster.yaml, generated from {cluster.path} by\n"
        f"# `python -m deploy short-yaml --cluster {cluster.path}`: edit that file, not this one.\n"
        "# Secrets are references ({env: NAME} / {file: PATH}), never values.\n"
        "# No region key: Determined rejects unknown keys; the region is MinIO's site region\n"
        f"# ({cluster.storage.region}) and AWS_DEFAULT_REGION in every S3 client's environment.\n"
        "# There is no `det-deploy on-prem`: deploy with `pyinfra inventories/<env>.py deploy.py`.\n"
    )
    return header + yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def main(argv: list[str] | None = None, *, prog: str = "python -m deploy.article") -> int:
    """argv: [CLUSTER_YAML] (python -m deploy short-yaml checks its own --cluster first)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: {prog} CLUSTER_YAML", file=sys.stderr)
        return 2
    try:
        # Only the references are written out: no need to have the secrets at hand.
        cluster = load_cluster(args[0], resolve_secrets=False)
    except ClusterError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return 2
    sys.stdout.write(render_short_yaml(cluster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
