"""The smoke experiments verify submits (tests/verify/test_smoke.py): does this cluster train?

Four small experiments, each built from `experiment new`'s template for the cluster (the
checkpoint storage on its MinIO, the fabric from task_container_defaults, max_restarts 0), with
the checkpoint prefix moved under `verify-smoke/<run id>` so that the cleanup removes exactly
what the smoke wrote, and without the template's environment.image: the smoke runs the image
master.yaml's task_container_defaults gives trials, so that a broken default turns it red:

- save: one slot; the trial writes a checkpoint (two small files) to MinIO with boto3 set up the
  way Determined's S3StorageManager sets it up, and prints its uuid;
- restore: one slot, hparam `restore_uuid`; the trial reads that checkpoint back and checks it;
- allreduce: two agents (slots_per_trial = two whole agents, the master's multi-agent fitting);
  rank 0 runs `mpirun` over ssh (port 12350) into the other container, whose trial starts sshd
  with the per-trial key, and the ranks allreduce with mpi4py over the inter-node interface;
- single: every slot of one agent (the largest); one container on Docker's bridge network, a
  rank per slot, the ranks allreduce inside it, and a socket interface named by
  NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME that the container lacks fails it as NCCL and Gloo do.

The trial prints `SMOKE-OK <row>: ...` when its row passed and exactly one
`SMOKE-FAIL <row>: <what>` line when it did not (the S3 error code and message as boto3 gives
them, the ssh, MPI or collective's error), so that verify can name the cause and its hint.
"""

from __future__ import annotations

import base64
import re
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from deploy.experiment import template
from deploy.experiment.target import Target

PREFIX_ROOT = "verify-smoke"
TRIAL_FILE = "smoke_trial.py"
SAVE, RESTORE, ALLREDUCE, SINGLE = "save", "restore", "allreduce", "single"
KINDS = (SAVE, RESTORE, ALLREDUCE, SINGLE)
# The rows' names as the trial prints them.
ROWS = {
    SAVE: "checkpoint-save",
    RESTORE: "checkpoint-restore",
    ALLREDUCE: "allreduce",
    SINGLE: "single-agent-allreduce",
}
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def smoke_prefix(target: Target, run_id: str) -> str:
    """The checkpoint prefix of one smoke run: under the cluster's own prefix, if any."""
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r}: letters, digits, '.', '_', '-' only")
    return "/".join(p for p in ((target.prefix or "").strip("/"), PREFIX_ROOT, run_id) if p)


def config(
    target: Target, kind: str, run_id: str, *, slots: int = 1, restore_uuid: str | None = None
) -> dict:
    """The experiment configuration of one smoke trial: `experiment new`'s template for the
    cluster with the smoke's name, entrypoint, hyperparameters and checkpoint prefix."""
    if kind not in KINDS:
        raise ValueError(f"smoke kind {kind!r}: one of {', '.join(KINDS)}")
    if kind == RESTORE and not restore_uuid:
        raise ValueError("the restore smoke needs the uuid of the saved checkpoint")
    doc = yaml.safe_load(template.experiment_yaml(target, slots))
    doc["name"] = f"verify-smoke-{kind}-{run_id}"
    doc["description"] = f"python -m deploy verify smoke ({ROWS[kind]}); archived by verify when done"
    doc["entrypoint"] = f"python3 {TRIAL_FILE}"
    hparams: dict = {"smoke": kind, "run_id": run_id}
    if restore_uuid:
        hparams["restore_uuid"] = restore_uuid
    doc["hyperparameters"] = hparams
    doc["checkpoint_storage"]["prefix"] = smoke_prefix(target, run_id)
    # The template pins the image for users' experiments; the smoke proves what master.yaml
    # gives a trial that names none (task_container_defaults.image, which the master merges in:
    # master/pkg/model/task_container_defaults.go MergeIntoExpConfig).
    doc["environment"].pop("image", None)
    doc["max_restarts"] = 0  # a failure is the answer; a restart would only hide it
    doc["labels"] = ["verify-smoke"]
    return doc


def config_yaml(target: Target, kind: str, run_id: str, **kwargs) -> str:
    return yaml.safe_dump(config(target, kind, run_id, **kwargs), sort_keys=False)


def model_definition() -> list[dict]:
    """The model directory as POST /api/v1/experiments takes it: v1File entries as the CLI builds
    them (harness/determined/common/v1file_utils.py v1File_from_local_file: `type` is the tar
    type byte, ord(tarfile.REGTYPE); `mtime` a string-encoded int64; `mode` the st_mode)."""
    content = base64.b64encode(TRIAL_PY.encode()).decode()
    return [
        {
            "path": TRIAL_FILE,
            "type": ord(tarfile.REGTYPE),
            "content": content,
            "mode": stat.S_IFREG | 0o644,
            "mtime": "0",
            "uid": 0,
            "gid": 0,
        }
    ]


@dataclass(frozen=True)
class Outcome:
    ok: bool
    line: str  # the trial's SMOKE-OK/SMOKE-FAIL line without its prefix, or "" if it printed none
    uuid: str | None = None  # the saved checkpoint (save)


_LINE = re.compile(r"SMOKE-(OK|FAIL) ([a-z-]+): (.*)")


def outcome(kind: str, messages: list[str]) -> Outcome | None:
    """What the trial said about its row in its log lines; None if it said nothing (it did
    not start, or died before it could say)."""
    found: Outcome | None = None
    for message in messages:
        for raw in message.splitlines():
            m = _LINE.search(raw)
            if m is None or m.group(2) != ROWS[kind]:
                continue
            ok = m.group(1) == "OK"
            uuid = re.search(r"\buuid=([0-9a-f-]{36})\b", m.group(3)) if ok else None
            found = Outcome(ok, m.group(3).strip(), uuid.group(1) if uuid else None)
            if not ok:
                return found  # the first failure is the cause
    return found


# The trial, run by the task image's python3 (stdlib, boto3, and mpi4py or torch).
MODEL_DIR = Path(__file__).parent / "smoke_model"
TRIAL_PY = (MODEL_DIR / TRIAL_FILE).read_text()
