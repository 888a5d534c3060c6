"""The experiment `new` writes: experiment.yaml and the example model directory beside it.

Everything cluster-specific comes from Target. Nothing secret is written: the S3 keys reach
the trial from master.yaml's checkpoint_storage, which Determined merges into the
experiment's own field by field when both are `type: s3` (master/pkg/schemas/merge.go
UnionMerge, master/pkg/schemas/expconf/storage_config.go at v0.38.0).
"""

from __future__ import annotations

import json
from pathlib import Path

from deploy.experiment import fairness
from deploy.experiment.target import Target

MODEL_DIR = "model"
GLOBAL_BATCH_SIZE_PER_SLOT = 8
# `--example NAME`: the Core API example (a linear fit) or the fairness audit (fairness.py).
EXAMPLES = ("core-api", fairness.NAME)


def slots_warning(target: Target, slots: int) -> str | None:
    if target.nvlink_slots is None:
        return (
            f"NVLink domains unknown (not in cluster.yaml): slots_per_trial {slots} is checked against one "
            f"agent's {target.agent_slots} slots only; `python -m deploy verify` prints the largest "
            "slots_per_trial inside one NVLink domain: pass it as --nvlink-slots N"
        )
    if slots > target.max_single_slots:
        return (
            f"slots_per_trial {slots} exceeds the largest NVLink domain every agent node has "
            f"({target.nvlink_slots}): the trial's collectives cross PCIe or the fabric"
        )
    return None


