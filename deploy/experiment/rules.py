"""This cluster's rules for an experiment config (lint.py runs them after Determined's schema).

Each returns Problems; docs/experiments.md lists them with the pitfall each prevents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deploy.cluster.images import IMAGE_REF, too_new
from deploy.experiment.target import Target


@dataclass(frozen=True)
class Problem:
    file: str
    key: str
    value: Any
    what: str
    warning: bool = False

    def __str__(self) -> str:
        value = self.value if isinstance(self.value, str) else repr(self.value)
        if not value.isprintable():
            value = repr(value)  # one line, whatever the file holds
        if len(value) > 120:
            value = value[:117] + "..."
        return f"{self.file}: {self.key}: {value}: {'warning: ' if self.warning else ''}{self.what}"


def get(config: dict, *keys: str) -> Any:
    node: Any = config
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def integer(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _batch_sizes(hp: Any) -> list[int]:
    """global_batch_size values a hyperparameter may take: an int, {type: const, val},
    {type: categorical, vals}; ranges (int) are not enumerated."""
    if integer(hp) is not None:
        return [hp]
    if isinstance(hp, dict):
        if hp.get("type") == "const" and integer(hp.get("val")) is not None:
            return [hp["val"]]
        if hp.get("type") == "categorical" and isinstance(hp.get("vals"), list):
            return [v for v in hp["vals"] if integer(v) is not None]
    return []


def fit(f: str, slots: int, target: Target) -> list[Problem]:
    """A trial Determined's agent scheduler can never place: it waits in the queue forever.

    master/internal/rm/agentrm/fitting.go at v0.38.0: a trial larger than one agent takes ALL
    the slots of each agent it uses, from agents of one size whose slots divide it
    ("slots per trial must be either set to 1 or a multiple of the GPUs per agent"); mixed
    sizes only with the resource pool's allow_heterogeneous_fits, which master.yaml leaves off.
    """
    key = "resources.slots_per_trial"
    if slots > target.total_slots:
        return [
            Problem(
                f,
                key,
                slots,
                f"more than all {target.total_slots} agent slots of this cluster: "
                f"the trial is never scheduled; use at most {target.agent_slots}",
            )
        ]
    sizes = target.agent_sizes
    if sizes is None or slots <= max(sizes, default=0):
        return []  # per_domain agents' sizes are read on the nodes; one agent fits it anyway
    groups = {size: sizes.count(size) * size for size in set(sizes) if size}
    if any(slots % size == 0 and total >= slots for size, total in groups.items()):
        return []
    multiples = ", ".join(
        str(size * k) for size in sorted(groups) for k in range(1, groups[size] // size + 1)
    )
    return [
        Problem(
            f,
            key,
            slots,
            "a multi-agent trial takes whole agents of one size (Determined's "
            f"fitting.go): this one is never scheduled; use one of {multiples}",
        )
    ]


# The collectives' socket interface variables: find or fail on the names they list.
SOCKET_IFNAMES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _names_fabric_in_bridge(value: str, config: dict, target: Target) -> bool:
    """Whether a trial that fits on one agent (bridge network: eth0 and lo) is told to use one
    of the agents' IPoIB ports. NCCL reads a comma list of prefixes (`=` exact, `^` excludes:
    an exclusion names nothing to find); Gloo an exact name."""
    slots = integer(get(config, "resources", "slots_per_trial")) or 1
    if slots > target.agent_slots or value.startswith("^"):
        return False
    wanted = {n for n in value.lstrip("=").split(",") if n}
    return any(
        port.startswith(n) or port == n for n in wanted for port in target.fabric_interfaces.split(",")
    )


def storage_rules(f: str, config: dict, target: Target) -> list[Problem]:
    """checkpoint_storage: no region key, S3 only, this cluster's bucket and endpoint."""
    found: list[Problem] = []
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict):
        return found
    if "region" in storage:
        found.append(
            Problem(
                f,
                "checkpoint_storage.region",
                storage["region"],
                "Determined's s3 storage has no region key (the master refuses the experiment); "
                f"remove it: trial containers get AWS_DEFAULT_REGION={target.region} from master.yaml, "
                "set AWS_DEFAULT_REGION under environment.environment_variables to override it",
            )
        )
    if storage.get("type") not in (None, "s3"):
        found.append(
            Problem(
                f,
                "checkpoint_storage.type",
                storage.get("type"),
                "this cluster stores checkpoints on its MinIO over S3: use type: s3, "
                f"bucket: {target.bucket}",
            )
        )
        return found
    bucket, endpoint = storage.get("bucket"), storage.get("endpoint_url")
    if bucket is not None and bucket != target.bucket:
        found.append(
            Problem(
                f,
                "checkpoint_storage.bucket",
                bucket,
                f"not this cluster's bucket: MinIO has {target.bucket!r} (storage.bucket); "
                "write that, or leave the key out to use the master's",
            )
        )
    if endpoint is not None and str(endpoint).rstrip("/") != target.endpoint_url:
        found.append(
            Problem(
                f,
                "checkpoint_storage.endpoint_url",
                endpoint,
                f"not this cluster's MinIO as trial containers reach it: write {target.endpoint_url} "
                "(a hostname from /etc/hosts does not resolve in bridge-network containers), "
                "or leave the key out to use the master's",
            )
        )
    return found


