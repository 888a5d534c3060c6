# Lab stand-in: the experiment and trial part of the determined-master 0.38.0 stand-in
"""Experiments, trials and their containers for the lab's Determined master stand-in.

Packed beside the master (/usr/share/determined/master/lab/lab_trials.py) and imported by
/usr/bin/determined-master. Sources below are paths in determined-ai/determined at v0.38.0.

Reproduced:
- POST /api/v1/experiments (master/internal/api_experiment.go CreateExperiment and
  core_experiment.go parseCreateExperiment): the YAML config is sanity-checked against the
  expconf JSON schemas (schemas/expconf/v0/*.json: additionalProperties false, the union of
  checkpoint_storage and searcher whose selected variant reports its own errors), errors
  rendered as master/pkg/schemas/util.go GetRenderedErrors does ("<config>.path: message",
  sorted, one per line) and wrapped "invalid experiment configuration: version 0 experiment
  config is invalid: config is invalid: ..."; resources resolved (spec_util.go
  ResolveResources: an unknown pool, "slots requested exceeds cluster capacity" under the
  default launch_error: true, is_single_node's "request unfulfillable"); "managed experiments
  require entrypoint"; task_container_defaults merged into the config
  (master/pkg/model/task_container_defaults.go MergeIntoExpConfig: devices appended unless
  the experiment has the container path, image per device type, environment variables
  defaults first then the experiment's, so the experiment's win), then master.yaml's
  checkpoint_storage (schemas.Merge; CheckpointStorageConfigV0.Merge is a union merge: the
  master's fields fill the experiment's only when both name the same type), then the
  completeness check ("config is invalid or incomplete": searcher.metric, ...). The plain Go
  errors answer 500 {"code": 13, "reason": "Internal"} (grpcutil/errors.go maps Unknown to
  Internal), the wrapped InvalidArgument ones 400.
- Scheduling (master/internal/rm/agentrm/fitting.go findFits with the default best-fit
  policy, fitting_methods.go): one agent with enough free slots (the fullest that fits, ties
  broken by md5 hash distance, then agent id); otherwise as few whole agents as possible of
  one size (slots a multiple of that size); disabled or draining agents offer no slots.
  Multi-agent trials run with host networking (rm/agentrm/resources.go UseHostMode =
  IsMultiAgent), single-container ones with task_container_defaults.network_mode (bridge).
- Trial containers (master/pkg/tasks/task_trial.go ToTaskSpec, task.go EnvVars/ToDockerSpec):
  the DET_* variables, then the environment variables, working directory
  /run/determined/workdir holding the model definition, an SSH key pair per experiment
  (master/internal/experiment.go ssh.GenerateKey: ED25519 by default, config.go
  security.ssh.key_type) written to /run/determined/ssh/{id_rsa,id_rsa.pub,authorized_keys},
  description "exp-<e>-trial-<t>-attempt-<n>", devices, shm_size, capabilities, bind mounts.
- States: trials QUEUED -> PULLING -> STARTING -> RUNNING (api_trials.go converts ACTIVE by
  the allocation's state) -> COMPLETED, or ERROR once max_restarts restarts are spent (a
  failed container gets the others killed); experiments ACTIVE -> COMPLETED / ERROR /
  CANCELED (kill); archive refused with FailedPrecondition "Experiment is not in terminal
  state." (experiment/bulk_action.go ArchiveExperiments).
- TLS (master/pkg/tasks/task.go EnvVars, copy.go masterCertArchive): with security.tls the
  containers get the master's chain at /run/determined/etc/ssl/master.crt (0644), DET_USE_TLS=true
  and DET_MASTER_CERT_FILE naming it (cluster.json's master_cert_file too), and the agent adds
  DET_MASTER=https://... and DET_MASTER_CERT_NAME; GET /api/v1/tasks/{id}/context_directory
  (GetTaskContextDirectory), the first request of the harness's prep step.
- GET /api/v1/tasks (the running allocations, by allocation id, with their containers),
  GET /api/v1/experiments/{id}, /experiments/{id}/trials, /trials/{id},
  /trials/{id}/logs (newline-delimited {"result": ...} as grpc-gateway streams; follow=true
  streams until the trial ends), POST /experiments/{id}/kill and /archive, DELETE
  /experiments/{id} (terminal experiments only).
- What the real `det` CLI of 0.38.0 calls (harness/determined/cli/*.py; routes from
  proto/src/determined/api/v1/api.proto, handlers in master/internal/api_*.go), with the JSON
  the CLI's bindings (determined/common/api/bindings.py from_json) require:
  experimentv1.Experiment with every field (jobId, projectOwnerId, originalConfig, ...:
  experiment/v1/experiment.proto); GET /api/v1/experiments (GetExperiments: archived, users,
  userIds, states, name, offset/limit paged as runPagedBunExperimentsQuery); POST
  /experiments/{id}/pause, /activate (experiment.go PauseExperiment / ActivateExperiment,
  bulk_action.go: "experiment in terminal state", "experiment in incompatible state X") and
  /cancel (CancelExperiment); GET /api/v1/trials/{id}/workloads (GetTrialWorkloads: the
  reported training, validation and checkpoint workloads); POST /api/v1/checkpoints
  (ReportCheckpoint, what the harness calls after uploading a checkpoint; body: the
  Checkpoint) and GET /api/v1/checkpoints/{uuid} (GetCheckpoint, shaped as
  proto_checkpoints_view: training.experimentConfig is the stored config, storage
  credentials included, which is what lets `det checkpoint download` read S3 directly);
  GET /api/v1/resource-pools (agentrm createResourcePoolSummary of a static pool) and GET
  /api/v1/job-queues-v2 (GetJobsV2: the pool's experiments holding or awaiting slots, in the
  priority scheduler's order, as RBACJob {"full": Job}).
- What a trial's real harness calls (harness/determined/exec/prep_container.py, launch.py,
  core/*.py; class CoreApi below, each handler cited): the allocation token header
  (Grpc-Metadata-x-allocation-token, grpcutil/auth.go GetUser) accepted as a user token;
  POST /api/v1/allocations/{id}/acceleratorData (PostAllocationAcceleratorData, api_tasks.go);
  GET /api/v1/allocations/{id}/resources/{rid}/rendezvous (AllocationRendezvousInfo,
  api_trials.go; task/rendezvous.go: blocks until every container runs and watches, then
  addresses, slots and each one's rank; the allocation is then ready); GET
  /api/v1/allocations/{id}/signals/preemption (AllocationPreemptionSignal: a long poll of
  timeout_seconds) and POST .../signals/ack_preemption (AckAllocationPreemptionSignal); POST
  /api/v1/runs/start (RunPrepareForReporting, api_runs.go: a storage backend id); POST
  /api/v1/trials/{id}/metrics (ReportTrialMetrics: kept with the trial, summary metrics as
  db/postgres_trial_metrics.go calculateNewSummaryMetrics) and /progress (ReportTrialProgress:
  the experiment's progress); the trial's latestValidation, bestValidation, latestTraining,
  totalBatchesProcessed, searcherMetricValue and summaryMetrics in GetTrial; a checkpoint's
  metrics (proto_checkpoints_view: the reports at its steps_completed); GET
  /api/v1/experiments/{id}/checkpoints (GetExperimentCheckpoints: `det experiment
  list-checkpoints`); GET /api/v1/trials/metrics/{trial,training,validation}_metrics
  (GetMetrics, GetTrainingMetrics, GetValidationMetrics: what the SDK's iter_metrics reads);
  a restarted trial's DET_LATEST_CHECKPOINT and DET_STEPS_COMPLETED (trial.go
  buildTaskSpecifier: its latest completed checkpoint). The single searcher's operation is the
  harness's own in 0.38.0 (core/_searcher.py: no master call); the trial completes when its
  containers exit 0.
- Pausing and canceling terminate the trials' allocations (trial.go TerminateAllocation,
  allocation.go tryExitOrTerminate): a ready allocation (its rendezvous done, which only a
  harness does) is preempted, its preemption signal true, and killed only after the
  experiment's preemption_timeout (default 1 h); one that is not ready is killed at once. An
  exit after an acknowledged preemption leaves the trial waiting (PAUSED) or queued again,
  restarts not counted; an exit 0 without one completes it. Paused trials wait until
  activation queues them again; an experiment created with activate false starts PAUSED with
  its trial.
- A route the stand-in does not serve under /api/v1/ answers as grpc-gateway v1.16.0 answers
  one it has no handler for (runtime/mux.go ErrUnknownURI through master/internal/grpcutil/
  errors.go): 501 {"error": {"code": 12, "reason": "Unimplemented", "error": "Not
  Implemented"}}, so a caller fails loudly; elsewhere echo's 404 {"message": "Not Found"}.
Lab differences:
- experiments live in the master's memory (the real master keeps them in PostgreSQL): a
  master restart forgets them;
- the agents fetch work by long-polling GET /agents/work?id=<agent>&wait=<s> (the real master
  pushes StartContainer/KillContainer over the agent's websocket): {"start": [spec...], "kill":
  [container id...]}, each re-sent every RESEND seconds until the agent reports on that
  container (an answer can die with an agent process); they report container states and
  output with POST /agents/containers ({"container_id", "state": PULLING|STARTING|RUNNING|
  TERMINATED, "exit_code", "error"}; 404 for a container the master does not know: the agent
  kills it) and POST /agents/logs ({"logs": [{"container_id", "stdtype", "message", "time"}]});
- an agent that sets up with reconnect=false is a new process: the containers its previous
  process had taken on count as lost (the real agent kills what it cannot reattach);
- the task images carry the harness (tests/lab/task_wheels.py), but the agent runs no
  task-setup sequence: the entrypoint runs as `sh -c <entrypoint>` (a list entrypoint as its
  argv) in the working directory instead of through ship-logs.sh, ship_logs.py,
  /run/determined/train/entrypoint.sh and determined.exec.launch, and the master writes
  /run/determined/info/{cluster,trial,rendezvous,resources}.json itself (the real harness's
  prep_container writes them from the environment and the rendezvous API); container_addrs are
  the agents' addresses as the master sees them, as rendezvous.go does with host networking;
- DET_SESSION_TOKEN and DET_USER_TOKEN are both a login session of the experiment's owner
  (the real DET_SESSION_TOKEN is an allocation session, valid only in the allocation token
  header and only while the allocation lives);
- the master's own /run/determined/info/*.json make a harness-less container look prepared;
  a real harness's prep_container writes its own from the environment and the rendezvous;
- trial metrics, progress and storage backends live in memory too; metric reports of an
  earlier run are not archived on a restart (AddTrialMetrics rolls back reports past the
  latest checkpoint's step); PostAllocationAcceleratorData's data is kept, never shown;
- GET /checkpoints/{uuid} (the master-proxied checkpoint download, an echo route) is not
  served: `det checkpoint download` must reach the S3 storage itself (--mode direct, or auto
  falling back to a 404);
- only the single searcher (hyperparameters constant) runs; others are refused;
- with TLS, the entrypoint runs through lab_prep_container.py (packed beside this module, put
  at /run/determined/lab/prep_container.py): the master contact of the harness's prep step, so
  that a wrong DET_MASTER_CERT_FILE or DET_MASTER_CERT_NAME fails the trial as it would with the
  harness; without TLS nothing in the container contacts the master, as before; the context
  directory it asks for is empty (the model definition is copied in with the other files).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import random
import re
import secrets
import subprocess
import tempfile
import threading
import time
import uuid
from urllib.parse import parse_qs, urlsplit

GRPC_CODES = {
    2: "Unknown",
    3: "InvalidArgument",
    5: "NotFound",
    7: "PermissionDenied",
    9: "FailedPrecondition",
    12: "Unimplemented",
    13: "Internal",
    16: "Unauthenticated",
}
# grpc-gateway v1.16.0 runtime/errors.go HTTPStatusFromCode.
GRPC_HTTP = {2: 500, 3: 400, 5: 404, 7: 403, 9: 400, 12: 501, 13: 500, 16: 401}
# grpc-gateway v1.16.0 runtime/mux.go: a path or method no route matches is ErrUnknownURI,
# status.Error(codes.Unimplemented, "Not Implemented"), which the master's errorHandler
# (master/internal/grpcutil/errors.go) writes as 501 {"error": {"code": 12, ...}}.
UNKNOWN_URI = (12, "Not Implemented")


class ApiError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# --------------------------------------------------------------------------- expconf schema

# Properties of schemas/expconf/v0/*.json at v0.38.0 (every one has additionalProperties: false).
EXPERIMENT_KEYS = frozenset(
    [
        "bind_mounts",
        "checkpoint_policy",
        "checkpoint_storage",
        "data",
        "data_layer",
        "debug",
        "description",
        "entrypoint",
        "environment",
        "hyperparameters",
        "integrations",
        "internal",
        "labels",
        "log_policies",
        "max_restarts",
        "min_checkpoint_period",
        "min_validation_period",
        "name",
        "optimizations",
        "pbs",
        "perform_initial_validation",
        "preemption_timeout",
        "profiling",
        "project",
        "records_per_epoch",
        "reproducibility",
        "resources",
        "retention_policy",
        "scheduling_unit",
        "searcher",
        "security",
        "slurm",
        "tensorboard_storage",
        "workspace",
    ]
)
RESOURCES_KEYS = frozenset(
    [
        "agent_label",
        "devices",
        "is_single_node",
        "max_slots",
        "native_parallel",
        "priority",
        "resource_pool",
        "shm_size",
        "slots",
        "slots_per_trial",
        "weight",
    ]
)
ENVIRONMENT_KEYS = frozenset(
    [
        "add_capabilities",
        "drop_capabilities",
        "environment_variables",
        "force_pull_image",
        "image",
        "pod_spec",
        "ports",
        "proxy_ports",
        "registry_auth",
    ]
)
DEVICE_KEYS = frozenset(("host_path", "container_path", "mode"))
BIND_MOUNT_KEYS = frozenset(("host_path", "container_path", "read_only", "propagation"))
# checkpoint-storage.json: the union of every variant's properties, then the variant's own.
STORAGE_SAVE = ("save_experiment_best", "save_trial_best", "save_trial_latest")
STORAGE_VARIANTS = {
    "shared_fs": frozenset(
        ("type", "host_path", "container_path", "checkpoint_path", "tensorboard_path", "storage_path")
        + ("propagation",)
        + STORAGE_SAVE
    ),
    "s3": frozenset(("type", "bucket", "access_key", "secret_key", "endpoint_url", "prefix") + STORAGE_SAVE),
    "gcs": frozenset(("type", "bucket", "prefix") + STORAGE_SAVE),
    "azure": frozenset(
        ("type", "container", "connection_string", "account_url", "credential") + STORAGE_SAVE
    ),
    "directory": frozenset(("type", "container_path") + STORAGE_SAVE),
}
STORAGE_KEYS = frozenset().union(*STORAGE_VARIANTS.values(), {"user"})
STORAGE_REQUIRED = {"shared_fs": "host_path", "s3": "bucket", "gcs": "bucket", "azure": "container"}
STORAGE_REQUIRED["directory"] = "container_path"
SEARCHER_KEYS = frozenset(
    [
        "bracket_rungs",
        "budget",
        "divisor",
        "max_concurrent_trials",
        "max_length",
        "max_rungs",
        "max_time",
        "max_trials",
        "metric",
        "mode",
        "name",
        "num_rungs",
        "smaller_is_better",
        "source_checkpoint_uuid",
        "source_trial_id",
        "stop_once",
        "time_metric",
        "train_stragglers",
        "unit",
    ]
)
SEARCHER_SINGLE_KEYS = frozenset(
    ("name", "metric", "smaller_is_better", "max_length", "source_trial_id", "source_checkpoint_uuid")
)
SEARCHER_NAMES = ("single", "random", "grid", "adaptive_asha", "async_halving")
EOL_SEARCHERS = ("custom", "adaptive", "adaptive_simple", "sync_halving")
# TaskTypeTrial's name generator (master/pkg/schemas/expconf Name.WithDefaults: petname).
PETNAME_WORDS = (
    ("adapted", "proud", "quick", "calm", "brave", "keen"),
    ("mallard", "otter", "falcon", "lynx", "heron", "marten"),
)


class ExpConfigError(Exception):
    """An experiment config refused; code is the gRPC code the real master answers with."""

    def __init__(self, message: str, code: int = 13):
        super().__init__(message)
        self.code = code


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _extra(path: str, value, allowed) -> list[str]:
    """additionalProperties: false, as santhosh-tekuri/jsonschema words it."""
    if not isinstance(value, dict):
        return []
    return [f'<config>{path}: additionalProperties "{k}" not allowed' for k in value if k not in allowed]


def _typed(path: str, value, kinds: tuple[str, ...]) -> list[str]:
    if value is None or _kind(value) in kinds or (_kind(value) == "integer" and "number" in kinds):
        return []
    return [f"<config>{path}: expected {' or '.join(kinds)}, but got {_kind(value)}"]


def sanity_errors(config) -> list[str]:
    """The sanity validator's leaf errors for the parts the lab uses (sorted, as rendered)."""
    if not isinstance(config, dict):
        return [f"<config>: expected object, but got {_kind(config)}"]
    errors = _extra("", config, EXPERIMENT_KEYS)
    resources = config.get("resources")
    errors += _typed(".resources", resources, ("object",))
    if isinstance(resources, dict):
        errors += _extra(".resources", resources, RESOURCES_KEYS)
        for key in ("slots_per_trial", "max_slots", "priority", "shm_size"):
            errors += _typed(f".resources.{key}", resources.get(key), ("integer",))
        if isinstance(resources.get("slots_per_trial"), int) and resources["slots_per_trial"] < 0:
            errors.append("<config>.resources.slots_per_trial: must be >= 0 but found -1")
        errors += _typed(".resources.resource_pool", resources.get("resource_pool"), ("string",))
        for i, dev in enumerate(resources.get("devices") or []):
            errors += _extra(f".resources.devices[{i}]", dev, DEVICE_KEYS)
    env = config.get("environment")
    errors += _typed(".environment", env, ("object",))
    if isinstance(env, dict):
        errors += _extra(".environment", env, ENVIRONMENT_KEYS)
    for i, mount in enumerate(config.get("bind_mounts") or []):
        errors += _extra(f".bind_mounts[{i}]", mount, BIND_MOUNT_KEYS)
    errors += _typed(".max_restarts", config.get("max_restarts"), ("integer",))
    errors += _typed(".entrypoint", config.get("entrypoint"), ("string", "array"))
    storage = config.get("checkpoint_storage")
    if isinstance(storage, dict):
        # checkpoint-storage.json refuses a key no variant has; its union's selected variant
        # (unionKey const:type=...) refuses the keys it lacks: an unknown key is reported twice.
        errors += _extra(".checkpoint_storage", storage, STORAGE_KEYS)
        variant = STORAGE_VARIANTS.get(storage.get("type"))
        if variant is not None:
            errors += _extra(".checkpoint_storage", storage, variant)
        elif storage.get("type") is not None:
            errors.append(
                '<config>.checkpoint_storage: is not an object where object["type"] is one of '
                "'shared_fs', 'directory', 's3', 'gcs', or 'azure'"
            )
    searcher = config.get("searcher")
    if isinstance(searcher, dict):
        errors += _extra(".searcher", searcher, SEARCHER_KEYS)
        if searcher.get("name") == "single":
            errors += _extra(".searcher", searcher, SEARCHER_SINGLE_KEYS)
        elif searcher.get("name") not in SEARCHER_NAMES + EOL_SEARCHERS:
            errors.append(
                "<config>.searcher: is not an object where object[\"name\"] is one of 'single', "
                "'random', 'grid', 'custom', or 'adaptive_asha'"
            )
    return sorted(errors)


