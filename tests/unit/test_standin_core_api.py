"""The real Core API harness of the pinned determined package against the master stand-in.

A user's training script (tests/unit/core_api_train.py: determined.core.init(), the single
searcher's operations, training and validation metrics, checkpoints to S3, should_preempt())
runs as the real trial entrypoint runs it (master/static/srv/entrypoint.sh at v0.38.0:
determined.exec.prep_container --download_context_directory --resources --proxy, then
--rendezvous, then determined.exec.launch, which runs the experiment's entrypoint) with the
environment and files of the container spec the master stand-in hands the (fake) agent plus the
variables the real agent adds (agent/internal/containers/spec.go). It runs without Docker in a
private mount namespace whose /run/determined is the container's, so the harness reads and
writes its real paths; the info files are the harness's own (prep_container writes them from the
environment and the rendezvous API), not the lab's. `pg` marker: PostgreSQL as in
test_standin_determined.py; a MinIO stand-in holds the checkpoints.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.unit.test_standin_det_cli import BUCKET, DET, MINIO_SECRET, MINIO_USER, PASSWORD, REGION, Lab
from tests.unit.test_standin_determined import postgres, wait_for  # noqa: F401 - the fixture

TRAIN = Path(__file__).with_name("core_api_train.py")
BIN = Path(sys.executable).parent
# entrypoint.sh at v0.38.0, less task-setup.sh (DET_PYTHON_EXECUTABLE, the user's startup hooks).
ENTRYPOINT = """\
set -e
python3 -m determined.exec.prep_container --download_context_directory --resources --proxy
python3 -m determined.exec.prep_container --rendezvous
exec python3 -m determined.exec.launch
"""
# The container's root: a tmpfs over /run, the container's directory bound at /run/determined.
NAMESPACE = (
    'mount -t tmpfs lab /run && mkdir /run/determined && mount --bind "$0" /run/determined && exec "$@"'
)


def experiment(name: str, slots: int = 1, length: int = 4, hold: float = 0) -> str:
    return f"""\