def environment_rules(f: str, config: dict, target: Target) -> list[Problem]:
    """environment_variables: no socket interface a bridge-network trial lacks, MinIO's region."""
    found: list[Problem] = []
    env = get(config, "environment", "environment_variables")
    lists = env.values() if isinstance(env, dict) else [env]
    for values in lists:
        for item in values if isinstance(values, list) else []:
            name, _, value = str(item).partition("=")
            if name in SOCKET_IFNAMES and _names_fabric_in_bridge(value, config, target):
                found.append(
                    Problem(
                        f,
                        "environment.environment_variables",
                        item,
                        "this trial fits on one agent, so Determined runs it on Docker's bridge network, "
                        "where only eth0 and lo exist: NCCL and Gloo fail on a named interface that is "
                        'not there (NCCL: "Bootstrap : no socket interface found"); remove it (name '
                        "the IPoIB ports only for a trial that spans agents)",
                    )
                )
            if name in ("AWS_DEFAULT_REGION", "AWS_REGION") and value != target.region:
                found.append(
                    Problem(
                        f,
                        "environment.environment_variables",
                        item,
                        f"MinIO's region is {target.region} (storage.region): a signature for another "
                        "region fails every checkpoint upload (MinIO answers AuthorizationHeaderMalformed: "
                        "the region is wrong); remove it",
                    )
                )
    return found


def affinity_rules(f: str, config: dict, target: Target) -> list[Problem]:
    """gpu_affinity is no Determined key (the article's advice): per_domain agents do that."""
    resources = config.get("resources")
    if "gpu_affinity" not in config and not (isinstance(resources, dict) and "gpu_affinity" in resources):
        return []
    key = "gpu_affinity" if "gpu_affinity" in config else "resources.gpu_affinity"
    return [
        Problem(
            f,
            key,
            get(config, *key.split(".")),
            "Determined has no gpu_affinity (the master refuses the experiment); remove it: on this "
            "cluster an agent_layout: per_domain agent keeps a trial inside one NVLink domain",
        )
    ]


def slots_rules(f: str, config: dict, target: Target) -> list[Problem]:
    """slots_per_trial against the agents (fit), one agent, one NVLink domain; the batch split."""
    found: list[Problem] = []
    slots = integer(get(config, "resources", "slots_per_trial"))
    if slots is None or slots <= 1:
        return found
    found += fit(f, slots, target)
    if slots > target.agent_slots:
        found.append(
            Problem(
                f,
                "resources.slots_per_trial",
                slots,
                warning=True,
                what=(
                    f"more than one agent's {target.agent_slots} slots: the trial spans agents and its "
                    "collectives cross the IPoIB fabric; use at most that many unless the model "
                    "needs more"
                ),
            )
        )
    elif target.nvlink_slots is not None and slots > target.nvlink_slots:
        found.append(
            Problem(
                f,
                "resources.slots_per_trial",
                slots,
                warning=True,
                what=(
                    f"more than the largest NVLink domain every agent node has ({target.nvlink_slots}): "
                    f"collectives cross PCIe; use at most {target.nvlink_slots}"
                ),
            )
        )
    for size in _batch_sizes(get(config, "hyperparameters", "global_batch_size")):
        if size % slots:
            found.append(
                Problem(
                    f,
                    "hyperparameters.global_batch_size",
                    size,
                    f"not divisible by slots_per_trial {slots}: it is the batch of all ranks together, "
                    f"each rank gets {size // slots} and {size % slots} record(s) are lost per step; "
                    f"use a multiple of {slots} (e.g. {(size // slots + 1) * slots})",
                )
            )
    return found


def image_rules(f: str, config: dict, target: Target) -> list[Problem]:
    """environment.image: a CUDA the pinned driver runs."""
    found: list[Problem] = []
    image = get(config, "environment", "image")
    refs = image.items() if isinstance(image, dict) else [("", image)]
    for kind, ref in refs:
        if isinstance(ref, str) and IMAGE_REF.fullmatch(ref):
            why = too_new(ref, target.driver)
            if why:
                key = f"environment.image.{kind}" if kind else "environment.image"
                found.append(Problem(f, key, ref, f"{why}; use the pinned {target.image_gpu}"))
    return found


# The rules an experiment meets on this cluster, in the order their problems are listed.
CLUSTER_RULES = (storage_rules, environment_rules, affinity_rules, slots_rules, image_rules)


def cluster_rules(f: str, config: dict, target: Target) -> list[Problem]:
    return [problem for rule in CLUSTER_RULES for problem in rule(f, config, target)]
