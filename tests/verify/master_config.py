"""What cluster.yaml implies for the Determined master's configuration: verify's own oracle.

Written from the model (deploy/cluster: the values cluster.yaml gives and the ones derived from
it once, like Cluster.trial_endpoint and Cluster.task_refs) and from Determined's master.yaml as
Determined 0.38 reads it (master/internal/config/config.go Config, master/pkg/model
task_container_defaults.go, schemas/expconf/v0/s3.json), never from the deploy's template
(files/determined/master.yaml.j2) or the role that renders it: re-rendering the template and
comparing would pass a template that writes the wrong value, since it would agree with itself.

expected_master_yaml(cluster) is the expectation as a tree; differences(held, expected) says
what differs, one line per key, never a secret's value (Hidden leaves are compared, not shown).
Only what cluster.yaml decides is asserted: the deploy's fixed choices that no key changes
(save_trial_best and the like) are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deploy import minio_node
from deploy.cluster import Cluster
from deploy.determined_node import MASTER_CRT, MASTER_KEY
from deploy.secrets import Secret


class _Absent:
    def __repr__(self) -> str:
        return "none"


# The key must not be there: a file leaves it out, the running master prints it empty or null.
ABSENT: Any = _Absent()


@dataclass(frozen=True)
class Hidden:
    """A secret the key must hold: compared by value, named by `what` in a difference."""

    secret: Secret
    what: str

    def __repr__(self) -> str:
        return self.what


@dataclass(frozen=True)
class Environment:
    """task_container_defaults.environment_variables: a list of `NAME=value` (Determined's
    RuntimeItems, one list for every device type), compared as names and values in any order."""

    variables: dict[str, str]

    def __repr__(self) -> str:
        return repr([f"{k}={v}" for k, v in self.variables.items()])


def expected_task_container_defaults(cluster: Cluster) -> dict[str, Any]:
    """What every trial container gets, as cluster.yaml implies it."""
    ca = cluster.storage.tls.ca_certificate
    env = {"AWS_DEFAULT_REGION": cluster.storage.region}  # S3 clients sign for MinIO's region
    if cluster.network.nccl_ib_hca:
        env["NCCL_IB_HCA"] = cluster.network.nccl_ib_hca
    if ca is not None:
        # boto3 and requests in the trial trust the node's bundle, which holds the storage CA.
        env["AWS_CA_BUNDLE"] = env["REQUESTS_CA_BUNDLE"] = minio_node.CONTAINER_BUNDLE
    # No NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: Environment is the whole list, so either
    # one there is a difference (a one-agent trial on Docker's bridge network has no such port).
    bundle = {
        "host_path": minio_node.SYSTEM_BUNDLE,
        "container_path": minio_node.CONTAINER_BUNDLE,
        "read_only": True,
    }
    return {
        # Determined's own default images need CUDA 12.4; these are the ones the agents pulled.
        "image": {"cuda": cluster.task_refs.gpu, "cpu": cluster.task_refs.cpu},
        "shm_size_bytes": cluster.determined.shm_size_bytes,
        # Only when every agent names its IPoIB port alike (Cluster.dtrain_interface).
        "dtrain_network_interface": cluster.dtrain_interface or ABSENT,
        # InfiniBand in trials: the devices and the right to lock memory for RDMA buffers.
        "add_capabilities": ["IPC_LOCK"],
        "devices": [{"host_path": "/dev/infiniband", "container_path": "/dev/infiniband"}],
        "bind_mounts": [bundle] if ca is not None else ABSENT,
        "environment_variables": Environment(env),
    }


def expected_master_yaml(cluster: Cluster) -> dict[str, Any]:
    db, storage, determined = cluster.database, cluster.storage, cluster.determined
    return {
        "port": cluster.master_port,
        # PostgreSQL runs beside the master and listens on localhost only (roles/postgresql/server.py).
        "db": {
            "user": db.user,
            "password": Hidden(db.password, "database.password"),
            "host": "localhost",
            "port": db.port,
            "name": db.name,
        },
        "checkpoint_storage": {
            "type": "s3",
            "bucket": storage.bucket,
            # Determined's bucket-only user, never MinIO's root (deploy/minio_admin.py).
            "access_key": storage.determined_user,
            "secret_key": Hidden(storage.determined_secret, "storage.determined_user's secret key"),
            # The storage node as trial containers reach it (Docker's bridge network has no
            # /etc/hosts of the node's), without a trailing slash.
            "endpoint_url": cluster.trial_endpoint,
            "prefix": storage.prefix or ABSENT,
            # Determined's S3 storage has no region (s3.json, additionalProperties: false): the
            # master refuses to start with one.
            "region": ABSENT,
        },
        "security": {
            "initial_user_password": Hidden(determined.admin_password, "determined.admin_password"),
            # determined.tls: the master serves https with these files, and only then.
            "tls": {"cert": MASTER_CRT, "key": MASTER_KEY} if determined.tls.enabled else ABSENT,
        },
        "task_container_defaults": expected_task_container_defaults(cluster),
    }


def _empty(value: Any) -> bool:
    return value is None or value in ("", [], {})


def _environment(held: Any, want: Environment, path: str) -> list[str]:
    if not isinstance(held, list) or not all(isinstance(item, str) and "=" in item for item in held):
        return [f"{path} is {held!r}, not a list of NAME=value; cluster.yaml implies {want!r}"]
    found: dict[str, str] = {}
    out = []
    for item in held:
        name, _, value = item.partition("=")
        if name in found:
            out.append(f"{path} sets {name} twice")
        found[name] = value
    for name in sorted(set(found) | set(want.variables)):
        if name not in found:
            out.append(f"{path} lacks {name}={want.variables[name]}")
        elif name not in want.variables:
            out.append(f"{path} has {name}={found[name]}, which cluster.yaml does not imply")
        elif found[name] != want.variables[name]:
            out.append(f"{path} has {name}={found[name]}, cluster.yaml implies {name}={want.variables[name]}")
    return out


def differences(held: Any, expected: Any, path: str = "") -> list[str]:
    """What in `held` (master.yaml as YAML, or the running master's configuration) differs from
    `expected`, one line per key, e.g. "checkpoint_storage.endpoint_url is 'http://m1:9000',
    cluster.yaml implies 'http://10.0.0.5:9000'". Keys `expected` does not name are not looked
    at (tests/verify/test_determined.py's unknown_keys checks them against Determined's)."""
    shown = path or "(top level)"
    if isinstance(expected, dict):
        if not isinstance(held, dict):
            return [f"{shown} is {held!r}, not a mapping"]
        out = []
        for key, want in expected.items():
            where = f"{path}.{key}" if path else key
            if want is ABSENT:
                if not _empty(held.get(key)):
                    out.append(f"{where} is {held[key]!r}, cluster.yaml implies none")
            elif key not in held:
                out.append(f"{where} is missing, cluster.yaml implies {want!r}")
            else:
                out += differences(held[key], want, where)
        return out
    if isinstance(expected, Hidden):  # neither value is shown
        return [] if held == expected.secret.value else [f"{shown} is not {expected.what}"]
    if isinstance(expected, Environment):
        return _environment(held, expected, shown)
    # type() too: YAML's `port: "23457"` is a string the master refuses, and True == 1.
    if type(held) is not type(expected) or held != expected:
        return [f"{shown} is {held!r}, cluster.yaml implies {expected!r}"]
    return []