name: {name}
entrypoint: python3 core_api_train.py
searcher: {{name: single, metric: loss, smaller_is_better: true, max_length: {{batches: {length}}}}}
hyperparameters: {{hold: {hold}}}
resources: {{slots_per_trial: {slots}}}
environment: {{environment_variables: [AWS_DEFAULT_REGION={REGION}]}}
max_restarts: 0
"""


def can_unshare() -> bool:
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs lab /run"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


pytestmark = [
    pytest.mark.skipif(not DET.exists(), reason="needs the determined package"),
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("unshare") or not can_unshare(),
        reason="needs root and mount namespaces (unshare -m)",
    ),
]


class Container:
    """One trial container: the spec's files under a directory standing for /run/determined,
    the spec's environment plus the agent's, the harness's entrypoint; its output shipped as
    the agent ships it and its exit reported."""

    def __init__(self, lab: Lab, spec: dict, agent: str = "gpu1"):
        self.lab, self.spec, self.agent = lab, spec, agent
        self.root = lab.tmp / "containers" / spec["container_id"]
        for f in spec["files"]:
            if f["path"].startswith("/run/determined/info/"):
                continue  # the lab's own; the real master sends none, prep_container writes them
            path = self.root / os.path.relpath(f["path"], "/run/determined")
            if f.get("dir"):
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(f["content"]))
        (self.root / "workdir" / TRAIN.name).write_bytes(TRAIN.read_bytes())
        port = lab.master.port
        cluster_id = lab.master.request("GET", "/info")[1]["cluster_id"]
        # agent/internal/containers/spec.go makeGlobalEnvVars and containerEnv.
        slots = ",".join(str(d["id"]) for d in spec["slots"])
        agent_env = {
            "DET_CLUSTER_ID": cluster_id,
            "DET_MASTER_ID": "lab",
            "DET_MASTER": f"http://127.0.0.1:{port}",
            "DET_MASTER_HOST": "127.0.0.1",
            "DET_MASTER_ADDR": "127.0.0.1",
            "DET_MASTER_PORT": str(port),
            "DET_AGENT_ID": agent,
            "DET_CONTAINER_ID": spec["container_id"],
            "DET_SLOT_IDS": f"[{slots}]",
        }
        env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(self.root), "LANG": "C.UTF-8"}
        env.update(dict(item.split("=", 1) for item in spec["env"]))
        env.update(agent_env)
        self.env = env
        self.output: list[str] = []
        lab.report(spec["container_id"], "RUNNING", agent=agent)
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", NAMESPACE, str(self.root)]
            + ["sh", "-c", f"cd {spec['workdir']} && {ENTRYPOINT}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self.ship, daemon=True)
        self.reader.start()

    def ship(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            body = {
                "logs": [{"container_id": self.spec["container_id"], "stdtype": "stdout", "message": line}]
            }
            self.lab.master.request("POST", f"/agents/logs?id={self.agent}", body)
        code = self.proc.wait()
        (self.root / "output.log").write_text("".join(self.output))  # for a failure's reader
        self.lab.master.request(
            "POST",
            f"/agents/containers?id={self.agent}",
            {"container_id": self.spec["container_id"], "state": "TERMINATED", "exit_code": code},
        )

    def wait(self, timeout: float = 90) -> int:
        self.reader.join(timeout)
        assert not self.reader.is_alive(), "".join(self.output)
        return self.proc.returncode

    @property
    def text(self) -> str:
        return "".join(self.output)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, postgres):  # noqa: F811 - the fixture
    lab = Lab(
        tmp_path_factory.mktemp("coreapi"),
        postgres,
        agents={"gpu1": 2, "gpu2": 1, "gpu3": 1},
        log={"color": False, "level": "debug"},
    )
    try:
        lab.det("user", "login", "admin", stdin=PASSWORD + "\n")
        yield lab
    finally:
        lab.close()


def start(
    lab: Lab, config: str, containers: int = 1, model: Path | None = None
) -> tuple[int, list[Container]]:
    """`det experiment create`, then the trial's containers started where the master put them."""
    path = lab.tmp / "core-experiment.yaml"
    path.write_text(config)
    out = lab.det("experiment", "create", str(path), str(model or lab.model))
    exp_id = int(out.rsplit("Created experiment ", 1)[1].split()[0])
    return exp_id, take(lab, containers)


def take(lab: Lab, n: int = 1) -> list[Container]:
    found: list[tuple[str, dict]] = []

    def poll() -> bool:
        for agent in lab.agents:
            found.extend((agent, spec) for spec in lab.work(0.2, agent=agent)["start"])
        return len(found) >= n

    wait_for(poll, 20, f"{n} trial container(s)")
    return [Container(lab, spec, agent) for agent, spec in sorted(found, key=lambda f: f[1]["rank"])]


def session(lab: Lab):
    """An API session of the pinned package: its bindings check the answers' JSON shapes."""
    from determined.common import api

    return api.Session(f"http://127.0.0.1:{lab.master.port}", username="admin", token=lab.token, cert=None)


def objects(lab: Lab, prefix: str) -> dict[str, bytes]:
    client = lab.minio.client(MINIO_SECRET, REGION, MINIO_USER)
    out = {}
    for o in client.list_objects(BUCKET, prefix=prefix, recursive=True):
        out[o.object_name[len(prefix) :]] = client.get_object(BUCKET, o.object_name).read()
    return out


