"""The real `det` CLI of the pinned determined package against the master stand-in.

What an operator types (issue #34): each command runs as .venv/bin/det in a subprocess with
DET_MASTER naming the stand-in, the password on stdin (`det user login` reads it with getpass;
no secret on a command line), and its output is checked. The stand-in runs against a local
PostgreSQL (`pg` marker, as test_standin_determined.py); a fake agent speaks the lab's agent
protocol so that trials start, log, pause and end; a MinIO stand-in holds the checkpoint that
`det checkpoint download` fetches directly from S3, as the CLI does with s3 storage.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import threading
import uuid
from pathlib import Path

import pytest

from tests.lab.det_cli import DET, run_det
from tests.unit.test_standin_determined import (
    GPUS,
    MasterProcess,
    base_config,
    postgres,  # noqa: F401 - the fixture
    wait_for,
)
from tests.unit.test_standin_minio import MinioProcess

PASSWORD = "Admin-Passw0rd"
MINIO_USER = "labadmin"
MINIO_SECRET = "lab-secret-" + secrets.token_hex(6)
REGION = "eu-west-3"
BUCKET = "det-checkpoints"
EXPERIMENT = """\
name: cli-smoke
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 1}}
resources: {slots_per_trial: 1}
max_restarts: 0
"""

pytestmark = pytest.mark.skipif(not DET.exists(), reason="needs the determined package's det CLI")


def rows(table: str) -> list[list[str]]:
    """The cells of each line of a tabulated CLI answer."""
    return [[c.strip() for c in line.split("|")] for line in table.splitlines() if "|" in line]


class Lab:
    """The master stand-in, a fake agent 'gpu1' with two GPUs, a MinIO stand-in, and a CLI home."""

    def __init__(self, tmp: Path, db: dict, agents: dict[str, int] | None = None, **config_extra):
        self.tmp = tmp
        self.agents = agents or {"gpu1": 2}  # agent id -> GPUs
        self.minio = MinioProcess(
            tmp / "s3",
            tmp,
            {"MINIO_ROOT_USER": MINIO_USER, "MINIO_ROOT_PASSWORD": MINIO_SECRET, "MINIO_SITE_REGION": REGION},
        )
        self.minio.wait_ready()
        self.minio.client(MINIO_SECRET, REGION, MINIO_USER).make_bucket(BUCKET)
        config = base_config(tmp, db["port"])
        config["db"] = dict(db)
        config["checkpoint_storage"].update(
            access_key=MINIO_USER, secret_key=MINIO_SECRET, endpoint_url=f"http://127.0.0.1:{self.minio.port}"
        )
        config["task_container_defaults"] = {"image": {"cuda": "registry/gpu:1", "cpu": "registry/cpu:1"}}
        config.update(config_extra)
        self.master = MasterProcess(tmp, config)
        self.master.wait_healthy()
        for n, (agent, gpus) in enumerate(self.agents.items()):
            devices = [
                {"id": i, "brand": b, "uuid": u, "type": "cuda"}
                for i, b, u in GPUS[n * gpus : (n + 1) * gpus]
            ]
            assert self.master.request("GET", f"/agents/setup?id={agent}")[0] == 200
            body = {"devices": [dict(d, id=d["id"] - n * gpus) for d in devices], "version": "0.38.0"}
            assert self.master.request("POST", f"/agents/started?id={agent}", body)[0] == 200
        # MasterProcess gives agents 2 s between heartbeats before they count as lost.
        self.stopped = threading.Event()
        self.beat = threading.Thread(target=self.heartbeat, daemon=True)
        self.beat.start()
        self.home = tmp / "home"
        self.home.mkdir()
        self.model = tmp / "model"
        self.model.mkdir()
        (self.model / "train.py").write_text("print('training')\n")
        (tmp / "experiment.yaml").write_text(EXPERIMENT)

    def heartbeat(self) -> None:
        while not self.stopped.wait(0.5):
            for agent in self.agents:
                self.master.request("POST", f"/agents/heartbeat?id={agent}")

    def det(self, *args: str, stdin: str = "", ok: bool = True, **env: str) -> str:
        master = f"http://127.0.0.1:{self.master.port}"
        return run_det(master, self.home, *args, cwd=self.tmp, stdin=stdin, ok=ok, timeout=60, **env)

    def work(self, wait: float = 10, agent: str = "gpu1") -> dict:
        return self.master.request("GET", f"/agents/work?id={agent}&wait={wait}")[1]

    def report(self, cid: str, state: str, agent: str = "gpu1", **extra) -> None:
        body = {"container_id": cid, "state": state, **extra}
        assert self.master.request("POST", f"/agents/containers?id={agent}", body)[0] == 200

    def create(self, *extra: str) -> tuple[int, dict]:
        """`det experiment create`, then the container spec the agent receives, running."""
        out = self.det("experiment", "create", "experiment.yaml", "model", *extra)
        exp_id = int(out.rsplit("Created experiment ", 1)[1].split()[0])
        (spec,) = self.work()["start"]
        self.report(spec["container_id"], "RUNNING")
        return exp_id, spec

    def api(self, path: str) -> dict:
        status, body = self.master.request("GET", path, token=self.token)
        assert status == 200, body
        return body

    @property
    def token(self) -> str:
        auth = json.loads((self.home / ".config" / "determined" / "auth.json").read_text())
        return next(iter(auth["masters"].values()))["tokens"]["admin"]

    def close(self) -> None:
        self.stopped.set()
        self.beat.join()
        self.master.kill()
        self.minio.kill()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, postgres):  # noqa: F811 - the fixture
    lab = Lab(tmp_path_factory.mktemp("detcli"), postgres)
    try:
        out = lab.det("user", "login", "admin", stdin=PASSWORD + "\n")
        assert "Password for user 'admin'" in out and PASSWORD not in out
        yield lab
    finally:
        lab.close()
    assert PASSWORD not in (lab.master.log.read_text())


@pytest.mark.pg
def test_cluster_commands(lab):
    info = lab.master.request("GET", "/info")[1]
    out = lab.det("version")
    assert "client:\n  version: 0.38.0" in out and f"cluster_id: {info['cluster_id']}" in out
    assert f"clusterId: {info['cluster_id']}" in lab.det("master", "info")
    assert "You are logged in as user 'admin'" in lab.det("user", "whoami")
    users = lab.det("user", "list")
    assert " admin " in users and " determined " in users
    agents = lab.det("agent", "list")
    assert "gpu1" in agents and " default " in agents
    config = lab.det("master", "config")
    assert "secret_key: '********'" in config and MINIO_SECRET not in config
    slots = [line for line in lab.det("slot", "list").splitlines() if line.startswith(" gpu1")]
    assert len(slots) == 2 and all("FREE" in line and GPUS[0][1] in line for line in slots)

    out = lab.det("agent", "disable", "--drain", "gpu1")
    assert "Disabled agent gpu1." in out and "No tasks in progress on draining nodes." in out
    assert "Failed" not in out
    agent = lab.api("/api/v1/agents/gpu1")["agent"]
    assert not agent["enabled"] and agent["draining"]
    assert "Enabled agent gpu1." in lab.det("agent", "enable", "gpu1")
    assert lab.api("/api/v1/agents/gpu1")["agent"]["enabled"]


@pytest.mark.pg
def test_an_experiment_through_its_life(lab):
    exp_id, spec = lab.create()
    files = {f["path"]: f for f in spec["files"]}
    assert "/run/determined/workdir/train.py" in files  # the uploaded model directory
    cid = spec["container_id"]
    line = {"container_id": cid, "stdtype": "stdout", "message": "step 1 loss 0.5\n"}
    assert lab.master.request("POST", "/agents/logs?id=gpu1", {"logs": [line]})[0] == 200

    listed = [r for r in rows(lab.det("experiment", "list")) if r[0] == str(exp_id)]
    assert len(listed) == 1 and listed[0][1:3] == ["admin", "cli-smoke"] and listed[0][4] == "ACTIVE"
    described = lab.det("experiment", "describe", str(exp_id))
    assert "ACTIVE" in described and "cli-smoke" in described and "Workloads:" in described
    trial_id = lab.api(f"/api/v1/experiments/{exp_id}/trials")["trials"][0]["id"]
    trial = rows(lab.det("trial", "describe", str(trial_id)))
    assert trial[0][:2] == ["Experiment ID", "State"] and trial[1][:2] == [str(exp_id), "RUNNING"]
    assert "step 1 loss 0.5" in lab.det("trial", "logs", str(trial_id))
    jobs = lab.det("job", "list")
    assert f"cli-smoke ({exp_id})" in jobs and "STATE_SCHEDULED" in jobs and "1/1" in jobs
    assert any(r[6] == f"Trial {trial_id} (Experiment {exp_id})" for r in rows(lab.det("slot", "list")))

    # Pause: the allocation ends, the trial waits PAUSED and leaves the job queue.
    assert f"Paused experiment {exp_id}" in lab.det("experiment", "pause", str(exp_id))
    assert lab.work()["kill"] == [cid]
    lab.report(cid, "TERMINATED", exit_code=137)
    assert lab.api(f"/api/v1/trials/{trial_id}")["trial"]["state"] == "STATE_PAUSED"
    assert f"cli-smoke ({exp_id})" not in lab.det("job", "list")
    out = lab.det("experiment", "pause", str(exp_id))  # the same state again: a no-op
    assert f"Paused experiment {exp_id}" in out
    assert f"Activated experiment {exp_id}" in lab.det("experiment", "activate", str(exp_id))
    (again,) = wait_for(lambda: lab.work(1)["start"], 15, "the trial's new container")
    lab.report(again["container_id"], "RUNNING")
    trial = lab.api(f"/api/v1/trials/{trial_id}")["trial"]
    assert trial["state"] == "STATE_RUNNING" and trial["restarts"] == 0

    out = lab.det("experiment", "archive", str(exp_id), ok=False)
    assert "Experiment is not in terminal state." in out
    assert f"Killed experiment {exp_id}" in lab.det("experiment", "kill", str(exp_id))
    assert lab.work()["kill"] == [again["container_id"]]
    lab.report(again["container_id"], "TERMINATED", exit_code=137)
    assert lab.api(f"/api/v1/experiments/{exp_id}")["experiment"]["state"] == "STATE_CANCELED"
    out = lab.det("experiment", "pause", str(exp_id), ok=False)
    assert "experiment in terminal state" in out
    assert f"Archived experiment {exp_id}" in lab.det("experiment", "archive", str(exp_id))
    assert all(r[0] != str(exp_id) for r in rows(lab.det("experiment", "list")))
    assert any(r[0] == str(exp_id) for r in rows(lab.det("experiment", "list", "--all")))


@pytest.mark.pg
def test_a_paused_experiment_is_created_paused_and_queues_when_activated(lab):
    out = lab.det("experiment", "create", "--paused", "experiment.yaml", "model")
    exp_id = int(out.rsplit("Created experiment ", 1)[1].split()[0])
    assert lab.work(1)["start"] == []
    trial = lab.api(f"/api/v1/experiments/{exp_id}/trials")["trials"][0]
    assert trial["state"] == "STATE_PAUSED"
    lab.det("experiment", "activate", str(exp_id))
    (spec,) = wait_for(lambda: lab.work(1)["start"], 15, "the trial's container")
    lab.report(spec["container_id"], "TERMINATED", exit_code=0)
    assert lab.api(f"/api/v1/experiments/{exp_id}")["experiment"]["state"] == "STATE_COMPLETED"
    assert "COMPLETED" in lab.det("experiment", "describe", str(exp_id))

    # A paused experiment's trial holds no allocation: cancel ends it at once.
    out = lab.det("experiment", "create", "--paused", "experiment.yaml", "model")
    exp_id = int(out.rsplit("Created experiment ", 1)[1].split()[0])
    assert f"Canceled experiment {exp_id}" in lab.det("experiment", "cancel", str(exp_id))
    wait_for(
        lambda: lab.api(f"/api/v1/experiments/{exp_id}")["experiment"]["state"] == "STATE_CANCELED",
        10,
        "the canceled experiment's end",
    )
    assert lab.api(f"/api/v1/experiments/{exp_id}/trials")["trials"][0]["state"] == "STATE_CANCELED"
    assert f"Killed experiment {exp_id}" in lab.det("experiment", "kill", str(exp_id))  # no-op


@pytest.mark.pg
def test_checkpoint_describe_and_download(lab):
    exp_id, spec = lab.create()
    env = dict(item.split("=", 1) for item in spec["env"])
    ckpt = str(uuid.uuid4())
    # What the harness does on a checkpoint: the files to storage, then ReportCheckpoint with
    # the trial's session.
    client = lab.minio.client(MINIO_SECRET, REGION, MINIO_USER)
    data = b"weights-" + os.urandom(8)
    client.put_object(BUCKET, f"lab/{ckpt}/model.bin", io.BytesIO(data), len(data))
    body = {
        "taskId": env["DET_TASK_ID"],
        "allocationId": env["DET_ALLOCATION_ID"],
        "uuid": ckpt,
        "resources": {"model.bin": str(len(data))},
        "metadata": {"steps_completed": 10, "framework": "torch"},
        "state": "STATE_COMPLETED",
    }
    status, _ = lab.master.request("POST", "/api/v1/checkpoints", body, token=env["DET_SESSION_TOKEN"])
    assert status == 200

    out = lab.det("checkpoint", "describe", ckpt)
    header, first = rows(out)[:2]
    assert header[:5] == ["Experiment ID", "Trial ID", "Steps Completed", "Report Time", "Checkpoint UUID"]
    assert first[0] == str(exp_id) and first[2] == "10" and first[4] == ckpt
    trial_id = lab.api(f"/api/v1/experiments/{exp_id}/trials")["trials"][0]["id"]
    assert ckpt in lab.det("trial", "describe", str(trial_id))
    described = rows(lab.det("experiment", "describe", str(exp_id)))
    assert described[-2][:5] == ["Trial ID", "# of Batches", "State", "Report Time", "Checkpoint State"]
    assert described[-1][1] == "10" and described[-1][4] == "COMPLETED"

    target = lab.tmp / "downloaded"
    out = lab.det("checkpoint", "download", ckpt, "-o", str(target), AWS_DEFAULT_REGION=REGION)
    assert f"Local checkpoint path:\n{target}" in out and "proxying download through master" not in out
    assert (target / "model.bin").read_bytes() == data
    assert json.loads((target / "metadata.json").read_text())["steps_completed"] == 10

    missing = str(uuid.uuid4())
    assert f"checkpoint '{missing}' not found" in lab.det("checkpoint", "describe", missing, ok=False)
    lab.det("experiment", "kill", str(exp_id))


@pytest.mark.pg
def test_an_unserved_call_fails_loudly_as_the_real_gateway_answers(lab):
    """grpc-gateway v1.16.0 runtime/mux.go: ErrUnknownURI, Unimplemented, HTTP 501."""
    status, body = lab.master.request("GET", "/api/v1/models", token=lab.token)
    assert status == 501 and body == {
        "error": {"code": 12, "reason": "Unimplemented", "error": "Not Implemented"}
    }
    assert "Not Implemented" in lab.det("model", "list", ok=False)
    status, body = lab.master.request("GET", "/not-an-api-route")
    assert status == 404 and body == {"message": "Not Found"}