def completeness_errors(config: dict) -> list[str]:
    """eventuallyRequired after the merges (eventually_required.go: "<prop> is a required
    property"); the searcher's and checkpoint storage's unions report it again."""
    errors = []
    for key in ("checkpoint_storage", "searcher"):
        if config.get(key) is None:
            errors.append(f"<config>: {key} is a required property")
    searcher = config.get("searcher") or {}
    for key in ("name", "metric"):
        if searcher and searcher.get(key) is None:
            errors.append(f"<config>.searcher: {key} is a required property")
            if key == "metric" and searcher.get("name") == "single":
                errors.append("<config>.searcher: metric is a required property")
    storage = config.get("checkpoint_storage") or {}
    needed = STORAGE_REQUIRED.get(storage.get("type"))
    if storage and storage.get("type") is None:
        errors.append("<config>.checkpoint_storage: type is a required property")
    if needed and storage.get(needed) is None:
        errors.append(f"<config>.checkpoint_storage: {needed} is a required property")
    image = (config.get("environment") or {}).get("image") or {}
    if not image:
        errors.append("<config>.environment: image is a required property")
    return sorted(errors)


def parse_config(text: str) -> dict:
    """expconf.ParseAnyExperimentConfigYAML plus the resources.slots refusal."""
    import yaml

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ExpConfigError(
            f"invalid experiment configuration: unable to convert yaml to json: not valid yaml: {e}"
        ) from None
    if config is None:
        config = {}
    version = config.get("version", 0) if isinstance(config, dict) else 0
    if version != 0:
        raise ExpConfigError(f"invalid experiment configuration: invalid version: {version}")
    errors = sanity_errors(config)
    if errors:
        raise ExpConfigError(
            "invalid experiment configuration: version 0 experiment config is invalid: "
            "config is invalid: " + "\n".join(errors)
        )
    if (config.get("resources") or {}).get("slots") is not None:
        raise ExpConfigError('<config>.resources: additionalProperties "slots" not allowed')
    return config


def _env_list(value) -> dict[str, list[str]]:
    """EnvironmentVariablesMapV0: a list applies to every device type."""
    if value is None:
        return {"cpu": [], "cuda": [], "rocm": []}
    if isinstance(value, list):
        return {k: [str(v) for v in value] for k in ("cpu", "cuda", "rocm")}
    return {
        k: [str(v) for v in (value.get(k) or value.get("gpu" if k == "cuda" else k) or [])]
        for k in ("cpu", "cuda", "rocm")
    }


def _image_map(value) -> dict[str, str | None]:
    """EnvironmentImageMapV0: a string applies to every device type; "gpu" is cuda's old name."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"cpu": value, "cuda": value, "rocm": value}
    out = {k: value.get(k) for k in ("cpu", "cuda", "rocm") if value.get(k) is not None}
    if "cuda" not in out and value.get("gpu") is not None:
        out["cuda"] = value["gpu"]
    return out


def _merge_by_container_path(mine: list, defaults: list) -> list:
    """DevicesConfigV0.Merge / BindMountsConfigV0.Merge: append the defaults whose
    container_path the experiment does not already use."""
    paths = {item.get("container_path") for item in mine}
    return list(mine) + [dict(item) for item in defaults if item.get("container_path") not in paths]


def _tcd_devices(devices) -> list[dict]:
    """model.DevicesConfig: "host:container[:mode]" strings or objects."""
    out = []
    for dev in devices or []:
        if isinstance(dev, str):
            parts = dev.split(":")
            out.append(
                {"host_path": parts[0], "container_path": parts[1] if len(parts) > 1 else parts[0]}
                | ({"mode": parts[2]} if len(parts) > 2 else {})
            )
        else:
            out.append(dict(dev))
    return out


def merge_config(config: dict, tcd: dict, storage: dict | None) -> dict:
    """MergeIntoExpConfig(task_container_defaults), then master.yaml's checkpoint_storage,
    then the schema defaults the lab's trials read."""
    out = copy.deepcopy(config)
    tcd = tcd or {}
    res = dict(out.get("resources") or {})
    res["devices"] = _merge_by_container_path(
        [dict(d) for d in res.get("devices") or []], _tcd_devices(tcd.get("devices"))
    )
    env = dict(out.get("environment") or {})
    image = {**_image_map(tcd.get("image")), **_image_map(env.get("image"))}
    env["image"] = image
    mine, defaults = _env_list(env.get("environment_variables")), _env_list(tcd.get("environment_variables"))
    env["environment_variables"] = {k: defaults[k] + mine[k] for k in ("cpu", "cuda", "rocm")}
    for key in ("add_capabilities", "drop_capabilities"):
        if env.get(key) is None:
            env[key] = list(tcd.get(key) or [])
    if env.get("force_pull_image") is None:
        env["force_pull_image"] = bool(tcd.get("force_pull_image", False))
    if env.get("registry_auth") is None:
        env["registry_auth"] = tcd.get("registry_auth")
    env.setdefault("ports", {})
    env.setdefault("proxy_ports", [])
    env.setdefault("pod_spec", None)
    out["environment"] = env
    out["bind_mounts"] = _merge_by_container_path(
        [dict(m) for m in out.get("bind_mounts") or []], [dict(m) for m in tcd.get("bind_mounts") or []]
    )
    if storage:
        mine_cs = out.get("checkpoint_storage")
        if mine_cs is None:
            out["checkpoint_storage"] = copy.deepcopy(storage)
        elif mine_cs.get("type") == storage.get("type") or mine_cs.get("type") is None:
            out["checkpoint_storage"] = {**storage, **{k: v for k, v in mine_cs.items() if v is not None}}
    # json-schema defaults (schemas/expconf/v0/*.json) of what the lab reads.
    res.setdefault("slots_per_trial", 1)
    res.setdefault("resource_pool", "")
    res.setdefault("is_single_node", None)
    res.setdefault("shm_size", None)
    res.setdefault("max_slots", None)
    res.setdefault("weight", 1)
    res.setdefault("native_parallel", False)
    res.setdefault("agent_label", None)
    out["resources"] = res
    out.setdefault("max_restarts", 5)
    out.setdefault("hyperparameters", {})
    out.setdefault("labels", [])
    out.setdefault("data", {})
    out.setdefault("debug", False)
    repro = dict(out.get("reproducibility") or {})
    if repro.get("experiment_seed") is None:
        repro["experiment_seed"] = int(time.time()) & 0xFFFFFFFF  # ReproducibilityConfig default
    out["reproducibility"] = repro
    if out.get("name") is None:
        out["name"] = f"Experiment ({random.choice(PETNAME_WORDS[0])}-{random.choice(PETNAME_WORDS[1])})"
    cs = out.get("checkpoint_storage")
    if isinstance(cs, dict):
        for key, default in zip(STORAGE_SAVE, (0, 1, 1), strict=True):
            cs.setdefault(key, default)
    searcher = out.get("searcher")
    if isinstance(searcher, dict):
        searcher.setdefault("smaller_is_better", True)
        searcher.setdefault("source_trial_id", None)
        searcher.setdefault("source_checkpoint_uuid", None)
    return out


