"""Verify's smoke experiment: the configurations, the trial's S3 part against the MinIO stand-in
and its single-agent interface rule, the log-to-verdict, container-log-to-cause and
failure-to-hint mapping, the busy check, the runner with a fake master, the stand-in's GetTasks,
the lab image's Debian layer."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from deploy.experiment import lint, smoke, template
from deploy.experiment.target import load
from tests.unit.test_standin_minio import PASSWORD, REGION, USER, MinioProcess
from tests.verify import smoke_client as sc
from tests.verify.hints import HINTS
from tests.verify.matrix import FAIL, Cell, Result

REPO = Path(__file__).resolve().parents[2]
LAB = str(REPO / "inventories" / "lab" / "cluster.yaml")
TRIAL = REPO / "deploy" / "experiment" / "smoke_model" / smoke.TRIAL_FILE
LAB_TRIALS = REPO / "tests" / "lab" / "standins" / "determined" / "lab_trials.py"


@pytest.fixture(scope="module")
def target():
    return load(LAB)


# --- configurations ---------------------------------------------------------------------------


SLOTS = {smoke.ALLREDUCE: 16, smoke.SINGLE: 8}


@pytest.mark.parametrize("kind", smoke.KINDS)
def test_configs_come_from_the_template_and_pass_the_lint(kind, target, tmp_path):
    kwargs = {"restore_uuid": "0" * 8 + "-0000-4000-8000-" + "0" * 12} if kind == smoke.RESTORE else {}
    slots = SLOTS.get(kind, 1)
    doc = smoke.config(target, kind, "20260101-000000-abcdef", slots=slots, **kwargs)
    assert doc["entrypoint"] == f"python3 {smoke.TRIAL_FILE}"
    assert doc["max_restarts"] == 0
    assert doc["resources"]["slots_per_trial"] == slots
    assert doc["hyperparameters"]["smoke"] == kind
    storage = doc["checkpoint_storage"]
    assert storage["prefix"] == "verify-smoke/20260101-000000-abcdef"
    assert (storage["bucket"], storage["endpoint_url"]) == (target.bucket, target.endpoint_url)
    assert not {"region", "access_key", "secret_key"} & set(storage)  # the master gives trials those
    # No image of its own: the trial runs what task_container_defaults gives (a broken one is red).
    assert "image" not in doc["environment"]
    path = tmp_path / "experiment.yaml"
    path.write_text(smoke.config_yaml(target, kind, "20260101-000000-abcdef", slots=slots, **kwargs))
    model = tmp_path / "model"
    model.mkdir()
    (model / smoke.TRIAL_FILE).write_text(smoke.TRIAL_PY)
    errors = [p for p in lint.lint(str(path), target, str(model)) if not p.warning]
    assert errors == []


def test_the_smoke_runs_the_masters_default_image_users_keep_theirs(target):
    trials = importlib.util.spec_from_file_location("lab_trials", LAB_TRIALS)
    module = importlib.util.module_from_spec(trials)
    trials.loader.exec_module(module)
    tcd = {"image": {"cuda": "registry/broken:1", "cpu": "registry/broken-cpu:1"}}
    for kind in (smoke.SAVE, smoke.SINGLE):
        config = module.parse_config(smoke.config_yaml(target, kind, "r1", slots=SLOTS.get(kind, 1)))
        merged = module.merge_config(config, tcd, None)
        assert merged["environment"]["image"] == {"cuda": "registry/broken:1", "cpu": "registry/broken-cpu:1"}
    # `experiment new` still pins the cluster's images in users' experiments.
    users = yaml.safe_load(template.experiment_yaml(target, 1))
    assert users["environment"]["image"] == {"cuda": target.image_gpu, "cpu": target.image_cpu}


def test_the_cluster_prefix_stays_in_front(target):
    with_prefix = dataclasses.replace(target, prefix="/team/ckpts/")
    assert smoke.smoke_prefix(with_prefix, "r1") == "team/ckpts/verify-smoke/r1"
    doc = smoke.config(with_prefix, smoke.SAVE, "r1")
    assert doc["checkpoint_storage"]["prefix"] == "team/ckpts/verify-smoke/r1"


def test_bad_inputs_are_refused(target):
    with pytest.raises(ValueError, match="needs the uuid"):
        smoke.config(target, smoke.RESTORE, "r1")
    with pytest.raises(ValueError, match="run id"):
        smoke.smoke_prefix(target, "../etc")
    with pytest.raises(ValueError, match="smoke kind"):
        smoke.config(target, "train", "r1")


def test_model_definition_is_what_the_cli_sends():
    (entry,) = smoke.model_definition()
    assert entry["path"] == smoke.TRIAL_FILE
    assert entry["type"] == ord(tarfile.REGTYPE) and entry["mtime"] == "0"
    assert entry["mode"] == 0o100644
    assert base64.b64decode(entry["content"]).decode() == TRIAL.read_text()


# --- the trial's verdict lines ----------------------------------------------------------------


def test_outcome_reads_the_verdict_of_its_own_row():
    uuid = "1b4e28ba-2fa1-4d3b-883f-0016d3cca427"
    lines = [
        "noise",
        f"SMOKE-OK checkpoint-save: uuid={uuid} s3://b/p (2 files, region us-east-1)",
        "SMOKE-FAIL allreduce: AllReduce timeout",
    ]
    saved = smoke.outcome(smoke.SAVE, lines)
    assert saved is not None and saved.ok and saved.uuid == uuid
    failed = smoke.outcome(smoke.ALLREDUCE, lines)
    assert failed is not None and not failed.ok and failed.line == "AllReduce timeout"
    assert smoke.outcome(smoke.RESTORE, lines) is None
    part = smoke.outcome(smoke.ALLREDUCE, ["SMOKE-PART allreduce: container 1 took part (sum 3)"])
    assert part is None  # only rank 0 gives the verdict
    first_failure = smoke.outcome(smoke.ALLREDUCE, ["SMOKE-OK allreduce: fine", "SMOKE-FAIL allreduce: x"])
    assert first_failure == smoke.Outcome(False, "x")


# The messages as MinIO gives them (cmd/api-errors.go; the stand-in copies them).
REGION_LINE = (
    "S3 AuthorizationHeaderMalformed: The authorization header is malformed; the region is wrong; "
    "expecting 'eu-central-1'. Trials sign for us-east-1 (AWS_DEFAULT_REGION); boto3 signed again "
    "for MinIO's region and went on, clients that do not follow fail (upload of s3://b/p to http://e)"
)


@pytest.mark.parametrize(
    ("kind", "line", "hint"),
    [
        (smoke.SAVE, REGION_LINE, sc.REGION),
        (smoke.SAVE, "S3 SignatureDoesNotMatch: The request signature we calculated does not match", sc.KEYS),
        (smoke.SAVE, "S3 InvalidAccessKeyId: The Access Key Id you provided does not exist", sc.KEYS),
        (smoke.SAVE, "S3 AccessDenied: Access Denied.", sc.KEYS),
        (smoke.SAVE, "S3 NoSuchBucket: The specified bucket does not exist", sc.BUCKET),
        (smoke.SAVE, "EndpointConnectionError: Could not connect to the endpoint URL", sc.ENDPOINT),
        (smoke.SAVE, "boto3 is not in the image: No module named 'boto3'", sc.IMAGE),
        (smoke.RESTORE, "S3 NoSuchKey: The specified key does not exist.", sc.GONE),
        (smoke.RESTORE, "s3://b/p/state.bin: content differs from what the save trial wrote", sc.GONE),
        (smoke.ALLREDUCE, "AllReduce timeout: the sshd of container 1 at 10.78.0.12:12350 ...", sc.FABRIC),
        (smoke.ALLREDUCE, "mpirun over ib0 exited 1: ssh: connect to host 10.78.0.12: No route", sc.FABRIC),
        (smoke.ALLREDUCE, "mpirun over ib0 exited 255: Permission denied (publickey).", sc.SSH),
        (smoke.ALLREDUCE, "the containers are on one node (['a', 'a'])", sc.PLACEMENT),
        (smoke.ALLREDUCE, "neither mpi4py nor torch in the image", sc.IMAGE),
        (smoke.SAVE, "the master refused the experiment: POST /api/v1/experiments -> 400: x", sc.REFUSED),
        (smoke.ALLREDUCE, "did not finish in 150s: experiment STATE_ACTIVE, trial STATE_QUEUED", sc.STUCK),
        (smoke.SAVE, "experiment STATE_ERROR without a verdict from the trial: pull failed", sc.CRASHED),
        (
            smoke.SINGLE,
            "NCCL: NCCL WARN Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=ib0; ...)",
            sc.IFNAME,
        ),
        (smoke.SINGLE, "Gloo: Unable to find address for: ib0 (GLOO_SOCKET_IFNAME=ib0; ...)", sc.IFNAME),
        (smoke.ALLREDUCE, "NCCL WARN Bootstrap : no socket interface found", sc.FABRIC),
        (smoke.SINGLE, "mpirun of 8 ranks over the interfaces Open MPI picks exited 1: x", sc.COLLECTIVE),
        (smoke.SINGLE, "AllReduce timeout: 8 ranks over eth0 did not finish in 60s (x)", sc.COLLECTIVE),
        (smoke.SINGLE, "the trial got 2 containers: it did not fit on one agent", sc.SINGLE_PLACEMENT),
        (smoke.SINGLE, "neither mpi4py nor torch in the image", sc.IMAGE),
        (smoke.SAVE, "the trial's container on lab-gpu1 failed ...: docker: pull access denied", sc.PULL),
        (
            smoke.SAVE,
            "the trial's container on x failed ...: Temporary failure in name resolution",
            sc.ENDPOINT,
        ),
        (
            smoke.ALLREDUCE,
            "... failed ...: ssh: Could not resolve hostname lab-gpu3: Name or service",
            sc.RESOLVE,
        ),
        (smoke.SINGLE, "... failed ...: socket.gaierror: [Errno -2] Name or service not known", sc.RESOLVE),
        (smoke.RESTORE, "... failed ...: [Errno 111] Connection refused", sc.ENDPOINT),
        (smoke.SAVE, "... failed ...: botocore: An error occurred (NoSuchBucket) when calling", sc.BUCKET),
        (
            smoke.SINGLE,
            "CUDA driver version is insufficient for CUDA runtime version: the image's CUDA 12.4.0",
            sc.CUDA,
        ),
        (smoke.SAVE, "cuInit returned 802 CUDA_ERROR_SYSTEM_NOT_READY (on NVSwitch ...", sc.CUDA),
    ],
)
def test_failure_hints(kind, line, hint):
    assert sc.failure_hint(kind, line) == hint


def test_every_smoke_row_has_a_static_hint_and_the_matrix_takes_a_fitted_one():
    rows = (
        "test_smoke_trial_saves_a_checkpoint",
        "test_smoke_trial_restores_it",
        "test_smoke_two_agent_allreduce",
        "test_smoke_single_agent_allreduce",
    )
    assert all(r in HINTS for r in rows)
    fitted = Result(
        "test_smoke.py::x", "(cluster)", None, FAIL, "m", hint=(sc.REGION.symptom, sc.REGION.action)
    )
    assert Cell([fitted]).hint("test_smoke.py::x", "") == sc.REGION
    plain = Result("test_smoke.py::test_smoke_trial_restores_it", "(cluster)", None, FAIL, "m")
    assert Cell([plain]).hint(plain.check, "").symptom == HINTS["test_smoke_trial_restores_it"].symptom


# --- the container's own cause, when the trial said nothing ----------------------------------


def log(message, agent=None, source="container", level="LOG_LEVEL_INFO"):
    return {"message": message, "agentId": agent, "source": source, "level": level}


@pytest.mark.parametrize(
    ("kind", "entries", "cause", "agent", "hint"),
    [
        # The agent could not pull the master's default image (the smoke names none).
        (
            smoke.SAVE,
            [
                log("Scheduling Trial 3 (Experiment 2) on lab-gpu1-0", source="master"),
                log("docker: Error response from daemon: pull access denied for reg/x", "lab-gpu1-0", "agent",
                    "LOG_LEVEL_ERROR"),
                log("container 9f exited with code 125", "lab-gpu1-0", "agent"),
            ],
            "docker: Error response from daemon: pull access denied for reg/x",
            "lab-gpu1-0",
            sc.PULL,
        ),
        # A resolver error before the traceback it causes is the cause, not the traceback's end.
        (
            smoke.SAVE,
            [
                log("Traceback (most recent call last):", "lab-gpu3"),
                log('  File "/usr/lib/python3/dist-packages/urllib3/connection.py", line 1', "lab-gpu3"),
                log("socket.gaierror: [Errno -3] Temporary failure in name resolution", "lab-gpu3"),
                log("botocore.exceptions.EndpointConnectionError: Could not connect", "lab-gpu3"),
            ],
            "socket.gaierror: [Errno -3] Temporary failure in name resolution",
            "lab-gpu3",
            sc.ENDPOINT,
        ),
        (
            smoke.ALLREDUCE,
            [log("hello", "lab-gpu2-0"),
             log("ssh: Could not resolve hostname lab-gpu3: Name or service not known", "lab-gpu2-0")],
            "ssh: Could not resolve hostname lab-gpu3: Name or service not known",
            "lab-gpu2-0",
            sc.RESOLVE,
        ),
        (
            smoke.SINGLE,
            [log("lab-gpu2-0:88:88 [0] bootstrap.cc:45 NCCL WARN Bootstrap : no socket interface found",
                 "lab-gpu2-0")],
            "lab-gpu2-0:88:88 [0] bootstrap.cc:45 NCCL WARN Bootstrap : no socket interface found",
            "lab-gpu2-0",
            sc.IFNAME,
        ),
        (
            smoke.SINGLE,
            [log("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:84] "
                 "ifa != nullptr. Unable to find address for: ib0", "lab-gpu3")],
            "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:84] "
            "ifa != nullptr. Unable to find address for: ib0",
            "lab-gpu3",
            sc.IFNAME,
        ),
        (
            smoke.RESTORE,
            [log("x", "lab-gpu1-1"),
             log("ConnectionRefusedError: [Errno 111] Connection refused", "lab-gpu1-1")],
            "ConnectionRefusedError: [Errno 111] Connection refused",
            "lab-gpu1-1",
            sc.ENDPOINT,
        ),
        (
            smoke.SAVE,
            [log("botocore.exceptions.ClientError: An error occurred (NoSuchBucket) when calling the "
                 "PutObject operation: The specified bucket does not exist", "lab-gpu1-0")],
            "botocore.exceptions.ClientError: An error occurred (NoSuchBucket) when calling the "
            "PutObject operation: The specified bucket does not exist",
            "lab-gpu1-0",
            sc.BUCKET,
        ),
        # No known cause: a traceback's exception line.
        (
            smoke.SAVE,
            [log("starting"), log("Traceback (most recent call last):"), log('  File "x.py", line 3'),
             log("KeyError: 'checkpoint_storage'")],
            "KeyError: 'checkpoint_storage'",
            None,
            sc.CRASHED,
        ),
        (smoke.SAVE, ["sh: 1: python3: not found"], "sh: 1: python3: not found", None, sc.IMAGE),
    ],
)  # fmt: skip
def test_container_cause_names_the_first_error_and_its_agent(kind, entries, cause, agent, hint):
    found = sc.container_cause(entries)
    assert found == sc.Cause(cause, agent)
    line = sc.crash_line(found, sc.node_of_agent({"lab-gpu1", "lab-gpu2", "lab-gpu3"}))
    assert cause[:100] in line and sc.failure_hint(kind, line) == hint
    if agent:
        node = agent.rsplit("-", 1)[0] if agent != "lab-gpu3" else agent
        assert f"on {node}" in line


def test_container_cause_is_none_without_an_error_line():
    quiet = [log("Scheduling Trial 1 (Experiment 1) on a", source="master"), log("hello"), log("")]
    assert sc.container_cause(quiet) is None
    assert sc.container_cause(["SMOKE-PART allreduce: container 1 took part (sum 3)"]) is None


# --- slots: free, or held by whom -------------------------------------------------------------

NODE_OF = sc.node_of_agent({"lab-gpu1", "lab-gpu2", "lab-gpu3"})
LAB_AGENTS = (("lab-gpu1-0", 4), ("lab-gpu1-1", 4), ("lab-gpu2-0", 8), ("lab-gpu3", 8))


def api_agents(held: dict[str, dict[int, str]] | None = None, sizes=LAB_AGENTS, disabled=()) -> list[dict]:
    """GET /api/v1/agents as Determined 0.38 answers it: slots keyed by path, a held slot's
    "container" the containerv1.Container holding it. held: {agent: {slot index: container}}."""
    held = held or {}
    agents = []
    for agent_id, n in sizes:
        slots = {}
        for i in range(n):
            cid = held.get(agent_id, {}).get(i)
            container = {"id": cid, "state": "STATE_RUNNING", "devices": [{"id": i}]} if cid else None
            slots[f"/agents/{agent_id}/slots/{i}"] = {"id": str(i), "enabled": True, "container": container}
        agents.append(
            {"id": agent_id, "slots": slots, "enabled": agent_id not in disabled, "draining": False}
        )
    return agents


def whole(*cids_by_agent):
    return {agent: dict.fromkeys(range(n), cid) for agent, n, cid in cids_by_agent}


@pytest.mark.parametrize(
    ("kind", "slots", "held", "blocked"),
    [
        (smoke.SAVE, 1, {}, None),
        (smoke.SAVE, 1, whole(("lab-gpu1-0", 4, "a"), ("lab-gpu1-1", 4, "b"), ("lab-gpu2-0", 8, "c")), None),
        (smoke.SAVE, 1, whole(("lab-gpu1-0", 4, "a"), ("lab-gpu1-1", 4, "b"), ("lab-gpu2-0", 8, "c"),
                              ("lab-gpu3", 8, "d")), ("a", "b", "c", "d")),
        (smoke.ALLREDUCE, 16, {}, None),
        (smoke.ALLREDUCE, 16, {"lab-gpu3": {0: "u"}}, ("u",)),  # one slot held: not a whole agent
        (smoke.ALLREDUCE, 16, {"lab-gpu1-0": {0: "w"}}, None),  # other sizes do not count
        (smoke.ALLREDUCE, 8, {}, ()),  # both 4-slot agents are on lab-gpu1: not two nodes
        (smoke.SINGLE, 8, {"lab-gpu3": {0: "u"}}, None),  # lab-gpu2-0 is whole
        (smoke.SINGLE, 8, {"lab-gpu3": {0: "u"}, "lab-gpu2-0": {7: "v"}}, ("u", "v")),
        (smoke.SINGLE, 8, {"lab-gpu1-0": {0: "w"}, "lab-gpu3": {0: "u"}, "lab-gpu2-0": {7: "v"}}, ("u", "v")),
    ],
)  # fmt: skip
def test_blocking_says_who_holds_the_slots_a_row_needs(kind, slots, held, blocked):
    assert sc.blocking(kind, slots, sc.agent_slots(api_agents(held), NODE_OF)) == blocked


def test_disabled_agents_offer_nothing_and_name_no_holder():
    agents = sc.agent_slots(api_agents(disabled={"lab-gpu2-0", "lab-gpu3"}), NODE_OF)
    assert sc.blocking(smoke.SINGLE, 8, agents) == ()
    assert "no container holds them" in sc.busy_line(smoke.SINGLE, 8, [])


# GET /api/v1/tasks as Determined 0.38 answers it (the fields `det slot list` reads).
TASKS = {
    "7.1b4e28ba-2fa1-4d3b-883f-0016d3cca427.1": {
        "taskId": "7.1b4e28ba-2fa1-4d3b-883f-0016d3cca427",
        "allocationId": "7.1b4e28ba-2fa1-4d3b-883f-0016d3cca427.1",
        "name": "Trial 9 (Experiment 7)",
        "resources": [{"containerId": "c-bert", "agentDevices": {"lab-gpu2-0": {"devices": [{"id": 0}]}}}],
    },
    "8.2.1": {"taskId": "8.2", "name": "Trial 10 (Experiment 8)", "resources": [{"containerId": "c-gpt"}]},
    "nb.1": {
        "taskId": "3f2a",
        "name": "Notebook (quickly-fond-lynx)",
        "resources": [{"containerId": "c-nb"}],
    },
}


def test_holders_are_named_by_their_experiment():
    owners = sc.holders_of(("c-bert", "c-gpt", "c-nb", "c-gone"), TASKS)
    assert owners == {
        "c-bert": 7,
        "c-gpt": 8,
        "c-nb": "Notebook (quickly-fond-lynx)",
        "c-gone": "container c-gone",
    }


@pytest.mark.parametrize(
    ("agents", "allreduce", "single"),
    [
        ([("lab-gpu1-0", 8), ("lab-gpu2-0", 8), ("lab-gpu3", 8)], 16, 8),
        ([("lab-gpu1-0", 4), ("lab-gpu1-1", 4), ("lab-gpu2", 8), ("lab-gpu3", 8)], 16, 8),  # 4s on one node
        ([("lab-gpu1-0", 4), ("lab-gpu2-0", 4), ("lab-gpu3", 8)], 8, 8),
        ([("lab-gpu1", 8)], None, 8),
        ([("lab-gpu1", 8), ("lab-gpu2", 8, False)], None, 8),  # disabled
        ([("lab-gpu1", 1), ("lab-gpu2", 1)], 2, None),  # one slot: no collective inside an agent
        ([("other-1", 8), ("lab-gpu2", 4)], None, 4),  # not this cluster's
    ],
)
def test_row_sizes(agents, allreduce, single):
    listed = api_agents(sizes=[a[:2] for a in agents], disabled={a[0] for a in agents if len(a) > 2})
    assert sc.allreduce_slots(listed, NODE_OF) == allreduce
    assert sc.single_slots(listed, NODE_OF) == single


# --- the runner, with a fake master -----------------------------------------------------------


class FakeApi:
    """A master whose experiments end at once; `say[kind]` is what that trial prints; `agents`
    is GET /api/v1/agents, `tasks` GET /api/v1/tasks, `users` the experiments users run."""

    def __init__(self, say, refuse=frozenset(), states=None, agents=None, tasks=None, users=None,
                 trial_state="STATE_COMPLETED"):  # fmt: skip
        self.say, self.refuse, self.states = say, refuse, states or {}
        self.listed = api_agents() if agents is None else agents
        self.summaries, self.users = tasks or {}, users or {}
        self.trial_state = trial_state
        self.experiments: dict[int, tuple[str, dict]] = {}
        self.ended: list[int] = []
        self.calls: list[str] = []

    def create(self, config_yaml: str) -> int:
        doc = yaml.safe_load(config_yaml)
        kind = doc["hyperparameters"]["smoke"]
        if kind in self.refuse:
            raise sc.SmokeError("POST /api/v1/experiments -> 400: invalid experiment")
        number = 100 + len(self.experiments)
        self.experiments[number] = (kind, doc)
        return number

    def state(self, experiment: int) -> str:
        kind = self.experiments[experiment][0]
        return self.states.get(kind, "STATE_COMPLETED")

    def trials(self, experiment: int) -> list[dict]:
        return [{"id": experiment, "state": self.trial_state}]

    def logs(self, trial: int) -> list:
        return self.say.get(self.experiments[trial][0], [])

    def agents(self) -> list[dict]:
        self.calls.append("agents")
        return self.listed

    def tasks(self) -> dict:
        self.calls.append("tasks")
        return self.summaries

    def experiment(self, experiment: int) -> dict:
        return self.users[experiment]

    def end(self, experiment: int) -> str:
        self.ended.append(experiment)
        return self.state(experiment)


UUID = "1b4e28ba-2fa1-4d3b-883f-0016d3cca427"
GREEN = {
    "save": [f"SMOKE-OK checkpoint-save: uuid={UUID} s3://b/verify-smoke/r1/{UUID}"],
    "restore": [f"SMOKE-OK checkpoint-restore: uuid={UUID} read back, sha256 matches"],
    "allreduce": ["SMOKE-PART allreduce: container 1", "SMOKE-OK allreduce: 2 ranks over ib0: sum 3"],
    "single": ["SMOKE-OK single-agent-allreduce: 8 ranks on lab-gpu2 over eth0 with Open MPI: sum 36"],
}


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(sc, "POLL", 0.0)
    monkeypatch.setattr(sc, "KILL_WAIT", 0.0)


def run(api, target):
    removed: list[str] = []

    def remove(prefix):
        removed.append(prefix)
        return f"removed {prefix}"

    runner = sc.Smoke(api, target, "r1", remove, NODE_OF)
    rows = runner.run()
    return runner, rows, removed


def submitted(api, kind):
    return [doc for k, doc in api.experiments.values() if k == kind]


def test_all_green_restore_gets_the_saved_uuid(target, fast):
    api = FakeApi(GREEN)
    runner, rows, removed = run(api, target)
    assert {k: r.status for k, r in rows.items()} == dict.fromkeys(smoke.KINDS, sc.OK)
    (restore_doc,) = submitted(api, smoke.RESTORE)
    assert restore_doc["hyperparameters"]["restore_uuid"] == UUID
    assert restore_doc["resources"]["slots_per_trial"] == 1
    assert submitted(api, smoke.ALLREDUCE)[0]["resources"]["slots_per_trial"] == 16
    (single_doc,) = submitted(api, smoke.SINGLE)
    assert single_doc["resources"]["slots_per_trial"] == 8 and "image" not in single_doc["environment"]
    kinds = [k for k, _ in api.experiments.values()]
    assert kinds.index(smoke.SINGLE) > kinds.index(smoke.ALLREDUCE)  # after the two-agent row
    assert sorted(api.ended) == sorted(api.experiments) and removed == ["verify-smoke/r1"]


def test_a_failed_save_skips_the_restore_and_keeps_its_hint(target, fast):
    api = FakeApi(
        {**GREEN, "save": [f"SMOKE-FAIL checkpoint-save: {REGION_LINE}"]},
        states={"save": "STATE_ERROR"},
    )
    _, rows, removed = run(api, target)
    assert rows[smoke.SAVE].status == sc.FAIL and rows[smoke.SAVE].hint == sc.REGION
    assert rows[smoke.RESTORE].status == sc.SKIP
    assert rows[smoke.RESTORE].line == "not run: no checkpoint from the save trial"
    assert rows[smoke.ALLREDUCE].status == sc.OK and rows[smoke.SINGLE].status == sc.OK
    assert len(api.experiments) == 3 and removed  # the cleanup ran


def test_a_refused_experiment_and_no_two_agents(target, fast):
    api = FakeApi(GREEN, refuse={"save"}, agents=api_agents(sizes=[("lab-gpu2-0", 8)]))
    _, rows, _ = run(api, target)
    assert rows[smoke.SAVE].status == sc.FAIL and rows[smoke.SAVE].hint == sc.REFUSED
    assert rows[smoke.RESTORE].status == sc.SKIP
    assert rows[smoke.ALLREDUCE].status == sc.SKIP and "fewer than two" in rows[smoke.ALLREDUCE].line
    assert rows[smoke.SINGLE].status == sc.OK


def test_a_trial_that_dies_without_a_verdict_names_its_containers_cause(target, fast):
    pulled = log("docker: Error response from daemon: pull access denied for reg/x", "lab-gpu1-0", "agent")
    api = FakeApi({**GREEN, "save": [pulled], "allreduce": []}, states={"save": "STATE_ERROR"})
    _, rows, _ = run(api, target)
    save = rows[smoke.SAVE]
    assert save.status == sc.FAIL and save.hint == sc.PULL
    assert save.line == (
        "the trial's container on lab-gpu1 (agent lab-gpu1-0) failed before the trial said why: "
        "docker: Error response from daemon: pull access denied for reg/x"
    )
    assert rows[smoke.ALLREDUCE].status == sc.FAIL and rows[smoke.ALLREDUCE].hint == sc.CRASHED


def test_the_single_agent_row_fails_with_the_collectives_error(target, fast):
    line = (
        "SMOKE-FAIL single-agent-allreduce: NCCL: NCCL WARN Bootstrap : no socket interface found "
        "(NCCL_SOCKET_IFNAME=ib0; this container has eth0, lo) on 3f2a9c"
    )
    api = FakeApi({**GREEN, "single": [log(line, "lab-gpu2-0")]}, states={"single": "STATE_ERROR"})
    _, rows, _ = run(api, target)
    single = rows[smoke.SINGLE]
    assert single.status == sc.FAIL and single.hint == sc.IFNAME
    assert single.line.startswith("NCCL: NCCL WARN Bootstrap : no socket interface found")


USERS = {7: {"name": "bert-large", "username": "alice"}, 8: {"name": "gpt", "username": "bob"}}


def test_busy_rows_are_skipped_at_once_naming_the_experiments(target, fast):
    # Users hold both 8-slot agents: the two whole-agent rows are busy, the 1-slot ones run.
    held = {"lab-gpu2-0": dict.fromkeys(range(8), "c-bert"), "lab-gpu3": {0: "c-gpt"}}
    api = FakeApi(GREEN, agents=api_agents(held), tasks=TASKS, users=USERS)
    _, rows, _ = run(api, target)
    for kind in (smoke.ALLREDUCE, smoke.SINGLE):
        assert rows[kind].status == sc.SKIP and rows[kind].experiment is None
        assert rows[kind].line.startswith("not run: busy: ")
        assert 'experiment 7 "bert-large" (alice)' in rows[kind].line
        assert 'experiment 8 "gpt" (bob)' in rows[kind].line
    assert rows[smoke.SINGLE].line == (
        'not run: busy: all 8 slots of one agent wanted, held by experiment 7 "bert-large" (alice), '
        'experiment 8 "gpt" (bob)'
    )
    assert not submitted(api, smoke.ALLREDUCE) and not submitted(api, smoke.SINGLE)
    assert rows[smoke.SAVE].status == sc.OK and rows[smoke.RESTORE].status == sc.OK


def test_a_full_cluster_submits_nothing(target, fast):
    held = {a: dict.fromkeys(range(n), "c-bert") for a, n in LAB_AGENTS}
    api = FakeApi(GREEN, agents=api_agents(held), tasks=TASKS, users=USERS)
    _, rows, _ = run(api, target)
    assert api.experiments == {}
    assert all(r.status == sc.SKIP for r in rows.values())
    assert rows[smoke.SAVE].line == 'not run: busy: 1 slot wanted, held by experiment 7 "bert-large" (alice)'
    assert rows[smoke.RESTORE].line == rows[smoke.SAVE].line


def test_a_master_without_gettasks_still_says_busy(target, fast):
    class NoTasks(FakeApi):
        def tasks(self):
            raise sc.SmokeError("GET /api/v1/tasks -> 404: Not Found")

    held = {"lab-gpu2-0": {0: "c-1"}, "lab-gpu3": {0: "c-2"}}
    _, rows, _ = run(NoTasks(GREEN, agents=api_agents(held)), target)
    assert (
        rows[smoke.SINGLE].line
        == "not run: busy: all 8 slots of one agent wanted, held by container c-1, container c-2"
    )


@pytest.mark.parametrize(
    ("trial_state", "status", "start"),
    [
        # Queued at the deadline while users hold the slots: busy, not red.
        ("STATE_QUEUED", sc.SKIP,
         "queued, not run: busy: all 8 slots of one agent wanted, held by experiment 7"),
        # Scheduled, then it hangs: red, whoever holds the slots by then.
        ("STATE_RUNNING", sc.FAIL, "did not finish in 0s: experiment STATE_ACTIVE, trial STATE_RUNNING"),
    ],
)  # fmt: skip
def test_a_trial_still_active_at_the_deadline(target, fast, monkeypatch, trial_state, status, start):
    monkeypatch.setattr(sc, "DEADLINE", 0)

    class TakenAfterTheCheck(FakeApi):
        def create(self, config_yaml):
            if yaml.safe_load(config_yaml)["hyperparameters"]["smoke"] == smoke.SINGLE:
                held = {"lab-gpu2-0": {0: "c-bert"}, "lab-gpu3": {0: "c-bert"}}
                self.listed = api_agents(held, sizes=[("lab-gpu2-0", 8), ("lab-gpu3", 8)])
            return super().create(config_yaml)

    api = TakenAfterTheCheck(
        GREEN,
        states={"single": "STATE_ACTIVE"},
        agents=api_agents(sizes=[("lab-gpu2-0", 8), ("lab-gpu3", 8)]),
        tasks=TASKS,
        users=USERS,
        trial_state=trial_state,
    )
    # Only the single-agent row reaches its deadline active; the others end at once.
    api.trials = lambda e: [
        {"id": e, "state": trial_state if api.experiments[e][0] == "single" else "STATE_COMPLETED"}
    ]
    _, rows, _ = run(api, target)
    single = rows[smoke.SINGLE]
    assert (single.status, single.line[: len(start)]) == (status, start)
    if status == sc.FAIL:
        assert single.hint == sc.STUCK


def test_cleanup_runs_when_the_master_goes_away(target, fast):
    class Broken(FakeApi):
        def state(self, experiment):
            raise sc.SmokeError("GET /api/v1/experiments/1: connection refused")

        def end(self, experiment):
            raise sc.SmokeError("POST kill: connection refused")

    api = Broken({})
    removed: list[str] = []
    runner = sc.Smoke(api, target, "r1", lambda p: removed.append(p) or "ok", NODE_OF)
    with pytest.raises(sc.SmokeError):
        runner.run()
    assert removed == ["verify-smoke/r1"] and any("not archived" in n for n in runner.cleanup_notes)


def test_error_bodies_give_one_line():
    assert sc._message(b'{"code": 3, "message": "invalid experiment: region", "details": []}') == (
        "invalid experiment: region"
    )
    assert sc._message(b'{"error": {"error": "not found"}}') == "not found"
    assert sc._message(b"<html>bad gateway</html>") == "<html>bad gateway</html>"


# --- the trial itself: its S3 part against the MinIO stand-in ---------------------------------


def trial_module():
    spec = importlib.util.spec_from_file_location("smoke_trial", TRIAL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trial_error_lines():
    trial = trial_module()
    from botocore.exceptions import ClientError

    e = ClientError({"Error": {"Code": "SignatureDoesNotMatch", "Message": "no match"}}, "PutObject")
    assert trial.s3_error(e) == "S3 SignatureDoesNotMatch: no match"
    wrapped = Exception(
        "Failed to upload x: An error occurred (AccessDenied) when calling the PutObject operation: Denied"
    )
    assert trial.s3_error(wrapped) == "S3 AccessDenied: Denied"
    out = (
        "[hwloc/linux] failed\nssh: connect to host 10.78.0.12 port 12350: No route to host\nORTE was unable"
    )
    assert trial.mpi_error(out) == "ssh: connect to host 10.78.0.12 port 12350: No route to host"


def test_trial_interface_check(capsys):
    trial = trial_module()
    trial.check_interface("allreduce", 1, "lo")  # up ("unknown": no carrier state)
    with pytest.raises(SystemExit):
        trial.check_interface("allreduce", 1, "nosuchif0")
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("SMOKE-FAIL allreduce: AllReduce would time out: container 1 on ")
    assert line.endswith("nosuchif0 missing") and sc.failure_hint(smoke.ALLREDUCE, line) == sc.FABRIC


BRIDGE = {"eth0": True, "lo": True}  # a bridge-network container's interfaces (running)
HOST = {"eth0": True, "lo": True, "ib0": True, "ib1": False}  # a host-network one, ib1 down
NO_IF = "NCCL: NCCL WARN Bootstrap : no socket interface found"  # NCCL's bootstrap.cc WARN


@pytest.mark.parametrize(
    ("env", "interfaces", "error"),
    [
        ({}, BRIDGE, None),  # nothing named: the library picks, the row passes
        ({"NCCL_SOCKET_IFNAME": "ib0"}, HOST, None),
        ({"NCCL_SOCKET_IFNAME": "ib"}, HOST, None),  # a prefix, as NCCL matches it
        ({"NCCL_SOCKET_IFNAME": "=ib"}, HOST, NO_IF + " ("
         "NCCL_SOCKET_IFNAME==ib; this container has eth0, ib0, ib1, lo)"),
        ({"NCCL_SOCKET_IFNAME": "ib1"}, HOST, NO_IF + " ("
         "NCCL_SOCKET_IFNAME=ib1; this container has eth0, ib0, ib1, lo)"),
        ({"NCCL_SOCKET_IFNAME": "^eth,lo"}, BRIDGE, NO_IF + " ("
         "NCCL_SOCKET_IFNAME=^eth,lo; this container has eth0, lo)"),
        ({"NCCL_SOCKET_IFNAME": "ib0"}, BRIDGE, NO_IF + " ("
         "NCCL_SOCKET_IFNAME=ib0; this container has eth0, lo)"),
        ({"GLOO_SOCKET_IFNAME": "ib0"}, BRIDGE, "Gloo: Unable to find address for: ib0 ("
         "GLOO_SOCKET_IFNAME=ib0; this container has eth0, lo)"),
        ({"GLOO_SOCKET_IFNAME": "eth0,ib0"}, BRIDGE, "Gloo: Unable to find address for: ib0 ("
         "GLOO_SOCKET_IFNAME=eth0,ib0; this container has eth0, lo)"),
        ({"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}, BRIDGE, None),
        # The deploy's master.yaml today: both name the IPoIB interface for every trial.
        ({"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0",
          "DET_INTER_NODE_NETWORK_INTERFACE": "ib0"},
         BRIDGE, NO_IF + " (NCCL_SOCKET_IFNAME=ib0; "
                 "this container has eth0, lo)"),
    ],
)  # fmt: skip
def test_single_agent_socket_interface_is_find_or_fail(env, interfaces, error):
    trial = trial_module()
    assert trial.socket_interface_error(env, interfaces) == error
    if error:
        assert sc.failure_hint(smoke.SINGLE, error) == sc.IFNAME


def test_single_agent_row_fails_in_this_process_as_in_a_bridge_container(tmp_path, monkeypatch, capsys):
    trial = trial_module()
    rendezvous = tmp_path / "rendezvous.json"
    rendezvous.write_text(json.dumps({"container_addrs": ["10.77.0.12"], "container_rank": 0,
                                      "container_slot_counts": [8]}))  # fmt: skip
    monkeypatch.setattr(trial, "RENDEZVOUS", str(rendezvous))
    assert "lo" in trial.addressed_interfaces()  # read from this machine, as in a container
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "nosuchif0")
    with pytest.raises(SystemExit):
        trial.single_agent()
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(
        "SMOKE-FAIL single-agent-allreduce: NCCL: NCCL WARN Bootstrap : no socket interface found "
        "(NCCL_SOCKET_IFNAME=nosuchif0; this container has "
    )
    said = smoke.outcome(smoke.SINGLE, [line])
    assert said is not None and not said.ok and sc.failure_hint(smoke.SINGLE, said.line) == sc.IFNAME
    rendezvous.write_text(json.dumps({"container_addrs": ["a", "b"], "container_rank": 0,
                                      "container_slot_counts": [4, 4]}))  # fmt: skip
    with pytest.raises(SystemExit):
        trial.single_agent()
    assert "did not fit on one agent" in capsys.readouterr().out


def test_standin_get_tasks_names_what_holds_the_slots():
    spec = importlib.util.spec_from_file_location("lab_trials", LAB_TRIALS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trials = module.Trials(master=None)
    config = {"resources": {"resource_pool": "default", "slots_per_trial": 8, "priority": None}}
    trials.experiments[7] = {"id": 7, "config": config}
    devices = [{"id": i, "uuid": f"GPU-{i}"} for i in range(8)]
    trials.trials[9] = {
        "id": 9, "exp": 7, "task_id": "7.abc", "allocation_id": "7.abc.1", "start": 0.0,
        "containers": {
            "c-live": {"agent": "lab-gpu2-0", "devices": devices, "state": "RUNNING"},
            "c-done": {"agent": "lab-gpu3", "devices": devices, "state": "TERMINATED"},
        },
    }  # fmt: skip
    summaries = trials.allocation_summaries()
    assert list(summaries) == ["7.abc.1"]
    summary = summaries["7.abc.1"]
    assert (summary["taskId"], summary["name"], summary["slotsNeeded"]) == (
        "7.abc",
        "Trial 9 (Experiment 7)",
        8,
    )
    (resources,) = summary["resources"]
    assert resources["containerId"] == "c-live" and list(resources["agentDevices"]) == ["lab-gpu2-0"]
    assert sc.holders_of(("c-live",), summaries) == {"c-live": 7}


def run_trial(kind: str, port: int, env_region: str, secret: str = PASSWORD, **hparams) -> list[str]:
    storage = {
        "type": "s3",
        "bucket": "ckpt",
        "endpoint_url": f"http://127.0.0.1:{port}",
        "access_key": USER,
        "secret_key": secret,
        "prefix": "verify-smoke/r1",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        DET_EXPERIMENT_CONFIG=json.dumps({"checkpoint_storage": storage}),
        DET_HPARAMS=json.dumps({"smoke": kind, **hparams}),
        DET_TRIAL_ID="1",
        AWS_DEFAULT_REGION=env_region,
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
    )
    proc = subprocess.run(
        [sys.executable, str(TRIAL)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SMOKE-")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert (proc.returncode == 0) == lines[0].startswith("SMOKE-OK"), proc.stdout + proc.stderr
    assert secret not in proc.stdout + proc.stderr
    return lines


def test_trial_saves_restores_and_reports_s3_errors(tmp_path):
    srv = MinioProcess(
        tmp_path / "data",
        tmp_path,
        {"MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD, "MINIO_SITE_REGION": REGION},
    )
    try:
        srv.wait_ready()
        srv.client().make_bucket("ckpt")
        (saved,) = run_trial("save", srv.port, REGION)
        said = smoke.outcome(smoke.SAVE, [saved])
        assert said is not None and said.ok and said.uuid, saved
        objects = sorted(o.object_name for o in srv.client().list_objects("ckpt", recursive=True))
        assert objects == [
            f"verify-smoke/r1/{said.uuid}/metadata.json",
            f"verify-smoke/r1/{said.uuid}/state.bin",
        ]
        (restored,) = run_trial("restore", srv.port, REGION, restore_uuid=said.uuid)
        assert restored.startswith("SMOKE-OK checkpoint-restore:"), restored
        (missing,) = run_trial(
            "restore", srv.port, REGION, restore_uuid="0" * 8 + "-0000-4000-8000-" + "0" * 12
        )
        assert "S3 NoSuchKey" in missing and sc.failure_hint(smoke.RESTORE, missing) == sc.GONE
        (region,) = run_trial("save", srv.port, "us-east-1")
        assert "S3 AuthorizationHeaderMalformed" in region and f"expecting '{REGION}'" in region, region
        assert sc.failure_hint(smoke.SAVE, region) == sc.REGION
        (keys,) = run_trial("save", srv.port, REGION, secret="not-the-secret-key")
        assert "S3 SignatureDoesNotMatch" in keys and sc.failure_hint(smoke.SAVE, keys) == sc.KEYS
    finally:
        srv.kill()


# --- the lab task images' Debian layer --------------------------------------------------------


def make_deb(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    root = tmp_path / f"{name}-root"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: amd64\nMaintainer: lab <lab@example.org>\n"
        "Description: test\n"
    )
    out = tmp_path / f"{name}_1.0_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-b", str(root), str(out)], check=True, capture_output=True
    )
    return out


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_debian_layer_lands_in_merged_usr_and_is_reproducible(tmp_path, monkeypatch):
    from tests.lab import registry

    monkeypatch.setattr(registry, "LAYERS", tmp_path / "layers")
    debs = [
        make_deb(tmp_path, "libfoo", {"lib/x86_64-linux-gnu/libfoo.so.1": "elf"}),
        make_deb(tmp_path, "openmpi-bin", {"usr/bin/mpirun.openmpi": "#!/bin/sh\n"}),
    ]
    layer = registry.write_layer("d1", registry.fill_debs(debs))
    with tarfile.open(layer.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert "usr/lib/x86_64-linux-gnu/libfoo.so.1" in members
    assert "lib" not in members and not any(n.startswith("lib/") for n in members)  # the base's symlink stays
    assert members["usr/bin/mpirun"].linkname == "/etc/alternatives/mpirun"
    assert members["etc/alternatives/mpirun"].linkname == "/usr/bin/mpirun.openmpi"
    assert {m.mtime for m in members.values()} == {0}
    assert registry.write_layer("d2", registry.fill_debs(debs)).digest == layer.digest
    config = json.loads(registry.image_config(registry.IMAGES[0], [layer, layer, layer]))
    assert len(config["history"]) == len(config["rootfs"]["diff_ids"]) == 3


# --- an agent lost under the trial: the cause from its journal --------------------------------

# The lab agent's journal as `journalctl -o cat` prints it (logrus with colours, as
# Determined's agent logs by default), after /etc/hosts lost the master's name.
AGENT_JOURNAL = (
    "\x1b[36mINFO\x1b[0m[2026-12-02T02:29:56Z] connecting to master at: ws://lab-master:23457/agents"
    "?id=lab-gpu3  \x1b[36mcomponent\x1b[0m=agent\n"
    "\x1b[33mWARN\x1b[0m[2026-12-02T02:31:39Z] cannot report a container state               "
    '\x1b[33mcontainer\x1b[0m=a2e7 \x1b[33merror\x1b[0m="dial tcp: lookup lab-master on '
    '10.255.255.53:53: server misbehaving"\n'
    "\x1b[33mWARN\x1b[0m[2026-12-02T02:34:57Z] failed to reconnect to master                 "
    '\x1b[33mcomponent\x1b[0m=agent \x1b[33merror\x1b[0m="error dialing master: dial tcp: lookup '
    'lab-master on 10.255.255.53:53: server misbehaving"\n'
)


def test_lost_agent_and_its_journal_error():
    assert (
        sc.lost_agent(["Scheduling Trial 7", "container 7691 lost with agent lab-gpu3-1", "x"])
        == "lab-gpu3-1"
    )
    assert sc.lost_agent(["container 7691 exited with code 0"]) is None
    assert sc.agent_error(AGENT_JOURNAL) == (
        "error dialing master: dial tcp: lookup lab-master on 10.255.255.53:53: server misbehaving"
    )
    assert (
        sc.agent_error('INFO[...] ok component=agent\nERRO[...] x error="a \\"quoted\\" b"\n')
        == 'a "quoted" b'
    )
    assert sc.agent_error("INFO connecting\n") is None


def test_lost_agent_lines_and_hints():
    resolved = sc.lost_line("lab-gpu3", "lab-gpu3", sc.agent_error(AGENT_JOURNAL))
    assert resolved == (
        "the agent on lab-gpu3 lost its connection to the master during the trial: its journal says "
        "error dialing master: dial tcp: lookup lab-master on 10.255.255.53:53: server misbehaving"
    )
    assert sc.failure_hint(smoke.ALLREDUCE, resolved) == sc.AGENT_RESOLVE
    # A journal error that reads like S3's or the fabric's is still the agent's.
    refused = sc.lost_line("lab-gpu2-1", "lab-gpu2", "dial tcp 10.77.0.10:23457: connect: connection refused")
    assert refused.startswith("the agent on lab-gpu2 (agent lab-gpu2-1) lost its connection")
    assert sc.failure_hint(smoke.SAVE, refused) == sc.AGENT_LOST
    unread = sc.lost_line("lab-gpu3", None, None)
    assert (
        unread.endswith("(its journal names no error)")
        and sc.failure_hint(smoke.SINGLE, unread) == sc.AGENT_LOST
    )