@pytest.mark.pg
def test_a_core_api_trial_completes_and_its_reports_read_back(lab):  # Long: one trial end to end
    from determined.common.api import bindings

    exp_id, (box,) = start(lab, experiment("core-api"))
    try:
        assert box.wait() == 0, box.text
    finally:
        box.kill()
    assert "done at 4" in box.text and "allgather [0]" in box.text, box.text
    sess = session(lab)
    exp = bindings.get_GetExperiment(sess, experimentId=exp_id).experiment
    assert exp.state == bindings.experimentv1State.COMPLETED and exp.progress == 1.0
    trial_id = exp.trialIds[0]
    trial = bindings.get_GetTrial(sess, trialId=trial_id).trial
    assert trial.state == bindings.trialv1State.COMPLETED and trial.totalBatchesProcessed == 4
    assert trial.latestValidation is not None and trial.latestValidation.metrics.avgMetrics == {"loss": 0.25}
    assert trial.bestValidation is not None and trial.searcherMetricValue == 0.25
    assert trial.summaryMetrics is not None
    assert trial.summaryMetrics["avg_metrics"]["loss"]["count"] == 4
    assert trial.summaryMetrics["avg_metrics"]["loss"]["last"] == 0.25
    assert trial.summaryMetrics["validation_metrics"]["loss"]["last"] == 0.25

    # The SDK's reader (common/experimental/trial.py iter_metrics: GetMetrics).
    reports = [
        m for r in bindings.get_GetMetrics(sess, trialIds=[trial_id], group="validation") for m in r.metrics
    ]
    assert [(m.totalBatches, m.metrics["avg_metrics"]) for m in reports] == [(4, {"loss": 0.25})]
    training = [m for r in bindings.get_GetTrainingMetrics(sess, trialIds=[trial_id]) for m in r.metrics]
    assert [m.totalBatches for m in training] == [1, 2, 3, 4]

    ckpts = bindings.get_GetExperimentCheckpoints(sess, id=exp_id).checkpoints
    assert sorted(c.metadata["steps_completed"] for c in ckpts) == [2, 4]
    last = next(c for c in ckpts if c.metadata["steps_completed"] == 4)
    assert (
        last.training.validationMetrics.avgMetrics == {"loss": 0.25} and last.training.searcherMetric == 0.25
    )
    assert last.storageId is not None and last.state == bindings.checkpointv1State.COMPLETED
    assert f"checkpoint {last.uuid} at 4" in box.text
    files = objects(lab, f"lab/{last.uuid}/")
    assert files["state"] == b"4" and files["weights.bin"] == bytes(range(256)) * 4
    assert json.loads(files["metadata.json"])["steps_completed"] == 4
    assert last.resources == {name: str(len(data)) for name, data in files.items()}

    listed = lab.det("experiment", "list-checkpoints", str(exp_id))
    assert last.uuid in listed and "0.25" in listed
    best = lab.det("experiment", "list-checkpoints", str(exp_id), "--best", "1")
    assert last.uuid in best
    described = lab.det("trial", "describe", str(trial_id), "--metrics")
    assert "Workload Metrics" in described and '"loss": 0.25' in described and "COMPLETED" in described
    assert "done at 4" in lab.det("trial", "logs", str(trial_id))


@pytest.mark.pg
def test_a_pause_preempts_the_trial_which_checkpoints_exits_and_resumes(lab):
    from determined.common.api import bindings

    exp_id, (box,) = start(lab, experiment("core-api-pause", hold=60))
    try:
        wait_for(lambda: " at 2\n" in box.text, 60, "the checkpoint at step 2:\n" + box.text)
        lab.det("experiment", "pause", str(exp_id))
        assert box.wait(30) == 0, box.text  # no kill: the harness saw the signal and exited
        assert "preempted at 2" in box.text and "done" not in box.text
        sess = session(lab)
        trial_id = bindings.get_GetExperiment(sess, experimentId=exp_id).experiment.trialIds[0]
        assert bindings.get_GetTrial(sess, trialId=trial_id).trial.state == bindings.trialv1State.PAUSED
        ckpt = bindings.get_GetExperimentCheckpoints(sess, id=exp_id).checkpoints[0]
        assert ckpt.metadata["steps_completed"] == 2

        lab.det("experiment", "activate", str(exp_id))
        (again,) = take(lab)
        assert f"DET_LATEST_CHECKPOINT={ckpt.uuid}" in again.spec["env"]
        assert "DET_STEPS_COMPLETED=2" in again.spec["env"]
        assert again.wait() == 0, again.text
        assert f"resumed from {ckpt.uuid} at 2" in again.text and "done at 4" in again.text
        trial = bindings.get_GetTrial(sess, trialId=trial_id).trial
        assert trial.state == bindings.trialv1State.COMPLETED and trial.restarts == 0
    finally:
        box.kill()