def hparams_of(space, path: str = "") -> dict:
    """The single searcher's trial hyperparameters: each value, or a const's val."""
    out = {}
    for name, value in (space or {}).items():
        if isinstance(value, dict) and "type" in value:
            if value["type"] == "const":
                out[name] = value.get("val")
            elif value["type"] == "object":
                out[name] = hparams_of(value.get("vals") or {}, f"{path}{name}.")
            else:
                raise ExpConfigError(
                    f"lab stand-in: hyperparameter {path}{name} of type {value['type']} needs a "
                    "search, which is not reproduced (use constants with the single searcher)",
                    3,
                )
        elif isinstance(value, dict):
            out[name] = hparams_of(value, f"{path}{name}.")
        else:
            out[name] = value
    return out


# --------------------------------------------------------------------------- fitting


def _md5_u64(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "little")


def hash_distance(allocation_id: str, agent_id: str) -> int:
    return (_md5_u64(allocation_id) - _md5_u64(agent_id)) % (1 << 64)


def find_fits(
    slots: int, agents: list[dict], allocation_id: str, single_agent: bool = False
) -> list[tuple[str, int]]:
    """fitting.go findFits with BestFit. agents: [{"id", "slots", "used", "usable"}] where
    usable is False for a disabled or draining agent. Returns [(agent id, slots)] or []."""

    def empty(a: dict) -> int:
        return a["slots"] - a["used"] if a["usable"] else 0

    def best_fit(a: dict) -> float:
        return 1.0 / (1.0 + empty(a))

    def order(a: dict):
        return (-best_fit(a), hash_distance(allocation_id, a["id"]), a["id"])

    # findSharedAgentFit: slotsSatisfied (zero-slot tasks: any usable agent).
    shared = [a for a in agents if slots <= empty(a) and (slots > 0 or a["usable"])]
    if shared:
        return [(min(shared, key=order)["id"], slots)]
    if single_agent or slots <= 1:
        return []
    # findDedicatedAgentFits: agents with no slot in use, grouped by size, largest first.
    groups: dict[int, list[dict]] = {}
    for a in agents:
        if a["used"] == 0 and empty(a) > 0:
            groups.setdefault(empty(a), []).append(a)
    for size in sorted(groups, reverse=True):
        group = groups[size]
        if len(group) * size < slots or slots % size != 0:
            continue
        chosen = sorted(group, key=order)[: slots // size]
        return [(a["id"], size) for a in chosen]
    return []


# --------------------------------------------------------------------------- state


def timestamp(t: float) -> str:
    import datetime as dt

    d = dt.datetime.fromtimestamp(t, dt.UTC)
    frac = d.strftime("%f")
    frac = "" if frac == "000000" else "." + (frac[:3] if frac.endswith("000") else frac)
    return d.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


TERMINAL = ("STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR")
RESEND = 10.0  # seconds before an unacknowledged start or kill goes to the agent again
WORKDIR = "/run/determined/workdir"
# master/pkg/tasks/task.go certPath: where the master's certificate goes into task containers.
MASTER_CERT_PATH = "/run/determined/etc/ssl/master.crt"
# With TLS the entrypoint runs through the harness prep step's master contact (its docstring).
PREP_PATH = "/run/determined/lab/prep_container.py"
PREP_SOURCE_NAME = "lab_prep_container.py"


def ssh_key_pair() -> tuple[bytes, bytes]:
    """ssh.GenerateKey with the default security.ssh.key_type ED25519, through ssh-keygen."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "id")
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "determined", "-f", path],
            check=True,
            capture_output=True,
        )
        with open(path, "rb") as f:
            private = f.read()
        with open(path + ".pub", "rb") as f:
            public = f.read()
    return private, public


class CoreApi:
    """What a trial's harness calls (harness/determined/core, exec/prep_container.py at
    v0.38.0), on the Trials below: routes of proto/src/determined/api/v1/api.proto, handlers
    cited on each method. Callers of the methods hold no lock; the methods take self.lock."""

    lock: threading.Condition
    trials: dict[int, dict]
    experiments: dict[int, dict]
    checkpoints: dict[str, dict]
    storage_ids: dict[str, int]

    def get_trial(self, trial_id: int) -> dict:
        raise NotImplementedError

    def kill_containers(self, trial: dict) -> None:
        raise NotImplementedError

    def add_log(self, trial: dict, message: str, **fields) -> None:
        raise NotImplementedError

    def allocation(self, allocation_id: str) -> dict | None:
        """The trial whose current allocation this is, while it holds containers."""
        for trial in self.trials.values():
            if trial["allocation_id"] == allocation_id and trial["containers"]:
                return trial
        return None

    def live_allocation(self, allocation_id: str) -> dict:
        trial = self.allocation(allocation_id)
        if trial is None:
            # task/allocation_service.go getAllocation: api.NotFoundErrs("allocation", id, true)
            raise ApiError(5, f"allocation not found: {allocation_id}")
        return trial

    def accelerator_data(self, allocation_id: str, body: dict) -> None:
        """PostAllocationAcceleratorData (api_tasks.go): "allocation ID missing", else stored."""
        if not allocation_id:
            raise ApiError(3, "allocation ID missing")
        with self.lock:
            trial = self.live_allocation(allocation_id)
            trial.setdefault("accelerators", []).append(body.get("acceleratorData") or {})

    def rendezvous(self, allocation_id: str, resources_id: str) -> dict:
        """AllocationRendezvousInfo (api_trials.go; task/allocation_service.go WatchRendezvous,
        task/rendezvous.go): blocks until every container of the allocation has started and is
        watching, then each gets the addresses and slot counts in rank order and its own rank;
        the allocation is then ready (persistRendezvousComplete: IsReady), which is what makes
        a later pause or cancel preempt it instead of killing it. A resources id that is not the
        allocation's is StaleResourcesError, a second watcher "resources already rendezvoused";
        an allocation that ends first answers "task terminated"."""
        with self.lock:
            trial = self.live_allocation(allocation_id)
            c = trial["containers"].get(resources_id)
            if c is None:
                raise ApiError(3, f"stale resources {resources_id}")
            watching = trial.setdefault("rendezvous", set())
            if resources_id in watching:
                raise ApiError(3, f"resources already rendezvoused: {resources_id}")
            watching.add(resources_id)
            self.lock.notify_all()
            try:
                while True:
                    if trial["allocation_id"] != allocation_id or not trial["containers"]:
                        raise ApiError(2, "task terminated")
                    live = trial["containers"].values()
                    if any(x["state"] == "TERMINATED" for x in live):
                        raise ApiError(2, "task terminated")
                    if trial.get("ready"):
                        break  # rendezvous.go push: every watcher gets its answer at once
                    if all(x["state"] == "RUNNING" for x in live) and watching >= set(trial["containers"]):
                        trial["ready"] = True
                        self.lock.notify_all()
                        break
                    self.lock.wait(1.0)
            finally:
                watching.discard(resources_id)
            info = trial["rendezvous_info"]
            return {"rendezvousInfo": {"addresses": info[0], "rank": c["rank"], "slots": info[1]}}

    def watch_preemption(self, allocation_id: str, timeout: float) -> dict:
        """AllocationPreemptionSignal (api_trials.go; allocation_service.go WatchPreemption):
        a long poll of timeout_seconds that answers preempt true once the allocation is being
        preempted (a pause or cancel of a ready allocation: allocation.go preempt), else false;
        an allocation it cannot find answers false ("contexts with an instant timeout still
        expect a status")."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self.lock:
            while True:
                trial = self.allocation(allocation_id)
                if trial is None:
                    return {"preempt": False}
                trial["watched"] = True
                if trial.get("preempt"):
                    return {"preempt": True}
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"preempt": False}
                self.lock.wait(min(left, 1.0))

    def ack_preemption(self, allocation_id: str) -> None:
        """AckAllocationPreemptionSignal (allocation_service.go AckPreemption): the exit that
        follows is a preemption (calculateExitStatus: "allocation preempted"), not a finish."""
        with self.lock:
            self.live_allocation(allocation_id)["acked"] = True

    def preempt_or_kill(self, trial: dict, exp: dict) -> None:
        """allocation.go tryExitOrTerminate: a ready allocation (rendezvous done) is preempted and
        killed only after the experiment's preemption_timeout (preemptible.Preempt; default
        model.DefaultPreemptionTimeout, 1 h); one that is not ready is killed at once (what the
        lab's harness-less containers always are)."""
        if not trial.get("ready") or not trial["containers"]:
            self.kill_containers(trial)
            return
        if not trial.get("preempt"):
            timeout = exp["config"].get("preemption_timeout") or 3600
            trial["preempt"] = True
            trial["preempt_deadline"] = time.monotonic() + float(timeout)
            self.add_log(
                trial,
                "gracefully terminating allocation's remaining resources (reason: user requested pause)",
            )
        self.lock.notify_all()

    def preemption_deadlines(self) -> None:
        """Called by tick with the lock: allocations that did not preempt in time are killed."""
        for trial in self.trials.values():
            deadline = trial.get("preempt_deadline")
            if deadline is not None and time.monotonic() > deadline and trial["containers"]:
                trial["preempt_deadline"] = None
                self.add_log(trial, "allocation did not preempt in time: killing", level="LOG_LEVEL_WARNING")
                self.kill_containers(trial)

    def prepare_for_reporting(self, body: dict) -> dict:
        """RunPrepareForReporting (api_runs.go; POST /api/v1/runs/start): with a checkpoint storage
        config, the id of its storage backend (storage.AddBackend: one id per distinct config)."""
        with self.lock:
            self.get_trial(int(body.get("runId") or 0))
            cs = body.get("checkpointStorage")
            if cs is None:
                return {"storageId": None}
            key = json.dumps(cs, sort_keys=True)
            if key not in self.storage_ids:
                self.storage_ids[key] = len(self.storage_ids) + 1
            return {"storageId": self.storage_ids[key]}

    def report_progress(self, trial_id: int, body: dict) -> None:
        """ReportTrialProgress (api_trials.go; experiment.go TrialReportProgress): the single
        searcher's progress is the trial's (is_raw: a fraction already)."""
        with self.lock:
            trial = self.get_trial(trial_id)
            trial["progress"] = min(1.0, max(0.0, float(body.get("progress") or 0.0)))

    def report_metrics(self, trial_id: int, body: dict) -> None:
        """ReportTrialMetrics (api_trials.go; db/postgres_trial_metrics.go AddTrialMetrics):
        the group must be set (model.MetricGroup Validate); the report is kept with the trial and
        the trial's summary_metrics updated (avg_metrics for training, validation_metrics for
        validation, others by their group name)."""
        group = str(body.get("group") or "")
        if not group:
            raise ApiError(3, "metric group cannot be empty")
        m = body.get("metrics") or {}
        with self.lock:
            trial = self.get_trial(trial_id)
            metrics = m.get("metrics") or {}
            report = {
                "id": len(trial.setdefault("metrics", [])) + 1,
                "group": group,
                "steps": int(m.get("stepsCompleted") or 0),
                "avg": metrics.get("avgMetrics") or {},
                "batch": metrics.get("batchMetrics"),
                "time": m.get("reportTime") or timestamp(time.time()),
                "run_id": int(m.get("trialRunId") or trial["run_id"]),
            }
            trial["metrics"].append(report)
            key = {"training": "avg_metrics", "validation": "validation_metrics"}.get(group, group)
            summary = trial.setdefault("summary", {}).setdefault(key, {})
            for name, value in report["avg"].items():
                summary[name] = _summarize(summary.get(name), value)
            self.lock.notify_all()

    def metrics_workload(self, report: dict, batches: bool = True) -> dict:
        """trialv1.MetricsWorkload."""
        return {
            "endTime": report["time"],
            "state": "STATE_COMPLETED",
            "metrics": {"avgMetrics": report["avg"], "batchMetrics": report["batch"] if batches else None},
            "numInputs": 0,
            "totalBatches": report["steps"],
        }

    def metric_reports(self, trial: dict, group: str) -> list[dict]:
        return [r for r in trial.get("metrics") or [] if r["group"] == group]

    def searcher_value(self, exp: dict, report: dict | None):
        if report is None:
            return None
        return report["avg"].get(exp["config"]["searcher"].get("metric"))

    def best_validation(self, trial: dict, exp: dict) -> dict | None:
        searcher = exp["config"]["searcher"]
        scored = [
            r for r in self.metric_reports(trial, "validation") if self.searcher_value(exp, r) is not None
        ]
        if not scored:
            return None
        sign = 1 if searcher.get("smaller_is_better", True) else -1
        return min(scored, key=lambda r: sign * float(self.searcher_value(exp, r)))

    def trial_summary(self, trial: dict, exp: dict) -> dict:
        """The trialv1.Trial fields the reports fill (api_trials.go GetTrial,
        static/srv/proto_get_trials_plus.sql): latest and best validation, latest training,
        total batches, the searcher metric's value, summary metrics."""
        validations = self.metric_reports(trial, "validation")
        training = self.metric_reports(trial, "training")
        best = self.best_validation(trial, exp)
        steps = max((r["steps"] for r in trial.get("metrics") or []), default=0)
        latest_val = validations[-1] if validations else None
        return {
            "totalBatchesProcessed": steps,
            "bestValidation": self.metrics_workload(best, False) if best else None,
            "latestValidation": self.metrics_workload(latest_val, False) if latest_val else None,
            "latestTraining": self.metrics_workload(training[-1], False) if training else None,
            "searcherMetricValue": self.searcher_value(exp, latest_val),
            "summaryMetrics": copy.deepcopy(trial.get("summary")) if trial.get("summary") else None,
        }

    def checkpoint_metrics(self, ckpt: dict) -> dict:
        """proto_checkpoints_view: a checkpoint's training and validation metrics are the
        trial's reports at the checkpoint's steps_completed."""
        trial = self.trials.get(ckpt["training"]["trialId"])
        out = copy.deepcopy(ckpt)
        if trial is None:
            return out
        steps = ckpt["metadata"].get("steps_completed")
        exp = self.experiments[trial["exp"]]
        at = {
            g: [r for r in self.metric_reports(trial, g) if r["steps"] == steps]
            for g in ("training", "validation")
        }
        if at["training"]:
            out["training"]["trainingMetrics"] = {
                "avgMetrics": at["training"][-1]["avg"],
                "batchMetrics": None,
            }
        if at["validation"]:
            out["training"]["validationMetrics"] = {"avgMetrics": at["validation"][-1]["avg"]}
            out["training"]["searcherMetric"] = self.searcher_value(exp, at["validation"][-1])
        return out

    def experiment_checkpoints(self, exp_id: int, params: dict[str, list[str]]) -> dict:
        """GetExperimentCheckpoints (api_experiment.go): the experiment's checkpoints
        (get_checkpoints_for_experiment), filtered by states, sorted by sortByAttr (trial id
        when unspecified; searcher metric: nulls last, ascending when smaller_is_better),
        orderBy, then offset/limit as api.Paginate (limit 0: all)."""
        with self.lock:
            exp = self.experiments.get(exp_id)
            if exp is None:
                raise ApiError(5, f"experiment '{exp_id}' not found")
            ckpts = [
                self.checkpoint_metrics(c)
                for c in self.checkpoints.values()
                if c["training"]["experimentId"] == exp_id
            ]
        states = params.get("states") or []
        if states:
            ckpts = [c for c in ckpts if c["state"] in states]
        sort_by = (params.get("sortByAttr") or ["SORT_BY_UNSPECIFIED"])[-1]
        order = (params.get("orderBy") or ["ORDER_BY_UNSPECIFIED"])[-1]
        if sort_by == "SORT_BY_SEARCHER_METRIC" and order == "ORDER_BY_UNSPECIFIED":
            order = (
                "ORDER_BY_ASC"
                if exp["config"]["searcher"].get("smaller_is_better", True)
                else "ORDER_BY_DESC"
            )
        keys = {
            "SORT_BY_BATCH_NUMBER": lambda c: c["metadata"].get("steps_completed") or 0,
            "SORT_BY_UUID": lambda c: c["uuid"],
            "SORT_BY_END_TIME": lambda c: c["reportTime"],
            "SORT_BY_STATE": lambda c: c["state"],
            "SORT_BY_SEARCHER_METRIC": lambda c: float(c["training"]["searcherMetric"]),
        }
        key = keys.get(sort_by, lambda c: c["training"]["trialId"])
        if sort_by == "SORT_BY_SEARCHER_METRIC":
            scored = [c for c in ckpts if c["training"]["searcherMetric"] is not None]
            ckpts = sorted(scored, key=key, reverse=order == "ORDER_BY_DESC") + [
                c for c in ckpts if c["training"]["searcherMetric"] is None
            ]
        else:
            ckpts.sort(key=key, reverse=order == "ORDER_BY_DESC")
        offset = int((params.get("offset") or ["0"])[-1])
        limit = int((params.get("limit") or ["0"])[-1])
        total = len(ckpts)
        start = total + offset if offset < 0 else offset
        if not 0 <= start <= total:
            raise ApiError(3, "offset out of bounds")
        end = total if limit == 0 or start + limit > total else start + limit
        pagination = {"offset": offset, "limit": limit, "startIndex": start, "endIndex": end, "total": total}
        return {"checkpoints": ckpts[start:end], "pagination": pagination}

    def metrics_of(self, params: dict[str, list[str]], group: str) -> list[dict]:
        """trialv1.MetricsReport of the trials' reports in a group (GetMetrics,
        GetTrainingMetrics, GetValidationMetrics: api_trials.go streamMetrics)."""
        out = []
        with self.lock:
            for tid in params.get("trialIds") or []:
                trial = self.get_trial(int(tid))
                for r in self.metric_reports(trial, group):
                    out.append(
                        {
                            "trialId": trial["id"],
                            "endTime": r["time"],
                            "metrics": {"avg_metrics": r["avg"], "batch_metrics": r["batch"]},
                            "totalBatches": r["steps"],
                            "archived": False,
                            "id": r["id"],
                            "trialRunId": r["run_id"],
                            "group": group,
                        }
                    )
        return out