def _q(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML scalar: no surprise from ':', '@', '#'


def spans_agents(target: Target, slots: int) -> bool:
    """Whether Determined must place the trial on more than one agent: more slots than the
    largest agent offers. Such a trial runs on the host network (the node's IPoIB port is
    there); one that fits on an agent runs on Docker's bridge network, with eth0 and lo only
    (master/internal/rm/agentrm: host networking only for multi-agent trials)."""
    return slots > target.agent_slots


def _fabric_env(target: Target, slots: int) -> str:
    if not spans_agents(target, slots):
        return (
            "  # No socket interface named: this trial fits on one agent, on Docker's bridge network,\n"
            "  # where NCCL and Gloo fail on a named interface that is not there (find or fail); NCCL\n"
            "  # bootstraps over eth0 and moves data over NVLink / PCIe inside the node.\n"
            "  environment_variables: []"
        )
    names = target.fabric_interfaces
    return (
        "  # The trial spans agents (host network): the collectives' sockets on the agents' IPoIB\n"
        "  # ports (comma-separated: agents whose ports are named differently), never the\n"
        "  # management network. NCCL's data still goes over the HCAs (verbs), not these sockets.\n"
        "  environment_variables:\n"
        f"    - {_q('NCCL_SOCKET_IFNAME=' + names)}\n"
        f"    - {_q('GLOO_SOCKET_IFNAME=' + names)}"
    )


def _hyperparameters(example: str, slots: int) -> str:
    if example == fairness.NAME:
        return fairness.hyperparameters(slots, GLOBAL_BATCH_SIZE_PER_SLOT)
    return f"""\
hyperparameters:
  # Global: the batch of ALL ranks together; each of the {slots} slot(s) trains on
  # global_batch_size / slots_per_trial records (keep it divisible).
  global_batch_size: {GLOBAL_BATCH_SIZE_PER_SLOT * slots}
  learning_rate: 0.05
  steps: 50
"""


def train_py(example: str) -> str:
    """model/train.py of the example."""
    return fairness.TRAIN_PY if example == fairness.NAME else TRAIN_PY


def experiment_yaml(target: Target, slots: int, example: str = "core-api") -> str:
    distributed = slots > 1
    entrypoint = (
        "python3 -m determined.launch.torch_distributed python3 train.py"
        if distributed
        else "python3 train.py"
    )
    domain = "" if target.nvlink_slots is None else " and in one NVLink domain"
    prefix = f"\n  prefix: {_q(target.prefix)}" if target.prefix else ""
    return f"""\
# Experiment for the cluster of {target.path}, from `python -m deploy experiment new`.
# `det experiment create experiment.yaml {MODEL_DIR}/`; check edits with
# `python -m deploy experiment lint --cluster {target.path} experiment.yaml {MODEL_DIR}/`.
name: example-{example}
entrypoint: {_q(entrypoint)}

searcher:
  name: single
  metric: loss
  smaller_is_better: true

{_hyperparameters(example, slots)}
resources:
  # At most {target.max_single_slots} keeps a trial on one agent{domain}.
  slots_per_trial: {slots}
  resource_pool: {_q(target.resource_pool)}

# No `region:` key: Determined's s3 schema has none (the master refuses the experiment). The
# region reaches boto3 as AWS_DEFAULT_REGION={target.region}, which master.yaml's
# task_container_defaults sets in every trial container. No access_key/secret_key either: they
# are optional in the schema and come from master.yaml's checkpoint_storage, merged into this
# one; never write them here.
checkpoint_storage:
  type: s3
  bucket: {_q(target.bucket)}
  endpoint_url: {_q(target.endpoint_url)}{prefix}
  save_trial_latest: 1

environment:
  # The pinned task images the agents pulled (determined.task_image in cluster.yaml).
  image:
    cuda: {_q(target.image_gpu)}
    cpu: {_q(target.image_cpu)}
  # master.yaml's task_container_defaults add AWS_DEFAULT_REGION={target.region} to this list
  # (Determined appends them: master/pkg/schemas/expconf/environment_config.go).
{_fabric_env(target, slots)}

max_restarts: 0
"""


TRAIN_PY = '''\
"""Example trial on Determined's Core API (determined.core), no framework needed.

A linear model y = w*x + b fitted by data-parallel SGD: each rank computes the gradient of
its share of the global batch, the ranks average them (core_context.distributed.allgather),
the chief reports metrics and saves a checkpoint; a restarted or continued trial restores it.
"""

import json
import logging
import os
import random

import determined as det
from determined import core

logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)


def shard_gradient(w, b, records):
    gw = gb = loss = 0.0
    for x, y in records:
        err = w * x + b - y
        gw += 2 * err * x
        gb += 2 * err
        loss += err * err
    return gw, gb, loss


def main(core_context, hparams, latest_checkpoint):
    dist = core_context.distributed
    per_rank = hparams["global_batch_size"] // dist.size
    w = b = 0.0
    start = 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            state = json.loads((path / "state.json").read_text())
        w, b, start = state["w"], state["b"], state["steps_completed"]
        logging.info("restored checkpoint %s at step %d", latest_checkpoint, start)

    rng = random.Random(1000 * start + dist.rank)
    for step in range(start + 1, hparams["steps"] + 1):
        xs = [rng.uniform(-1, 1) for _ in range(per_rank)]
        gw, gb, loss = shard_gradient(w, b, [(x, 3 * x + 1) for x in xs])
        parts = dist.allgather((gw, gb, loss))
        n = per_rank * dist.size
        w -= hparams["learning_rate"] * sum(p[0] for p in parts) / n
        b -= hparams["learning_rate"] * sum(p[1] for p in parts) / n
        if dist.rank == 0 and step % 10 == 0:
            core_context.train.report_training_metrics(
                steps_completed=step, metrics={"loss": sum(p[2] for p in parts) / n}
            )
        if step % 25 == 0 or step == hparams["steps"]:
            if dist.rank == 0:
                metadata = {"steps_completed": step}
                with core_context.checkpoint.store_path(metadata) as (path, storage_id):
                    (path / "state.json").write_text(
                        json.dumps({"w": w, "b": b, "steps_completed": step})
                    )
            if core_context.preempt.should_preempt():
                return
    if dist.rank == 0:
        core_context.train.report_validation_metrics(
            steps_completed=hparams["steps"], metrics={"loss": (w - 3) ** 2 + (b - 1) ** 2}
        )


if __name__ == "__main__":
    info = det.get_cluster_info()
    assert info is not None, "run this on the cluster: det experiment create experiment.yaml ."
    distributed = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # set by determined.launch.torch_distributed
        distributed = core.DistributedContext.from_torch_distributed()
    with core.init(distributed=distributed) as core_context:
        main(core_context, info.trial.hparams, info.latest_checkpoint)
'''


def write(target: Target, slots: int, out: Path, example: str = "core-api") -> list[Path]:
    """experiment.yaml and model/train.py under `out`; returns the files written."""
    model = out / MODEL_DIR
    model.mkdir(parents=True, exist_ok=True)
    experiment = out / "experiment.yaml"
    experiment.write_text(experiment_yaml(target, slots, example))
    train = model / "train.py"
    train.write_text(train_py(example))
    return [experiment, train]