@pytest.mark.pg
def test_a_two_container_trial_rendezvous_and_all_gathers(lab):
    from tests.unit.test_standin_determined import free_port

    lab.det("agent", "disable", "gpu1")  # two slots then take the two one-slot agents
    try:
        ports = [free_port(), free_port()]
        config = experiment("core-api-dist", slots=2).replace("{hold: 0}", f"{{hold: 0, ports: {ports}}}")
        exp_id, boxes = start(lab, config, containers=2)
    finally:
        lab.det("agent", "enable", "gpu1")
    try:
        assert [b.wait() for b in boxes] == [0, 0], [b.text for b in boxes]
    finally:
        for b in boxes:
            b.kill()
    assert {b.agent for b in boxes} == {"gpu2", "gpu3"}
    assert all("allgather [0, 1]" in b.text for b in boxes), [b.text for b in boxes]
    assert "done at 4" in boxes[0].text and "done at 4" in boxes[1].text
    rendezvous = json.loads((boxes[1].root / "info" / "rendezvous.json").read_text())
    assert rendezvous["container_rank"] == 1 and rendezvous["container_slot_counts"] == [1, 1]
    exp = lab.api(f"/api/v1/experiments/{exp_id}")["experiment"]
    assert exp["state"] == "STATE_COMPLETED"


@pytest.mark.pg
def test_the_fairness_example_flags_its_gap_pauses_itself_once_and_resumes(lab):
    """`experiment new --example fairness` with stop_on_gap: the real harness reports the gaps
    with the validation, the trial pauses its own experiment with its task session
    (PauseExperiment), the master preempts it, it exits; activated, it restores the checkpoint,
    goes on flagging without pausing again, and completes."""
    import yaml
    from determined.common.api import bindings

    from deploy.experiment import fairness

    model = lab.tmp / "fairness-model"
    model.mkdir(exist_ok=True)
    (model / "train.py").write_text(fairness.TRAIN_PY)
    hparams = yaml.safe_load(fairness.hyperparameters(1, 16))["hyperparameters"]
    hparams.update(steps=100, stop_on_gap=True)
    config = f"""\
name: fairness
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, smaller_is_better: true}}
hyperparameters: {json.dumps(hparams)}
resources: {{slots_per_trial: 1}}
environment: {{environment_variables: [AWS_DEFAULT_REGION={REGION}]}}
max_restarts: 0
"""
    exp_id, (box,) = start(lab, config, model=model)
    try:
        assert box.wait() == 0, box.text
        assert f"fairness audit: pausing experiment {exp_id}" in box.text, box.text
        assert "fairness/equal_opportunity_gap" in box.text and "is over gap_threshold" in box.text
        sess = session(lab)
        exp = bindings.get_GetExperiment(sess, experimentId=exp_id).experiment
        assert exp.state == bindings.experimentv1State.PAUSED, exp.state
        trial_id = exp.trialIds[0]
        first = [
            m
            for r in bindings.get_GetMetrics(sess, trialIds=[trial_id], group="validation")
            for m in r.metrics
        ]
        assert [m.totalBatches for m in first] == [50]
        audit = first[0].metrics["avg_metrics"]
        assert audit["fairness/over_threshold"] == 1.0
        assert max(audit["fairness/equal_opportunity_gap"], audit["fairness/demographic_parity_gap"]) > 0.1
        (ckpt,) = bindings.get_GetExperimentCheckpoints(sess, id=exp_id).checkpoints
        assert ckpt.metadata["steps_completed"] == 50

        lab.det("experiment", "activate", str(exp_id))
        (again,) = take(lab)
        assert again.wait() == 0, again.text
        assert f"restored checkpoint {ckpt.uuid} at step 50" in again.text, again.text
        assert "pausing experiment" not in again.text and "is over gap_threshold" in again.text
        trial = bindings.get_GetTrial(sess, trialId=trial_id).trial
        assert trial.state == bindings.trialv1State.COMPLETED, trial.state
        assert trial.latestValidation is not None
        assert trial.latestValidation.metrics.avgMetrics["fairness/over_threshold"] == 1.0
    finally:
        box.kill()