def _summarize(summary: dict | None, value) -> dict:
    """db/postgres_trial_metrics.go calculateNewSummaryMetrics: the value's type (number,
    string, boolean, object, array, null; a type change makes it "string"), count, sum, min,
    max and mean of numbers, and the last value (dates and special floats as strings aside)."""
    if isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, (int, float)):
        kind = "number"
    else:
        kind = {dict: "object", list: "array", type(None): "null"}.get(type(value), "string")
    if summary is None:
        summary = {"type": kind}
    elif summary.get("type") != kind:
        kind = "string"
        summary = {"type": kind}
    else:
        summary = dict(summary)
    if kind == "number":
        if "count" not in summary:
            summary.update(max=value, min=value, mean=value, sum=value, count=1)
        else:
            summary["min"] = min(summary["min"], value)
            summary["max"] = max(summary["max"], value)
            summary["sum"] = summary["sum"] + value
            summary["count"] += 1
            summary["mean"] = summary["sum"] / summary["count"]
    summary["last"] = value
    return summary


class Trials(CoreApi):
    """Experiments, trials, their containers and logs; the agents' work queues."""

    def __init__(self, master):
        self.master = master
        self.lock = threading.Condition()
        self.experiments: dict[int, dict] = {}
        self.trials: dict[int, dict] = {}
        self.next_exp = 1
        self.next_trial = 1
        self.next_log = 1
        self.checkpoints: dict[str, dict] = {}  # uuid -> checkpointv1.Checkpoint
        self.owner_id: int | None = None
        self.storage_ids: dict[str, int] = {}  # checkpoint storage config -> storage backend id

    # -- helpers
    def pools(self) -> dict:
        return {p.get("pool_name"): p for p in self.master.conf["resource_pools"]}

    def default_pool(self) -> str:
        rm = self.master.conf.get("resource_manager") or {}
        return rm.get("default_compute_resource_pool") or rm.get("default_gpu_resource_pool") or "default"

    def agent_view(self, pool: str) -> list[dict]:
        """The pool's agents with their slots in use (callers hold self.lock)."""
        used: dict[str, int] = {}
        for trial in self.trials.values():
            for c in trial["containers"].values():
                if c["state"] != "TERMINATED":
                    used[c["agent"]] = used.get(c["agent"], 0) + len(c["devices"])
        with self.master.agents.lock:
            agents = [a for a in self.master.agents.items.values() if a["resource_pool"] == pool]
            return [
                {
                    "id": a["id"],
                    "slots": len(a["devices"]),
                    "used": used.get(a["id"], 0),
                    "usable": a["enabled"] and not a["draining"] and a["awaiting"] is None,
                    "devices": list(a["devices"]),
                    "address": a["address"],
                }
                for a in agents
            ]

    def task_container_defaults(self, pool: str) -> dict:
        """rm.TaskContainerDefaults: the pool's own when it sets them, else the master's."""
        p = self.pools().get(pool) or {}
        return p.get("task_container_defaults") or self.master.conf.get("task_container_defaults") or {}

    def agent_restarted(self, agent_id: str) -> None:
        """The containers the agent's previous process took on ended with it; the ones it never
        acknowledged (still ASSIGNED) go to the new process at once."""
        with self.lock:
            for trial in self.trials.values():
                for cid, c in trial["containers"].items():
                    if c["agent"] != agent_id or c["state"] == "TERMINATED":
                        continue
                    if c["state"] == "ASSIGNED":
                        c["sent"] = 0.0
                    else:
                        c["state"] = "TERMINATED"
                        c["error"] = f"agent {agent_id} restarted: container {cid} lost"
                        self.add_log(trial, c["error"], level="LOG_LEVEL_ERROR", agent_id=agent_id)
            self.lock.notify_all()

    def agent_containers(self, agent_id: str) -> dict:
        """The agent's trial containers as containerv1.Container, by id (agentv1.Agent.containers;
        each slot's "container" is the one holding it)."""
        out = {}
        with self.lock:
            for trial in self.trials.values():
                for cid, c in trial["containers"].items():
                    if c["agent"] == agent_id and c["state"] != "TERMINATED":
                        out[cid] = {
                            "parent": "",
                            "id": cid,
                            "state": f"STATE_{c['state']}",
                            "devices": [
                                {
                                    "id": d["id"],
                                    "brand": d.get("brand", ""),
                                    "uuid": d.get("uuid", ""),
                                    "type": "TYPE_CUDA" if d.get("type") == "cuda" else "TYPE_CPU",
                                }
                                for d in c["devices"]
                            ],
                            "permissionDenied": False,
                        }
        return out

    def allocation_summaries(self) -> dict:
        """GET /api/v1/tasks (api_tasks.go GetTasks): {allocation id: AllocationSummary} of the
        allocations holding containers, the trial's named "Trial <t> (Experiment <e>)" as
        trial.go maybeAllocateTask names it; each container a ResourcesSummary whose
        containerId is the slot's container id (what `det slot list` joins them by:
        harness/determined/cli/agent.py list_slots)."""
        out = {}
        with self.lock:
            for trial in self.trials.values():
                live = {cid: c for cid, c in trial["containers"].items() if c["state"] != "TERMINATED"}
                if not live:
                    continue
                exp = self.experiments[trial["exp"]]
                resources = [
                    {
                        "resourcesId": cid,
                        "resourcesType": "docker-container",
                        "allocationId": trial["allocation_id"],
                        "agentDevices": {
                            c["agent"]: {
                                "devices": [{"id": d["id"], "uuid": d.get("uuid", "")} for d in c["devices"]]
                            }
                        },
                        "containerId": cid,
                        "started": None,
                        "exited": None,
                    }
                    for cid, c in live.items()
                ]
                out[trial["allocation_id"]] = {
                    "taskId": trial["task_id"],
                    "allocationId": trial["allocation_id"],
                    "name": f"Trial {trial['id']} (Experiment {exp['id']})",
                    "registeredTime": timestamp(trial["start"]),
                    "resourcePool": exp["config"]["resources"]["resource_pool"],
                    "slotsNeeded": exp["config"]["resources"]["slots_per_trial"],
                    "resources": resources,
                    "schedulerType": "SCHEDULER_TYPE_PRIORITY",
                    "priority": exp["config"]["resources"].get("priority"),
                    "proxyPorts": [],
                }
        return out

    def add_log(self, trial: dict, message: str, **fields) -> None:
        entry = {
            "id": self.next_log,
            "trialId": trial["id"],
            "message": message,
            "agentId": fields.get("agent_id"),
            "containerId": fields.get("container_id"),
            "rankId": fields.get("rank"),
            "timestamp": timestamp(fields.get("t") or time.time()),
            "level": fields.get("level", "LOG_LEVEL_INFO"),
            "stdtype": fields.get("stdtype"),
            "source": fields.get("source", "master"),
        }
        self.next_log += 1
        trial["logs"].append(entry)
        self.lock.notify_all()

    # -- experiments
    def create(self, body: dict, user: dict) -> dict:
        text = body.get("config")
        if not isinstance(text, str):
            raise ApiError(3, "invalid experiment configuration: config must be a YAML string")
        try:
            config = parse_config(text)
            pool = (config.get("resources") or {}).get("resource_pool") or self.default_pool()
            slots = (config.get("resources") or {}).get("slots_per_trial", 1)
            single = bool((config.get("resources") or {}).get("is_single_node"))
            warnings = self.resolve_resources(pool, slots, single)
            if config.get("entrypoint") is None:
                raise ExpConfigError("managed experiments require entrypoint")
            merged = merge_config(
                config, self.task_container_defaults(pool), self.master.conf.get("checkpoint_storage")
            )
            merged["resources"]["resource_pool"] = pool
            errors = completeness_errors(merged)
            if errors:
                raise ExpConfigError(
                    "invalid experiment configuration: config is invalid or incomplete: " + "\n".join(errors)
                )
            name = merged["searcher"].get("name")
            if name in EOL_SEARCHERS:
                raise ExpConfigError(
                    f"invalid experiment configuration: the {name} searcher has been removed"
                )
            if name != "single":
                raise ExpConfigError(f"lab stand-in: the {name} searcher is not reproduced", 3)
            hparams = hparams_of(merged.get("hyperparameters"))
        except ExpConfigError as e:
            raise ApiError(e.code, str(e)) from None
        files = []
        for item in body.get("modelDefinition") or []:
            # utilv1.File: type is the tar type byte (the CLI sends ord(tarfile.REGTYPE) == 48,
            # ord(DIRTYPE) == 53: harness/determined/common/v1file_utils.py), mode the st_mode.
            try:
                content = base64.b64decode(item.get("content") or "")
                mode = int(item.get("mode") or 0o644) & 0o7777
            except (ValueError, TypeError):
                raise ApiError(3, f"invalid model definition file {item.get('path')!r}") from None
            kind = item.get("type", 48)
            files.append(
                {
                    "path": str(item.get("path") or ""),
                    "dir": kind in (53, "53", "5", "FILE_TYPE_DIRECTORY"),
                    "content": content,
                    "mode": mode or 0o644,
                }
            )
        try:
            private, public = ssh_key_pair()
        except (OSError, subprocess.CalledProcessError) as e:
            raise ApiError(13, f"failed to create experiment: generating ssh keys for trials: {e}") from None
        token = self.master.session_for(user["id"])
        now = time.time()
        with self.lock:
            exp_id = self.next_exp
            self.next_exp += 1
            exp = {
                "id": exp_id,
                "config": merged,
                "original": text,
                "files": files,
                "state": "STATE_ACTIVE" if body.get("activate") else "STATE_PAUSED",
                "archived": False,
                "start": now,
                "end": None,
                "user": user,
                "keys": (private, public),
                "token": token,
                "trials": [],
                "warnings": warnings,
                "job_id": str(uuid.uuid4()),  # the experiment's job (model.NewJobID)
                "model_size": sum(len(f["content"]) for f in files),
            }
            self.experiments[exp_id] = exp
            trial_id = self.next_trial
            self.next_trial += 1
            task_id = f"{exp_id}.{uuid.uuid4()}"
            self.trials[trial_id] = {
                "id": trial_id,
                "exp": exp_id,
                "state": "STATE_ACTIVE" if body.get("activate") else "STATE_PAUSED",
                "alloc_state": "QUEUED",
                "restarts": 0,
                "run_id": 0,
                "hparams": hparams,
                "seed": random.getrandbits(31),
                "task_id": task_id,
                "allocation_id": "",
                "containers": {},
                "logs": [],
                "start": now,
                "end": None,
                "killed": False,
            }
            exp["trials"].append(trial_id)
            self.lock.notify_all()
        return {
            "experiment": self.exp_proto(exp),
            "config": printable_config(merged),
            "warnings": warnings,
        }

    def resolve_resources(self, pool: str, slots: int, single: bool) -> list[str]:
        """spec_util.go ResolveResources with agentrm ResolveResourcePool / ValidateResources."""
        if pool not in self.pools():
            raise ExpConfigError(
                f"invalid resource configuration: resource pool {pool} does not exist or is not "
                "available to workspace id 1",
                3,
            )
        if slots == 0:
            return []
        with self.lock:
            agents = self.agent_view(pool)
        if single:
            if max((a["slots"] for a in agents), default=0) < slots:
                raise ExpConfigError(
                    "invalid resource configuration: validating resources: request unfulfillable, "
                    "please try requesting less slots"
                )
            return []
        if sum(a["slots"] for a in agents) < slots:
            if self.master.conf.get("launch_error", True):
                raise ExpConfigError(
                    "invalid resource configuration: slots requested exceeds cluster capacity"
                )
            return ["LAUNCH_WARNING_CURRENT_SLOTS_EXCEEDED"]
        return []

    def project_owner_id(self) -> int:
        """The Uncategorized project's owner: the 'admin' user
        (migrations/20220311095512_add_workspace_tables.up.sql)."""
        if self.owner_id is None:
            with self.master.db.cursor() as cur:
                cur.execute("SELECT id FROM users WHERE username = 'admin'")
                row = cur.fetchone()
            self.owner_id = row[0] if row else 1
        return self.owner_id

    def exp_proto(self, exp: dict) -> dict:
        """experimentv1.Experiment (proto/src/determined/experiment/v1/experiment.proto), every
        field written as grpc-gateway's JSONPb{EmitDefaults: true} writes it
        (master/internal/grpcutil/api.go); the swagger-required ones (id, name, start_time,
        state, archived, num_trials, username, job_id, searcher_type, project_id,
        original_config, project_owner_id, config) are what the CLI's bindings insist on."""
        trials = [self.trials[t] for t in exp["trials"]]
        ckpts = [c for c in self.checkpoints.values() if c["training"]["experimentId"] == exp["id"]]
        end = exp["end"] or time.time()
        searcher = exp["config"]["searcher"]
        return {
            "id": exp["id"],
            "description": exp["config"].get("description") or "",
            "labels": exp["config"].get("labels") or [],
            "startTime": timestamp(exp["start"]),
            "endTime": timestamp(exp["end"]) if exp["end"] else None,
            "state": exp["state"],
            "archived": exp["archived"],
            "numTrials": len(trials),
            "trialIds": [t["id"] for t in trials],
            "displayName": exp["user"].get("displayName") or "",
            "userId": exp["user"]["id"],
            "username": exp["user"]["username"],
            "resourcePool": exp["config"]["resources"]["resource_pool"],
            "searcherType": searcher.get("name"),
            "searcherMetric": searcher.get("metric") or "",
            "hyperparameters": exp["config"].get("hyperparameters") or {},
            "name": exp["config"].get("name"),
            "notes": "",
            "jobId": exp["job_id"],
            "forkedFrom": None,
            "progress": self.exp_progress(exp),
            "projectId": 1,
            "projectName": "Uncategorized",
            "workspaceId": 1,
            "workspaceName": "Uncategorized",
            "parentArchived": False,
            "config": printable_config(exp["config"]),
            "originalConfig": exp["original"],
            "projectOwnerId": self.project_owner_id(),
            "checkpointSize": str(sum(_ckpt_size(c) for c in ckpts)),  # int64: a JSON string
            "checkpointCount": len(ckpts),
            "unmanaged": False,
            "duration": int((end - exp["start"]) * 1000),
            "modelDefinitionSize": exp.get("model_size", 0),
        }

    def trial_proto(self, trial: dict) -> dict:
        """trialv1.Trial (proto/src/determined/trial/v1/trial.proto); api_trials.go
        ExperimentTrials/GetTrial show an ACTIVE trial by its allocation's state."""
        state = trial["state"]
        if state == "STATE_ACTIVE":
            state = "STATE_" + trial["alloc_state"]
        ckpts = [c for c in self.checkpoints.values() if c["training"]["trialId"] == trial["id"]]
        latest = max(ckpts, key=lambda c: c["reportTime"], default=None)
        return {
            "id": trial["id"],
            "experimentId": trial["exp"],
            "startTime": timestamp(trial["start"]),
            "endTime": timestamp(trial["end"]) if trial["end"] else None,
            "state": state,
            "restarts": trial["restarts"],
            "hparams": trial["hparams"],
            "totalBatchesProcessed": 0,
            "bestValidation": None,
            "latestValidation": None,
            "bestCheckpoint": None,
            "latestTraining": None,
            "summaryMetrics": None,
            "runnerState": "",
            "wallClockTime": 0,
            "warmStartCheckpointUuid": "",
            "taskId": trial["task_id"],
            "totalCheckpointSize": str(sum(_ckpt_size(c) for c in ckpts)),
            "searcherMetricValue": None,
            "taskIds": [trial["task_id"]],
            "logRetentionDays": None,
            "metadata": None,
            "latestCheckpointUuid": latest["uuid"] if latest else None,
        } | self.trial_summary(trial, self.experiments[trial["exp"]])

    def latest_checkpoint(self, trial_id: int) -> dict | None:
        """db.LatestCheckpointForTrial: the trial's latest COMPLETED checkpoint."""
        done = [
            c
            for c in self.checkpoints.values()
            if c["training"]["trialId"] == trial_id and c["state"] == "STATE_COMPLETED"
        ]
        return max(done, key=lambda c: c["reportTime"], default=None)

    def exp_progress(self, exp: dict) -> float:
        """The single searcher's progress (searcher/single.go Progress): its trial's reported
        progress, 1 once the experiment completed."""
        if exp["state"] == "STATE_COMPLETED":
            return 1.0
        trials = [self.trials[t] for t in exp["trials"]]
        return sum(t.get("progress", 0.0) for t in trials) / max(1, len(trials))

    def get_exp(self, exp_id: int) -> dict:
        exp = self.experiments.get(exp_id)
        if exp is None:
            raise ApiError(5, f"experiment '{exp_id}' not found")  # api/error.go NotFoundErrs
        return exp

    def get_trial(self, trial_id: int) -> dict:
        trial = self.trials.get(trial_id)
        if trial is None:
            raise ApiError(5, f"trial '{trial_id}' not found")
        return trial

    def kill(self, exp_id: int) -> None:
        """KillExperiment (experiment.go KillExperiment): nothing for a terminal or already
        killed experiment; else STOPPING_KILLED and the trials' allocations killed at once
        (trial.go transition: KillAllocation)."""
        self.stop(exp_id, "STATE_STOPPING_KILLED")

    def cancel(self, exp_id: int) -> None:
        """CancelExperiment (experiment.go CancelExperiment): nothing for a stopping or terminal
        experiment; else STOPPING_CANCELED and the trials' allocations terminated (trial.go
        transition: TerminateAllocation): a ready allocation is preempted, one that is not
        killed at once (CoreApi.preempt_or_kill)."""
        self.stop(exp_id, "STATE_STOPPING_CANCELED")

    def stop(self, exp_id: int, state: str) -> None:
        with self.lock:
            exp = self.get_exp(exp_id)
            if exp["state"] in TERMINAL or exp["state"] == "STATE_STOPPING_KILLED":
                return
            if state == "STATE_STOPPING_CANCELED" and exp["state"].startswith("STATE_STOPPING_"):
                return
            exp["state"] = state
            for tid in exp["trials"]:
                trial = self.trials[tid]
                trial["killed"] = True
                if state == "STATE_STOPPING_CANCELED":
                    self.preempt_or_kill(trial, exp)  # trial.go: TerminateAllocation
                else:
                    self.kill_containers(trial)  # trial.go: KillAllocation
            self.lock.notify_all()

    def set_paused(self, exp_id: int, paused: bool) -> None:
        """PauseExperiment / ActivateExperiment (api_experiment.go, experiment/bulk_action.go
        PauseExperiments / ActivateExperiments, experiment.go PauseExperiment /
        ActivateExperiment, model.ExperimentTransitions): a terminal experiment has left the
        registry ("experiment in terminal state"); ACTIVE <-> PAUSED, the same state again is a
        no-op, a stopping one is "experiment in incompatible state <STATE>". Pausing terminates
        the trials' allocations (trial.go transition: TerminateAllocation: preempted when ready,
        else killed, see cancel) and the trials wait PAUSED, their restarts not counted; activating queues
        them again."""
        target = "STATE_PAUSED" if paused else "STATE_ACTIVE"
        with self.lock:
            exp = self.get_exp(exp_id)
            if exp["state"] in TERMINAL:
                raise ApiError(9, "experiment in terminal state")
            if exp["state"] == target:
                return
            if exp["state"] not in ("STATE_ACTIVE", "STATE_PAUSED"):
                raise ApiError(9, f"experiment in incompatible state {exp['state'][len('STATE_') :]}")
            exp["state"] = target
            for tid in exp["trials"]:
                trial = self.trials[tid]
                if trial["state"] in TERMINAL:
                    continue
                trial["state"] = target
                if paused:
                    self.preempt_or_kill(trial, exp)
                    if not trial["containers"]:
                        trial["alloc_state"] = "QUEUED"
            self.lock.notify_all()

    def archive(self, exp_id: int) -> None:
        with self.lock:
            exp = self.get_exp(exp_id)
            if exp["archived"]:
                raise ApiError(9, "Experiment is already archived.")
            if exp["state"] not in TERMINAL:
                raise ApiError(9, "Experiment is not in terminal state.")
            exp["archived"] = True

    def delete(self, exp_id: int) -> None:
        with self.lock:
            exp = self.get_exp(exp_id)
            if exp["state"] not in TERMINAL:
                # experiment/bulk_action.go DeleteExperiments (check.State is the proto enum)
                raise ApiError(9, f"cannot delete experiment in {exp['state']} state")
            for tid in exp["trials"]:
                self.trials.pop(tid, None)
            del self.experiments[exp_id]

    # -- queries of the CLI (harness/determined/cli/{experiment,trial,job,checkpoint}.py)
    def list_experiments(self, params: dict[str, list[str]]) -> dict:
        """GetExperiments (api_experiment.go): filters archived, users (usernames), userIds,
        states, name (ILIKE %name%); ordered by id (SORT_BY_UNSPECIFIED, ORDER_BY_DESC is
        descending); offset and limit as runPagedBunExperimentsQuery pages (limit 0: 100)."""
        with self.lock:
            exps = sorted(self.experiments.values(), key=lambda e: e["id"])
            if params.get("archived"):
                archived = params["archived"][-1].lower() in ("true", "1")
                exps = [e for e in exps if e["archived"] == archived]
            if params.get("users"):
                exps = [e for e in exps if e["user"]["username"] in params["users"]]
            if params.get("userIds"):
                exps = [e for e in exps if str(e["user"]["id"]) in params["userIds"]]
            if params.get("states"):
                exps = [e for e in exps if e["state"] in params["states"]]
            if params.get("name"):
                name = params["name"][-1].lower()
                exps = [e for e in exps if name in str(e["config"].get("name") or "").lower()]
            if (params.get("orderBy") or [""])[-1] == "ORDER_BY_DESC":
                exps.reverse()
            pagination = paginate(
                len(exps), int((params.get("offset") or ["0"])[-1]), int((params.get("limit") or ["0"])[-1])
            )
            page = exps[pagination["startIndex"] : pagination["endIndex"]]
            return {"experiments": [self.exp_proto(e) for e in page], "pagination": pagination}

    def workloads(self, trial_id: int, params: dict[str, list[str]] | None = None) -> dict:
        """GetTrialWorkloads (api_trials.go, static/srv/proto_get_trial_workloads.sql): one
        workload a row (training, validation or checkpoint), by total_batches then end time;
        training metrics with batch metrics only when includeBatchMetrics; filter
        FILTER_OPTION_VALIDATION keeps only validations, FILTER_OPTION_CHECKPOINT drops
        trainings; offset/limit paged (page_info: limit 0 is all)."""
        params = params or {}
        flt = (params.get("filter") or ["FILTER_OPTION_UNSPECIFIED"])[-1]
        batches = (params.get("includeBatchMetrics") or ["false"])[-1].lower() in ("true", "1")
        rows = []
        with self.lock:
            trial = self.get_trial(trial_id)
            if flt == "FILTER_OPTION_UNSPECIFIED":
                for r in self.metric_reports(trial, "training"):
                    rows.append((r["steps"], r["time"], {"training": self.metrics_workload(r, batches)}))
            for r in self.metric_reports(trial, "validation"):
                rows.append((r["steps"], r["time"], {"validation": self.metrics_workload(r, False)}))
            if flt != "FILTER_OPTION_VALIDATION":
                for c in self.checkpoints.values():
                    if c["training"]["trialId"] != trial_id:
                        continue
                    steps = c["metadata"].get("steps_completed") or 0
                    checkpoint = {
                        "uuid": c["uuid"],
                        "endTime": c["reportTime"],
                        "state": c["state"],
                        "resources": c["resources"],
                        "totalBatches": steps,
                        "metadata": c["metadata"],
                    }
                    rows.append((steps, c["reportTime"], {"checkpoint": checkpoint}))
        rows.sort(key=lambda row: (row[0], row[1]))
        workloads = [{"training": None, "validation": None, "checkpoint": None} | w for _, _, w in rows]
        offset = int((params.get("offset") or ["0"])[-1])
        limit = int((params.get("limit") or ["0"])[-1])
        pagination = paginate(len(workloads), offset, limit or -1)
        pagination["limit"] = limit
        page = workloads[pagination["startIndex"] : pagination["endIndex"]]
        return {"workloads": page, "pagination": pagination}

    def report_checkpoint(self, body: dict) -> None:
        """ReportCheckpoint (api_trials.go; body: the checkpointv1.Checkpoint itself, api.proto
        `body: "checkpoint"`): the task must be a known trial's (canDoActionsOnTask: "task
        '<id>' not found"), the uuid a UUID (checkpointV2FromProtoWithDefaults), an unset state
        is COMPLETED; GetCheckpoint then shows it as static/views_and_triggers/up/checkpoints.sql
        proto_checkpoints_view builds it."""
        task_id = str(body.get("taskId") or "")
        try:
            ckpt_uuid = str(uuid.UUID(str(body.get("uuid") or "")))
        except ValueError as e:
            raise ApiError(3, f"unconvertable checkpoint: invalid UUID length: {e}") from None
        state = body.get("state") or "STATE_UNSPECIFIED"
        if state == "STATE_UNSPECIFIED":
            state = "STATE_COMPLETED"
        with self.lock:
            trial = next((t for t in self.trials.values() if t["task_id"] == task_id), None)
            if trial is None:
                raise ApiError(5, f"task '{task_id}' not found")
            exp = self.experiments[trial["exp"]]
            self.checkpoints[ckpt_uuid] = {
                "taskId": task_id,
                "allocationId": body.get("allocationId") or None,
                "uuid": ckpt_uuid,
                "reportTime": body.get("reportTime") or timestamp(time.time()),
                "resources": {k: str(v) for k, v in (body.get("resources") or {}).items()},
                "metadata": body.get("metadata") or {},
                "state": state,
                "storageId": body.get("storageId"),
                "training": {
                    "trialId": trial["id"],
                    "experimentId": exp["id"],
                    # e.config: the stored configuration, storage credentials included.
                    "experimentConfig": copy.deepcopy(exp["config"]),
                    "hparams": trial["hparams"],
                    "trainingMetrics": {"avgMetrics": None, "batchMetrics": None},
                    "validationMetrics": {"avgMetrics": None},
                    "searcherMetric": None,
                },
            }

    def get_checkpoint(self, ckpt_uuid: str) -> dict:
        """GetCheckpoint (api_checkpoint.go): a uuid that does not parse is uuid.Parse's error
        (a plain error: 500 Internal), an unknown one "checkpoint '<uuid>' not found"."""
        try:
            uuid.UUID(ckpt_uuid)
        except ValueError:
            raise ApiError(13, f"invalid UUID length: {len(ckpt_uuid)}") from None
        with self.lock:
            ckpt = self.checkpoints.get(ckpt_uuid)
            if ckpt is None:
                raise ApiError(5, f"checkpoint '{ckpt_uuid}' not found")
            return self.checkpoint_metrics(ckpt)

    def scheduler(self, pool: dict) -> dict:
        """The pool's scheduler, else the resource manager's (priority, best fit by default)."""
        rm = self.master.conf.get("resource_manager") or {}
        return pool.get("scheduler") or rm.get("scheduler") or {"type": "priority", "fitting_policy": "best"}

    def resource_pools(self) -> dict:
        """GetResourcePools (api_resourcepool.go; rm/agentrm/agent_resource_manager.go
        GetResourcePools and createResourcePoolSummary for a static pool)."""
        rm = self.master.conf.get("resource_manager") or {}
        pools = []
        for p in self.master.conf["resource_pools"]:
            name = p.get("pool_name")
            sched = self.scheduler(p)
            kind = sched.get("type") or "priority"
            with self.lock:
                agents = self.agent_view(name)
                queued, scheduled = self.pool_job_counts(name)
            types = {d.get("type") for a in agents for d in a["devices"]}
            slot_type = "TYPE_UNSPECIFIED"
            if agents:
                slot_type = "TYPE_CUDA" if "cuda" in types else "TYPE_CPU"
            aux = int(p.get("max_aux_containers_per_agent", 100))
            details: dict = {"aws": None, "gcp": None, "priorityScheduler": None}
            if kind == "priority":
                details["priorityScheduler"] = {
                    "preemption": bool(sched.get("preemption", False)),
                    "defaultPriority": int(sched.get("default_priority", 42)),
                }
            pools.append(
                {
                    "name": name,
                    "description": p.get("description") or "",
                    "type": "RESOURCE_POOL_TYPE_STATIC",
                    "numAgents": len(agents),
                    "slotsAvailable": sum(a["slots"] for a in agents),
                    "slotsUsed": sum(a["used"] for a in agents),
                    "slotType": slot_type,
                    "auxContainerCapacity": aux * len(agents),
                    "auxContainersRunning": 0,
                    "defaultComputePool": (rm.get("default_compute_resource_pool") or "default") == name,
                    "defaultAuxPool": (rm.get("default_aux_resource_pool") or "default") == name,
                    "preemptible": False,
                    "minAgents": 0,
                    "maxAgents": 0,
                    "slotsPerAgent": -1,
                    "auxContainerCapacityPerAgent": aux,
                    "schedulerType": f"SCHEDULER_TYPE_{kind.upper()}",
                    "schedulerFittingPolicy": f"FITTING_POLICY_{(sched.get('fitting_policy') or 'best').upper()}",
                    "location": "on-prem",
                    "imageId": "",
                    "instanceType": "",
                    "masterUrl": "",
                    "masterCertName": "",
                    "startupScript": "",
                    "containerStartupScript": "",
                    "agentDockerNetwork": "",
                    "agentDockerRuntime": "",
                    "agentDockerImage": "",
                    "agentFluentImage": "",
                    "maxIdleAgentPeriod": 0,
                    "maxAgentStartingPeriod": 0,
                    "details": details,
                    "accelerator": "",
                    "stats": {"queuedCount": queued, "scheduledCount": scheduled},
                    "resourceManagerName": "",
                    "resourceManagerMetadata": rm.get("metadata") or {},
                    "clusterName": rm.get("cluster_name") or "",
                }
            )
        return {"resourcePools": pools, "pagination": paginate(len(pools), 0, -1)}

    def pool_jobs(self, pool: str) -> list[dict]:
        """The pool's experiments holding or awaiting an allocation, in the priority
        scheduler's order (priority, then submission), as jobv1.Job (callers hold self.lock)."""
        spec = self.pools().get(pool) or {}
        default_priority = int(self.scheduler(spec).get("default_priority", 42))
        jobs = []
        for exp in sorted(self.experiments.values(), key=lambda e: e["id"]):
            res = exp["config"]["resources"]
            if res["resource_pool"] != pool or exp["state"] in TERMINAL:
                continue
            trials = [self.trials[t] for t in exp["trials"] if self.trials[t]["state"] == "STATE_ACTIVE"]
            if not trials:
                continue
            allocated = sum(
                len(c["devices"])
                for t in trials
                for c in t["containers"].values()
                if c["state"] != "TERMINATED"
            )
            priority = res.get("priority")
            jobs.append(
                {
                    "summary": {"state": "STATE_SCHEDULED" if allocated else "STATE_QUEUED", "jobsAhead": 0},
                    "type": "TYPE_EXPERIMENT",
                    "submissionTime": timestamp(exp["start"]),
                    "username": exp["user"]["username"],
                    "userId": exp["user"]["id"],
                    "resourcePool": pool,
                    "isPreemptible": True,
                    "priority": default_priority if priority is None else int(priority),
                    "weight": float(res.get("weight", 1)),
                    "entityId": str(exp["id"]),
                    "jobId": exp["job_id"],
                    "requestedSlots": res["slots_per_trial"] * len(trials),
                    "allocatedSlots": allocated,
                    "name": exp["config"].get("name"),
                    "progress": 0.0,
                    "workspaceId": 1,
                }
            )
        jobs.sort(key=lambda j: (j["priority"], j["submissionTime"], int(j["entityId"])))
        for ahead, job in enumerate(jobs):
            job["summary"]["jobsAhead"] = ahead
        return jobs

    def pool_job_counts(self, pool: str) -> tuple[int, int]:
        jobs = self.pool_jobs(pool)
        scheduled = sum(j["summary"]["state"] == "STATE_SCHEDULED" for j in jobs)
        return len(jobs) - scheduled, scheduled

    def job_queue(self, params: dict[str, list[str]]) -> dict:
        """GetJobsV2 (api_job.go; GET /api/v1/job-queues-v2): the pool's queue (the default
        compute pool when none is named), each job as jobv1.RBACJob {"full": Job} (the
        basic authz shows every job in full)."""
        pool = (params.get("resourcePool") or [""])[-1] or self.default_pool()
        if pool not in self.pools():
            raise ApiError(5, f"resource pool '{pool}' not found")
        with self.lock:
            jobs = self.pool_jobs(pool)
        if (params.get("orderBy") or [""])[-1] == "ORDER_BY_DESC":
            jobs.reverse()
        states = params.get("states") or []
        if states:
            jobs = [j for j in jobs if j["summary"]["state"] in states]
        pagination = paginate(
            len(jobs), int((params.get("offset") or ["0"])[-1]), int((params.get("limit") or ["0"])[-1])
        )
        page = jobs[pagination["startIndex"] : pagination["endIndex"]]
        return {"jobs": [{"full": j, "limited": None} for j in page], "pagination": pagination}

    # -- scheduling
    def tick(self) -> None:
        """Place queued trials; finish trials whose containers all ended; notice lost agents."""
        with self.lock:
            self.preemption_deadlines()
            present = set()
            with self.master.agents.lock:
                present = {a for a, v in self.master.agents.items.items() if v["awaiting"] is None}
            for trial in sorted(self.trials.values(), key=lambda t: t["id"]):
                exp = self.experiments[trial["exp"]]
                if trial["state"] not in ("STATE_ACTIVE", "STATE_PAUSED"):
                    continue
                for cid, c in trial["containers"].items():
                    if c["state"] != "TERMINATED" and c["agent"] not in present:
                        # The agent's connection ended: its containers are gone for the master.
                        c["state"] = "TERMINATED"
                        c["exit_code"] = None
                        c["error"] = f"agent {c['agent']} was lost"
                        self.add_log(
                            trial, f"container {cid} lost with agent {c['agent']}", level="LOG_LEVEL_ERROR"
                        )
                if trial["containers"]:
                    self.settle(trial, exp)
                elif trial["killed"]:
                    self.finish(trial, exp, "STATE_CANCELED")
                elif exp["state"] == "STATE_ACTIVE" and trial["state"] == "STATE_ACTIVE":
                    self.place(trial, exp)

    def place(self, trial: dict, exp: dict) -> None:
        config = exp["config"]
        pool = config["resources"]["resource_pool"]
        slots = config["resources"]["slots_per_trial"]
        allocation_id = f"{trial['task_id']}.{trial['run_id'] + 1}"  # <task id>.<allocation number>
        agents = self.agent_view(pool)
        fits = find_fits(slots, agents, allocation_id, bool(config["resources"].get("is_single_node")))
        if not fits:
            return
        by_id = {a["id"]: a for a in agents}
        busy: dict[str, set] = {}
        for t in self.trials.values():
            for c in t["containers"].values():
                if c["state"] != "TERMINATED":
                    busy.setdefault(c["agent"], set()).update(d["id"] for d in c["devices"])
        trial["run_id"] += 1
        trial["allocation_id"] = allocation_id
        trial["alloc_state"] = "QUEUED"
        # The allocation's own state (task/allocation.go): ready after the rendezvous, the
        # preemption signal, its acknowledgement, the kill deadline of a preemption.
        trial.update(ready=False, preempt=False, acked=False, preempt_deadline=None, watched=False)
        multi = len(fits) > 1
        placed = []
        for rank, (agent_id, n) in enumerate(fits):
            free = [d for d in by_id[agent_id]["devices"] if d["id"] not in busy.get(agent_id, set())]
            placed.append((rank, agent_id, free[:n]))
        addrs = [by_id[a]["address"] for _, a, _ in placed]
        counts = [len(devs) for _, _, devs in placed]
        trial["rendezvous_info"] = (addrs, counts)
        for rank, agent_id, devices in placed:
            cid = str(uuid.uuid4())
            trial["containers"][cid] = {
                "agent": agent_id,
                "rank": rank,
                "devices": devices,
                "state": "ASSIGNED",
                "exit_code": None,
                "error": None,
                "spec": self.container_spec(trial, exp, cid, rank, devices, multi, addrs, counts),
                "sent": 0.0,  # monotonic time the spec last went to the agent
                "kill": False,
                "kill_sent": 0.0,
            }
        self.add_log(
            trial,
            f"Scheduling Trial {trial['id']} (Experiment {exp['id']}) on {', '.join(a for _, a, _ in placed)}",
        )
        self.lock.notify_all()

    def container_spec(self, trial, exp, cid, rank, devices, multi, addrs, counts) -> dict:
        """TrialSpec.ToTaskSpec + TaskSpec.ToDockerSpec, as the agent receives it; trial.go
        buildTaskSpecifier: the trial's latest checkpoint (DET_LATEST_CHECKPOINT) and its
        steps_completed (DET_STEPS_COMPLETED), what a restarted harness resumes from."""
        config = exp["config"]
        latest = self.latest_checkpoint(trial["id"])
        steps_completed = int((latest or {}).get("metadata", {}).get("steps_completed") or 0) if latest else 0
        pool = config["resources"]["resource_pool"]
        tcd = self.task_container_defaults(pool)
        chain = getattr(self.master, "tls_chain", None)  # the master's certificates, with TLS
        dtype = devices[0].get("type", "cpu") if devices else "cpu"
        dtype = "cuda" if dtype in ("cuda", "gpu") else ("rocm" if dtype == "rocm" else "cpu")
        env = config["environment"]
        image = (env.get("image") or {}).get(dtype)
        det_env = {
            "PYTHONUSERBASE": "/run/determined/pythonuserbase",
            "DET_TASK_ID": trial["task_id"],
            "DET_ALLOCATION_ID": trial["allocation_id"],
            "DET_RESOURCES_ID": cid,
            "DET_CONTAINER_ID": cid,
            "DET_SESSION_TOKEN": exp["token"],
            "DET_USER_TOKEN": exp["token"],
            "DET_WORKDIR": WORKDIR,
            "DET_RUN_DIR": "/run/determined",
            "DET_USER": exp["user"]["username"],
            # task.go EnvVars: with a master certificate, DET_USE_TLS and DET_MASTER_CERT_FILE.
            "DET_USE_TLS": "true" if chain else "false",
            "DET_SEGMENT_ENABLED": "false",
            "DET_TASK_LOGGING_METADATA": json.dumps(
                {"allocation_id": trial["allocation_id"], "task_id": trial["task_id"]}, separators=(",", ":")
            ),
            "DET_RESOURCES_TYPE": "docker-container",
            "DET_EXPERIMENT_ID": str(exp["id"]),
            "DET_TRIAL_ID": str(trial["id"]),
            "DET_TRIAL_RUN_ID": str(trial["run_id"]),
            "DET_TRIAL_SEED": str(trial["seed"]),
            "DET_EXPERIMENT_CONFIG": json.dumps(config, separators=(",", ":")),
            "DET_HPARAMS": json.dumps(trial["hparams"], separators=(",", ":")),
            "DET_STEPS_COMPLETED": str(steps_completed),
            "DET_TASK_TYPE": "TRIAL",
        }
        if latest:
            det_env["DET_LATEST_CHECKPOINT"] = latest["uuid"]
        if chain:
            det_env["DET_MASTER_CERT_FILE"] = MASTER_CERT_PATH
        if tcd.get("gloo_port_range"):
            det_env["GLOO_PORT_RANGE"] = tcd["gloo_port_range"]
        if tcd.get("dtrain_network_interface"):
            det_env["DET_INTER_NODE_NETWORK_INTERFACE"] = tcd["dtrain_network_interface"]
        env_list = [f"{k}={v}" for k, v in det_env.items()] + list(env["environment_variables"][dtype])
        res = config["resources"]
        shm = res.get("shm_size") or tcd.get("shm_size_bytes") or 4294967296
        entry = config["entrypoint"]
        cmd = list(entry) if isinstance(entry, list) else ["sh", "-c", entry]
        private, public = exp["keys"]
        files = [{"path": "/run/determined", "dir": True, "mode": 0o700}]
        for d in ("/run/determined/info", "/run/determined/pythonuserbase", WORKDIR, "/run/determined/ssh"):
            files.append({"path": d, "dir": True, "mode": 0o755 if d.endswith("info") else 0o700})
        if chain:
            # copy.go masterCertArchive: the chain as a root-owned 0644 file.
            for d in ("/run/determined/etc", "/run/determined/etc/ssl", os.path.dirname(PREP_PATH)):
                files.append({"path": d, "dir": True, "mode": 0o755})
            for path, content in ((MASTER_CERT_PATH, chain), (PREP_PATH, prep_source())):
                files.append({"path": path, "content": base64.b64encode(content).decode(), "mode": 0o644})
            cmd = ["python3", PREP_PATH, *cmd]
        for f in exp["files"]:
            path = os.path.normpath(os.path.join(WORKDIR, f["path"]))
            if not path.startswith(WORKDIR + "/"):
                continue
            if f["dir"]:
                files.append({"path": path, "dir": True, "mode": f["mode"] or 0o755})
            else:
                files.append(
                    {"path": path, "content": base64.b64encode(f["content"]).decode(), "mode": f["mode"]}
                )
        info = {
            "cluster.json": {
                "master_url": None,  # the agent's DET_MASTER (agent/internal/containers/spec.go)
                "cluster_id": self.master.cluster_id,
                "agent_id": None,  # the agent's DET_AGENT_ID
                "slot_ids": [d["id"] for d in devices],
                "task_id": trial["task_id"],
                "allocation_id": trial["allocation_id"],
                "session_token": exp["token"],
                "task_type": "TRIAL",
                "master_cert_name": None,  # the agent's DET_MASTER_CERT_NAME
                "master_cert_file": MASTER_CERT_PATH if chain else None,
                "latest_checkpoint": latest["uuid"] if latest else None,
            },
            "trial.json": {
                "trial_id": trial["id"],
                "experiment_id": exp["id"],
                "trial_seed": trial["seed"],
                "hparams": trial["hparams"],
                "config": config,
                "steps_completed": steps_completed,
                "trial_run_id": trial["run_id"],
                "debug": bool(config.get("debug")),
                "inter_node_network_interface": tcd.get("dtrain_network_interface") or None,
            },
            "rendezvous.json": {
                "container_addrs": addrs,
                "container_rank": rank,
                "container_slot_counts": counts,
            },
            "resources.json": {"gpu_uuids": [d.get("uuid") for d in devices if d.get("type") == "cuda"]},
        }
        for name, data in info.items():
            content = json.dumps(data).encode()
            files.append(
                {
                    "path": f"/run/determined/info/{name}",
                    "content": base64.b64encode(content).decode(),
                    "mode": 0o644,
                }
            )
        for name, data, mode in (
            ("id_rsa", private, 0o600),
            ("id_rsa.pub", public, 0o644),
            ("authorized_keys", public, 0o644),
        ):
            files.append(
                {
                    "path": f"/run/determined/ssh/{name}",
                    "content": base64.b64encode(data).decode(),
                    "mode": mode,
                }
            )
        mounts = []
        for m in config.get("bind_mounts") or []:
            target = m["container_path"]
            if not target.startswith("/"):
                target = os.path.join(WORKDIR, target)
            mounts.append(
                {
                    "Type": "bind",
                    "Source": m["host_path"],
                    "Target": target,
                    "ReadOnly": bool(m.get("read_only")),
                    "BindOptions": {"Propagation": m.get("propagation") or "rprivate"},
                }
            )
        cs = config.get("checkpoint_storage") or {}
        if cs.get("type") == "shared_fs":
            mounts.append(
                {
                    "Type": "bind",
                    "Source": cs["host_path"],
                    "Target": "/determined_shared_fs",
                    "BindOptions": {"Propagation": cs.get("propagation") or "rprivate"},
                }
            )
        return {
            "container_id": cid,
            "trial_id": trial["id"],
            "rank": rank,
            "description": f"exp-{exp['id']}-trial-{trial['id']}-attempt-{trial['run_id']}",
            "image": image,
            "force_pull": bool(env.get("force_pull_image")),
            "env": env_list,
            "cmd": cmd,
            "workdir": WORKDIR,
            "network_mode": "host" if multi else (tcd.get("network_mode") or "bridge"),
            "shm_size": shm,
            "cap_add": list(env.get("add_capabilities") or []),
            "cap_drop": list(env.get("drop_capabilities") or []),
            "devices": [
                {
                    "PathOnHost": d["host_path"],
                    "PathInContainer": d["container_path"],
                    "CgroupPermissions": d.get("mode") or "mrw",
                }
                for d in res.get("devices") or []
            ],
            "mounts": mounts,
            "slots": devices,
            "files": files,
        }

    def kill_containers(self, trial: dict) -> None:
        for c in trial["containers"].values():
            if c["state"] == "ASSIGNED" and not c["sent"]:
                c["state"] = "TERMINATED"  # never handed to the agent
                c["error"] = "killed before start"
            elif c["state"] != "TERMINATED":
                c["kill"] = True
        self.lock.notify_all()

    def settle(self, trial: dict, exp: dict) -> None:
        containers = trial["containers"].values()
        failed = [c for c in containers if c["state"] == "TERMINATED" and (c["exit_code"] != 0 or c["error"])]
        if failed and not trial.get("killing"):
            # The allocation ends when one container fails: the others are killed.
            trial["killing"] = True
            self.kill_containers(trial)
        if not all(c["state"] == "TERMINATED" for c in containers):
            running = [c["state"] for c in containers]
            for state in ("RUNNING", "STARTING", "PULLING"):
                if state in running:
                    trial["alloc_state"] = state
                    break
            return
        trial["containers"] = {}
        trial["killing"] = False
        preempted = trial.get("acked") and trial.get("preempt")
        trial["preempt_deadline"] = None
        if trial["killed"]:
            self.finish(trial, exp, "STATE_CANCELED")
        elif preempted:
            # calculateExitStatus: "allocation preempted", not a user-requested stop: the trial
            # waits (paused) or is scheduled again, its restarts not counted.
            trial["alloc_state"] = "QUEUED"
            self.add_log(trial, f"trial {trial['id']} preempted")
        elif not failed:
            self.finish(trial, exp, "STATE_COMPLETED")
        elif trial["state"] == "STATE_PAUSED":
            trial["alloc_state"] = "QUEUED"  # terminated by the pause: waits for activation
            self.add_log(trial, f"trial {trial['id']} paused")
        elif trial["restarts"] < exp["config"].get("max_restarts", 5):
            trial["restarts"] += 1
            trial["alloc_state"] = "QUEUED"
            self.add_log(
                trial, f"trial failed, restarting ({trial['restarts']}/{exp['config']['max_restarts']})"
            )
        else:
            self.finish(trial, exp, "STATE_ERROR")

    def finish(self, trial: dict, exp: dict, state: str) -> None:
        trial["state"] = state
        trial["end"] = time.time()
        self.add_log(trial, f"trial {trial['id']} ended: {state}")
        trials = [self.trials[t] for t in exp["trials"]]
        if all(t["state"] in TERMINAL for t in trials):
            stopping = exp["state"] in ("STATE_STOPPING_KILLED", "STATE_STOPPING_CANCELED")
            if stopping or any(t["state"] == "STATE_CANCELED" for t in trials):
                exp["state"] = "STATE_CANCELED"
            elif all(t["state"] == "STATE_ERROR" for t in trials):
                exp["state"] = "STATE_ERROR"  # searcher Shutdown{Failure}: "hp search failed"
            else:
                exp["state"] = "STATE_COMPLETED"
            exp["end"] = time.time()
        self.lock.notify_all()

    # -- the agents' side
    def take_work(self, agent_id: str, wait: float) -> dict:
        """The containers to start and to kill. A long poll's answer can be lost (the agent
        process ended while its request waited), so each spec and kill goes out again every
        RESEND seconds until the agent reports on that container; the agent ignores repeats."""
        deadline = time.monotonic() + wait
        with self.lock:
            while True:
                now = time.monotonic()
                work: dict[str, list] = {"start": [], "kill": []}
                for trial in self.trials.values():
                    for cid, c in trial["containers"].items():
                        if c["agent"] != agent_id or c["state"] == "TERMINATED":
                            continue
                        if c["kill"] and now - c["kill_sent"] > RESEND:
                            c["kill_sent"] = now
                            work["kill"].append(cid)
                        elif not c["kill"] and c["state"] == "ASSIGNED" and now - c["sent"] > RESEND:
                            c["sent"] = now
                            work["start"].append(c["spec"])
                if work["start"] or work["kill"] or now >= deadline:
                    return work
                self.lock.wait(min(deadline - now, 1.0))

    def container_event(self, agent_id: str, body: dict) -> bool:
        """Returns False for a container the master does not know (the agent kills it)."""
        cid = body.get("container_id")
        with self.lock:
            for trial in self.trials.values():
                c = trial["containers"].get(cid)
                if c is None or c["agent"] != agent_id:
                    continue
                state = body.get("state")
                if c["state"] == "TERMINATED":
                    return state == "TERMINATED"
                c["state"] = state
                if state == "TERMINATED":
                    c["exit_code"] = body.get("exit_code")
                    c["error"] = body.get("error")
                    if c["error"]:
                        self.add_log(
                            trial,
                            c["error"],
                            level="LOG_LEVEL_ERROR",
                            agent_id=agent_id,
                            container_id=cid,
                            rank=c["rank"],
                            source="agent",
                        )
                    self.add_log(
                        trial,
                        f"container {cid} exited with code {c['exit_code']}",
                        agent_id=agent_id,
                        container_id=cid,
                        rank=c["rank"],
                        source="agent",
                    )
                self.settle(trial, self.experiments[trial["exp"]])
                self.lock.notify_all()
                return True
        return False

    def container_logs(self, agent_id: str, body: dict) -> None:
        with self.lock:
            index = {cid: t for t in self.trials.values() for cid in t["containers"]}
            for line in body.get("logs") or []:
                trial = index.get(line.get("container_id"))
                if trial is None:
                    continue
                c = trial["containers"][line["container_id"]]
                self.add_log(
                    trial,
                    str(line.get("message", "")),
                    agent_id=agent_id,
                    container_id=line["container_id"],
                    rank=c["rank"],
                    stdtype=line.get("stdtype"),
                    source="container",
                    t=line.get("time"),
                )

    # -- HTTP
    def handle(self, h) -> bool:
        """Routes under /api/v1/experiments, /api/v1/trials and the agents' work protocol."""
        path, method = h.route_path, ("GET" if h.command == "HEAD" else h.command)
        if path == "/agents/work" and method == "GET":
            agent_id = h.query.get("id", "")
            wait = min(float(h.query.get("wait") or 0), 25.0)
            h.reply(200, self.take_work(agent_id, wait))
            return True
        if path == "/agents/containers" and method == "POST":
            known = self.container_event(h.query.get("id", ""), h.body_json())
            h.reply(200 if known else 404, {} if known else {"message": "unknown container"})
            return True
        if path == "/agents/logs" and method == "POST":
            self.container_logs(h.query.get("id", ""), h.body_json())
            h.reply(200, {})
            return True
        m = re.fullmatch(r"/api/v1/tasks/([^/]+)/context_directory", path)
        if m and method == "GET":
            # GetTaskContextDirectory, what a trial's prep step asks first (lab_prep_container.py);
            # the lab copies the model definition in itself, so the archive is empty.
            h.require_user()
            with self.lock:
                known = any(t["task_id"] == m[1] for t in self.trials.values())
            if not known:
                raise ApiError(5, f"task not found: {m[1]}")
            h.reply(200, {"b64Tgz": ""})
            return True
        if path == "/api/v1/tasks" and method == "GET":
            h.require_user()
            h.reply(200, {"allocationIdToSummary": self.allocation_summaries()})
            return True
        if path == "/api/v1/experiments" and method == "POST":
            user = h.require_user()
            h.reply(200, self.create(h.body_json(), user))
            return True
        params = parse_qs(urlsplit(h.path).query, keep_blank_values=True)
        if self.handle_core_api(h, path, method, params):
            return True
        # Each route: proto/src/determined/api/v1/api.proto at v0.38.0 (google.api.http).
        queries = {
            "/api/v1/experiments": lambda: self.list_experiments(params),  # GetExperiments
            "/api/v1/resource-pools": self.resource_pools,  # GetResourcePools
            "/api/v1/job-queues-v2": lambda: self.job_queue(params),  # GetJobsV2
        }
        if path in queries and method == "GET":
            h.require_user()
            h.reply(200, queries[path]())
            return True
        if path == "/api/v1/checkpoints" and method == "POST":  # ReportCheckpoint
            h.require_user()
            self.report_checkpoint(h.body_json())
            h.reply(200, {})
            return True
        m = re.fullmatch(r"/api/v1/checkpoints/([^/]+)", path)
        if m and method == "GET":  # GetCheckpoint
            h.require_user()
            h.reply(200, {"checkpoint": self.get_checkpoint(m[1])})
            return True
        m = re.fullmatch(r"/api/v1/experiments/([0-9]+)(/[a-z]+)?", path)
        if m:
            h.require_user()
            exp_id, action = int(m[1]), m[2] or ""
            actions = {  # POST /api/v1/experiments/{id}/<action>: empty responses
                "/kill": self.kill,  # KillExperiment
                "/cancel": self.cancel,  # CancelExperiment
                "/archive": self.archive,  # ArchiveExperiment
                "/pause": lambda i: self.set_paused(i, True),  # PauseExperiment
                "/activate": lambda i: self.set_paused(i, False),  # ActivateExperiment
            }
            if method == "GET" and action == "":  # GetExperiment
                with self.lock:
                    exp = self.get_exp(exp_id)
                    h.reply(
                        200,
                        {
                            "experiment": self.exp_proto(exp),
                            "jobSummary": None,
                            "config": printable_config(exp["config"]),
                        },
                    )
            elif method == "GET" and action == "/trials":  # GetExperimentTrials
                with self.lock:
                    exp = self.get_exp(exp_id)
                    trials = [self.trial_proto(self.trials[t]) for t in exp["trials"]]
                n = len(trials)
                h.reply(200, {"trials": trials, "pagination": paginate(n, 0, -1)})
            elif method == "POST" and action in actions:
                actions[action](exp_id)
                h.reply(200, {})
            elif method == "DELETE" and action == "":  # DeleteExperiment
                self.delete(exp_id)
                h.reply(200, {})
            else:
                raise ApiError(*UNKNOWN_URI)
            return True
        m = re.fullmatch(r"/api/v1/trials/([0-9]+)(/logs|/workloads)?", path)
        if m and method == "GET":
            h.require_user()
            trial_id = int(m[1])
            if m[2] == "/logs":  # TrialLogs
                self.stream_logs(h, trial_id)
            elif m[2] == "/workloads":  # GetTrialWorkloads
                h.reply(200, self.workloads(trial_id, params))
            else:  # GetTrial
                with self.lock:
                    h.reply(200, {"trial": self.trial_proto(self.get_trial(trial_id))})
            return True
        return False

    def handle_core_api(self, h, path: str, method: str, params: dict[str, list[str]]) -> bool:
        """The harness's routes (api.proto at v0.38.0) and the readers of what it reports."""
        m = re.fullmatch(
            r"/api/v1/allocations/([^/]+)/(acceleratorData|signals/preemption|signals/ack_preemption)", path
        )
        if m and (method, m[2]) in (
            ("POST", "acceleratorData"),  # PostAllocationAcceleratorData
            ("GET", "signals/preemption"),  # AllocationPreemptionSignal
            ("POST", "signals/ack_preemption"),  # AckAllocationPreemptionSignal
        ):
            h.require_user()
            if m[2] == "acceleratorData":
                self.accelerator_data(m[1], h.body_json())
                h.reply(200, {})
            elif m[2] == "signals/preemption":
                timeout = float(h.query.get("timeoutSeconds") or h.query.get("timeout_seconds") or 0)
                h.reply(200, self.watch_preemption(m[1], min(timeout, 600.0)))
            else:
                self.ack_preemption(m[1])
                h.reply(200, {})
            return True
        m = re.fullmatch(r"/api/v1/allocations/([^/]+)/resources/([^/]+)/rendezvous", path)
        if m and method == "GET":  # AllocationRendezvousInfo
            h.require_user()
            h.reply(200, self.rendezvous(m[1], m[2]))
            return True
        if path == "/api/v1/runs/start" and method == "POST":  # RunPrepareForReporting
            h.require_user()
            h.reply(200, self.prepare_for_reporting(h.body_json()))
            return True
        m = re.fullmatch(r"/api/v1/trials/([0-9]+)/(metrics|progress)", path)
        if m and method == "POST":  # ReportTrialMetrics, ReportTrialProgress
            h.require_user()
            body = h.body_json()
            if m[2] == "metrics":
                self.report_metrics(int(m[1]), body)
            else:
                self.report_progress(int(m[1]), body)
            h.reply(200, {})
            return True
        m = re.fullmatch(r"/api/v1/experiments/([0-9]+)/checkpoints", path)
        if m and method == "GET":  # GetExperimentCheckpoints
            h.require_user()
            h.reply(200, self.experiment_checkpoints(int(m[1]), params))
            return True
        groups = {
            "/api/v1/trials/metrics/trial_metrics": None,  # GetMetrics (group=...)
            "/api/v1/trials/metrics/training_metrics": "training",  # GetTrainingMetrics
            "/api/v1/trials/metrics/validation_metrics": "validation",  # GetValidationMetrics
        }
        if path in groups and method == "GET":
            h.require_user()
            group = groups[path] or (params.get("group") or [""])[-1]
            if not group:
                raise ApiError(3, "metric group cannot be empty")
            # Server streaming: one {"result": {"metrics": [...]}} a line (grpc-gateway).
            line = json.dumps({"result": {"metrics": self.metrics_of(params, group)}}).encode() + b"\n"
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(line)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(line)
            return True
        return False

    def stream_logs(self, h, trial_id: int) -> None:
        """TrialLogs: server streaming, which grpc-gateway writes as one JSON object a line."""
        follow = (h.query.get("follow") or "").lower() in ("1", "true")
        limit = int(h.query.get("limit") or 0)
        with self.lock:
            self.get_trial(trial_id)
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        sent = 0
        count = 0
        while True:
            with self.lock:
                trial = self.trials.get(trial_id)
                logs = list(trial["logs"][sent:]) if trial else []
                done = trial is None or trial["state"] in TERMINAL
                if not logs and follow and not done:
                    self.lock.wait(1.0)
                    continue
            chunk = b""
            for entry in logs:
                if limit and count >= limit:
                    done = True
                    break
                chunk += json.dumps({"result": entry}).encode() + b"\n"
                count += 1
            sent += len(logs)
            if chunk and h.command != "HEAD":
                h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                h.wfile.flush()
            if not follow or done:
                break
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()


def paginate(total: int, offset: int, limit: int) -> dict:
    """apiv1.Pagination as runPagedBunExperimentsQuery (api_experiment.go) computes it."""
    start = offset
    if offset > total or offset < -total:
        start = total
    elif offset < 0:
        start = total + offset
    if limit == -2:
        end = start
    elif limit == -1:
        end = total
    elif limit == 0:
        end = min(start + 100, total)
    else:
        end = min(start + limit, total)
    return {"offset": offset, "limit": limit, "startIndex": start, "endIndex": end, "total": total}


def _ckpt_size(ckpt: dict) -> int:
    return sum(int(v) for v in (ckpt.get("resources") or {}).values())


def printable_config(config: dict) -> dict:
    """ExperimentConfig.Printable(): the S3 keys hidden."""
    out = copy.deepcopy(config)
    cs = out.get("checkpoint_storage") or {}
    for key in ("access_key", "secret_key"):
        if cs.get(key) is not None:
            cs[key] = "********"
    return out


def prep_source() -> bytes:
    """lab_prep_container.py, packed beside this module."""
    with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), PREP_SOURCE_NAME), "rb") as f:
        return f.read()


def new_token() -> str:
    return "v2.public." + base64.urlsafe_b64encode(secrets.token_bytes(48)).decode().rstrip("=")
