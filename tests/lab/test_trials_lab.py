"""Trials on the lab: experiments submitted to the master stand-in's REST API run in Docker.

- a one-slot trial runs in one bridge-network container on one agent: the entrypoint sees the
  model definition in its working directory, master.yaml's task_container_defaults environment,
  the DET_* variables and the info files, and its output becomes the trial's logs;
- a 16-slot trial takes two whole 8-GPU agents (the real fitting): two host-network containers
  on two nodes, each given its agent's 8 GPUs (NVIDIA_VISIBLE_DEVICES from the Docker device
  request: the lab's nvidia-smi stand-in lists every GPU whatever a container asked for), with
  the same rendezvous addresses and an SSH key pair;
- a failing entrypoint ends the trial in STATE_ERROR (max_restarts 0); a kill cancels a running
  trial and removes its container; archive is refused until the experiment ended;
- invalid configs are refused with the real master's texts (an unknown key such as
  checkpoint_storage.region, more slots than the pool has);
- the real `det` CLI of the pinned determined package, as an operator types it against the
  lab's master: login, version, master info and config, users, agents and slots, a drain and
  an enable, an experiment created from a model directory through its life (list, describe,
  trial describe and logs, job list, pause, activate, kill, archive);
- `experiment new`'s examples through the real harness in the lab's task images: the Core API
  fit to completion (checkpoint listed and downloaded), and the fairness audit, whose trial
  reports its gaps and pauses its own experiment;
- no trial container is left on any agent.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.lab.det_cli import run_det
from tests.verify.master_api import admin_token

from .conftest import LAB_CLUSTER
from .paths import REPO

pytestmark = pytest.mark.lab

TERMINAL = ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED")
TASK_LABEL = "ai.determined.container.type=task-container"
# What the entrypoint prints: one "KEY=value" line each, read back from the trial's logs.
PROBE = (
    "import json, os, socket; "
    "print('REGION=' + os.environ.get('AWS_DEFAULT_REGION', '')); "
    "print('MODEL=' + open('data/model.txt').read().strip()); "
    "print('CWD=' + os.getcwd()); "
    "print('TRIAL=' + os.environ['DET_TRIAL_ID'] + ' EXP=' + os.environ['DET_EXPERIMENT_ID']); "
    "print('SLOTS=' + os.environ['DET_SLOT_IDS']); "
    "print('TASKTYPE=' + os.environ['DET_TASK_TYPE']); "
    "print('HPARAMS=' + os.environ['DET_HPARAMS']); "
    "print('IFACES=' + ','.join(sorted(n for _, n in socket.if_nameindex()))); "
    "print('RDV=' + open('/run/determined/info/rendezvous.json').read()); "
    "print('KEY=' + str(os.path.exists('/run/determined/ssh/id_rsa'))); "
    "print('GPUS=' + os.environ.get('NVIDIA_VISIBLE_DEVICES', ''))"
)
ENTRYPOINT = f"python3 -c {shlex.quote(PROBE)}"


class Api:
    def __init__(self, cluster):
        self.base = f"http://{cluster.master_node.address}:{cluster.master_port}"
        self.token = admin_token(cluster)

    def call(self, method: str, path: str, body: dict | None = None):
        request = urllib.request.Request(
            self.base + path, data=json.dumps(body).encode() if body is not None else None, method=method
        )
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def create(self, config: str, files: dict[str, bytes] | None = None) -> tuple[int, dict]:
        # As the CLI sends a model definition (harness/determined/common/v1file_utils.py).
        model = [
            {
                "path": path,
                "type": 48,
                "content": base64.b64encode(data).decode(),
                "mode": 0o100644,
                "mtime": "0",
                "uid": 0,
                "gid": 0,
            }
            for path, data in (files or {}).items()
        ]
        status, body = self.call(
            "POST", "/api/v1/experiments", {"config": config, "modelDefinition": model, "activate": True}
        )
        return status, json.loads(body)

    def trial(self, exp_id: int) -> dict:
        status, body = self.call("GET", f"/api/v1/experiments/{exp_id}/trials")
        assert status == 200, body
        return json.loads(body)["trials"][0]

    def wait(self, exp_id: int, states=TERMINAL, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            trial = self.trial(exp_id)
            if trial["state"] in states or time.monotonic() > deadline:
                return trial
            time.sleep(1)

    def logs(self, trial_id: int) -> list[dict]:
        status, body = self.call("GET", f"/api/v1/trials/{trial_id}/logs")
        assert status == 200, body
        return [json.loads(line)["result"] for line in body.splitlines() if line.strip()]

    def experiment(self, exp_id: int) -> dict:
        status, body = self.call("GET", f"/api/v1/experiments/{exp_id}")
        assert status == 200, body
        return json.loads(body)["experiment"]


def experiment_yaml(entrypoint: str, slots: int = 1, extra: str = "") -> str:
    return (
        f"name: lab-trials\n"
        f"entrypoint: {json.dumps(entrypoint)}\n"
        f"searcher: {{name: single, metric: loss, max_length: 1}}\n"
        f"hyperparameters: {{lr: 0.5, layers: {{type: const, val: 3}}}}\n"
        f"max_restarts: 0\n"
        f"resources: {{slots_per_trial: {slots}}}\n"
        f"{extra}"
    )


def printed(logs: list[dict], rank: int) -> dict[str, str]:
    out = {}
    for entry in logs:
        if entry["source"] == "container" and entry["rankId"] == rank and "=" in entry["message"]:
            key, _, value = entry["message"].rstrip("\n").partition("=")
            out[key] = value
    return out


@pytest.fixture(scope="module")
def api(deployed, lab):
    return Api(lab)


@pytest.fixture(scope="module", autouse=True)
def no_containers_left(lab, lab_ssh):
    yield
    for agent in lab.agents:
        left = lab_ssh(agent.hostname, f"docker ps -aq --filter label={TASK_LABEL}").stdout.split()
        assert left == [], f"{agent.hostname}: trial containers left: {left}"


def test_one_slot_trial_runs_in_a_bridge_container(api, lab):
    status, created = api.create(
        experiment_yaml(ENTRYPOINT), {"data/model.txt": b"from-the-model-definition\n"}
    )
    assert status == 200, created
    exp_id = created["experiment"]["id"]
    assert created["experiment"]["state"] == "STATE_ACTIVE"
    # master.yaml's S3 keys are merged into the config, shown masked.
    assert created["config"]["checkpoint_storage"]["secret_key"] == "********"
    trial = api.wait(exp_id)
    logs = api.logs(trial["id"])
    assert trial["state"] == "STATE_COMPLETED", logs
    assert api.experiment(exp_id)["state"] == "STATE_COMPLETED"
    out = printed(logs, 0)
    assert out["REGION"] == lab.storage.region  # task_container_defaults.environment_variables
    assert out["MODEL"] == "from-the-model-definition"
    assert out["CWD"] == "/run/determined/workdir"
    assert out["TRIAL"] == f"{trial['id']} EXP={exp_id}"
    assert out["TASKTYPE"] == "TRIAL"
    assert json.loads(out["HPARAMS"]) == {"lr": 0.5, "layers": 3}
    assert len(json.loads(out["SLOTS"])) == 1
    assert [u[:4] for u in out["GPUS"].split(",")] == ["GPU-"]  # the slot's UUID, as --gpus
    ifaces = out["IFACES"].split(",")
    assert "eth0" in ifaces and "ib0" not in ifaces, ifaces  # bridge network
    rendezvous = json.loads(out["RDV"])
    assert rendezvous["container_rank"] == 0 and rendezvous["container_slot_counts"] == [1]
    assert out["KEY"] == "True"
    assert all(e["agentId"] for e in logs if e["source"] == "container")


def test_sixteen_slots_take_two_whole_agents_with_host_networking(api, lab):
    status, created = api.create(experiment_yaml(ENTRYPOINT, slots=16), {"data/model.txt": b"two\n"})
    assert status == 200, created
    trial = api.wait(created["experiment"]["id"])
    logs = api.logs(trial["id"])
    assert trial["state"] == "STATE_COMPLETED", logs
    ranks = [printed(logs, rank) for rank in (0, 1)]
    agents = {e["agentId"] for e in logs if e["source"] == "container"}
    assert len(agents) == 2, agents
    addresses = {str(a.address) for a in lab.agents}
    for rank, out in enumerate(ranks):
        assert out["MODEL"] == "two" and out["REGION"] == lab.storage.region
        assert "ib0" in out["IFACES"].split(","), out["IFACES"]  # host network: the node's ports
        assert len(json.loads(out["SLOTS"])) == 8 and len(set(out["GPUS"].split(","))) == 8
        rendezvous = json.loads(out["RDV"])
        assert rendezvous["container_rank"] == rank
        assert rendezvous["container_slot_counts"] == [8, 8]
        assert (
            set(rendezvous["container_addrs"]) <= addresses and len(set(rendezvous["container_addrs"])) == 2
        )
        assert out["KEY"] == "True"


def test_failure_kill_and_archive(api):
    status, created = api.create(experiment_yaml("echo failing >&2; exit 3"))
    assert status == 200, created
    trial = api.wait(created["experiment"]["id"])
    logs = api.logs(trial["id"])
    assert trial["state"] == "STATE_ERROR", logs
    assert any(e["stdtype"] == "stderr" and e["message"].strip() == "failing" for e in logs), logs
    assert api.experiment(created["experiment"]["id"])["state"] == "STATE_ERROR"

    status, created = api.create(experiment_yaml("sleep 600"))
    assert status == 200, created
    exp_id = created["experiment"]["id"]
    assert api.wait(exp_id, states=("STATE_RUNNING",) + TERMINAL)["state"] == "STATE_RUNNING"
    status, body = api.call("POST", f"/api/v1/experiments/{exp_id}/archive")
    assert status == 400 and json.loads(body)["error"]["error"] == "Experiment is not in terminal state."
    assert api.call("POST", f"/api/v1/experiments/{exp_id}/kill")[0] == 200
    assert api.wait(exp_id, timeout=60)["state"] == "STATE_CANCELED"
    assert api.experiment(exp_id)["state"] == "STATE_CANCELED"
    assert api.call("POST", f"/api/v1/experiments/{exp_id}/archive")[0] == 200
    assert api.experiment(exp_id)["archived"] is True


@pytest.mark.parametrize(
    ("extra", "slots", "expected"),
    [
        (
            "checkpoint_storage: {type: s3, bucket: b, region: us-east-1}\n",
            1,
            '<config>.checkpoint_storage: additionalProperties "region" not allowed',
        ),
        ("gpu_affinity: true\n", 1, '<config>: additionalProperties "gpu_affinity" not allowed'),
        ("", 64, "invalid resource configuration: slots requested exceeds cluster capacity"),
    ],
)
def test_invalid_configs_are_refused_with_the_real_text(api, extra, slots, expected):
    status, body = api.create(experiment_yaml("true", slots=slots, extra=extra))
    assert status == 500 and body["error"]["reason"] == "Internal", body
    assert expected in body["error"]["error"], body


def test_trial_containers_carry_the_real_labels(api, lab, lab_ssh):
    status, created = api.create(experiment_yaml("sleep 600"))
    assert status == 200, created
    exp_id = created["experiment"]["id"]
    try:
        assert api.wait(exp_id, states=("STATE_RUNNING",) + TERMINAL)["state"] == "STATE_RUNNING"
        found = {}
        for agent in lab.agents:
            fmt = shlex.quote("{{json .Config.Labels}} {{.HostConfig.NetworkMode}}")
            ids = lab_ssh(agent.hostname, f"docker ps -q --filter label={TASK_LABEL}").stdout.split()
            for cid in ids:
                found[cid] = lab_ssh(agent.hostname, f"docker inspect -f {fmt} {cid}").stdout
        assert len(found) == 1, found
        labels_json, _, network = next(iter(found.values())).strip().rpartition(" ")
        labels = json.loads(labels_json)
        assert labels["ai.determined.container.description"].startswith(f"exp-{exp_id}-trial-")
        assert labels["ai.determined.container.agent"] and network == "bridge"
    finally:
        api.call("POST", f"/api/v1/experiments/{exp_id}/kill")
        api.wait(exp_id, timeout=60)


# --- the real `det` CLI (determined==0.38.0, the project's own dependency) ------------------------


def cells(table: str) -> list[list[str]]:
    """The cells of each line of a tabulated CLI answer."""
    return [[c.strip() for c in line.split("|")] for line in table.splitlines() if "|" in line]


class Det:
    """`det` in a subprocess: DET_MASTER names the lab's master, its own HOME holds the login
    (auth.json), no terminal (getpass reads the password from stdin: never on a command line)."""

    def __init__(self, cluster, home: Path):
        self.master = f"http://{cluster.master_node.address}:{cluster.master_port}"
        self.home = home
        (home / "model").mkdir()
        (home / "model" / "train.py").write_text(
            "import sys, time\nprint('step 1 loss 0.5', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
        )

    def __call__(self, *args: str, stdin: str = "", ok: bool = True) -> str:
        return run_det(self.master, self.home, *args, cwd=self.home, stdin=stdin, ok=ok)

    def create(self, seconds: int) -> int:
        (self.home / "experiment.yaml").write_text(
            experiment_yaml(f"python3 train.py {seconds}").replace("lab-trials", "det-cli")
        )
        out = self("experiment", "create", "experiment.yaml", "model")
        return int(out.rsplit("Created experiment ", 1)[1].split()[0])


# Long: one operator session; each step reads the state the one before left (its own lab test
# would pay for another set of trials on the shared lab).
def test_the_real_det_cli_against_the_lab_master(api, lab, tmp_path):
    det = Det(lab, tmp_path)
    password = lab.determined.admin_password.value
    out = det("user", "login", "admin", stdin=password + "\n")
    assert "Password for user 'admin'" in out and password not in out
    assert "client:\n  version: 0.38.0" in det("version")
    info = json.loads(urllib.request.urlopen(det.master + "/info", timeout=30).read())
    assert f"clusterId: {info['cluster_id']}" in det("master", "info")
    assert "You are logged in as user 'admin'" in det("user", "whoami")
    assert " admin " in det("user", "list")
    agents = det("agent", "list")
    assert all(a.hostname in agents for a in lab.agents), agents
    config = det("master", "config")
    assert "secret_key: '********'" in config and lab.storage.secret_key.value not in config
    # The node's agents: `<hostname>` (per_node) or `<hostname>-<i>` (per_domain), its slots in all.
    first = lab.agents[0]
    mine = re.compile(rf"{re.escape(first.hostname)}(-\d+)?")
    slots = [r for r in cells(det("slot", "list")) if r and mine.fullmatch(r[0])]
    assert len(slots) == first.slots, slots

    agent = lab.agents[-1].hostname
    out = det("agent", "disable", "--drain", agent)
    assert f"Disabled agent {agent}." in out and "Failed" not in out, out
    assert f"Enabled agent {agent}." in det("agent", "enable", agent)

    exp_id = det.create(0)
    trial = api.wait(exp_id)
    assert trial["state"] == "STATE_COMPLETED", api.logs(trial["id"])
    listed = [r for r in cells(det("experiment", "list")) if r[0] == str(exp_id)]
    assert len(listed) == 1 and listed[0][1:3] == ["admin", "det-cli"] and listed[0][4] == "COMPLETED"
    assert "COMPLETED" in det("experiment", "describe", str(exp_id))
    described = cells(det("trial", "describe", str(trial["id"])))
    assert described[1][:2] == [str(exp_id), "COMPLETED"], described
    assert "step 1 loss 0.5" in det("trial", "logs", str(trial["id"]))
    assert f"Archived experiment {exp_id}" in det("experiment", "archive", str(exp_id))

    exp_id = det.create(600)
    try:
        trial = api.wait(exp_id, states=("STATE_RUNNING",) + TERMINAL)
        assert trial["state"] == "STATE_RUNNING", api.logs(trial["id"])
        assert f"det-cli ({exp_id})" in det("job", "list")
        assert f"Paused experiment {exp_id}" in det("experiment", "pause", str(exp_id))
        assert api.wait(exp_id, states=("STATE_PAUSED",) + TERMINAL, timeout=60)["state"] == "STATE_PAUSED"
        assert f"Activated experiment {exp_id}" in det("experiment", "activate", str(exp_id))
        assert api.wait(exp_id, states=("STATE_RUNNING",) + TERMINAL)["state"] == "STATE_RUNNING"
        assert "Experiment is not in terminal state." in det("experiment", "archive", str(exp_id), ok=False)
    finally:
        out = det("experiment", "kill", str(exp_id))
    assert f"Killed experiment {exp_id}" in out
    assert api.wait(exp_id, timeout=60)["state"] == "STATE_CANCELED"
    assert f"Archived experiment {exp_id}" in det("experiment", "archive", str(exp_id))


def experiment_new(out_dir: Path, *args: str) -> Path:
    """`python -m deploy experiment new` for the lab's cluster.yaml, as a user runs it."""
    argv = ["experiment", "new", "--cluster", str(LAB_CLUSTER), "--out", str(out_dir), *args]
    made = subprocess.run(
        [sys.executable, "-m", "deploy", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert made.returncode == 0, made.stderr
    return out_dir


def test_experiment_new_example_runs_through_the_real_harness_and_cli(api, lab, tmp_path):
    """What a new user does: `python -m deploy experiment new` for the lab, then the pinned `det
    experiment create` of its experiment.yaml and model/. The trial is the example's Core API
    script on the task image's own `determined` (the harness of the master's version): core.init
    against the master, metrics, checkpoints through the harness's S3 storage manager into the
    lab's MinIO; the CLI then lists and downloads the last checkpoint."""
    out_dir = experiment_new(tmp_path / "example")
    # The one change to the user's example: the real determinedai/environments images carry torch
    # and TensorFlow, which core.init's default TensorboardMode.AUTO imports for its metric
    # writer (determined/tensorboard/base.py get_metric_writer); the lab's images carry the
    # harness without either (gigabytes), so the trial writes no TensorBoard events.
    train = out_dir / "model" / "train.py"
    script = train.read_text()
    assert script.count("core.init(distributed=distributed)") == 1, script
    train.write_text(
        script.replace(
            "core.init(distributed=distributed)",
            "core.init(distributed=distributed, tensorboard_mode=core.TensorboardMode.MANUAL)",
        )
    )
    (tmp_path / "home").mkdir()
    det = Det(lab, tmp_path / "home")
    det("user", "login", "admin", stdin=lab.determined.admin_password.value + "\n")
    out = det("experiment", "create", str(out_dir / "experiment.yaml"), str(out_dir / "model"))
    exp_id = int(out.rsplit("Created experiment ", 1)[1].split()[0])
    trial = api.wait(exp_id, timeout=300)
    logs = "".join(entry.get("log") or entry.get("message") or "" for entry in api.logs(trial["id"]))
    assert trial["state"] == "STATE_COMPLETED", logs[-4000:]
    assert "No module named" not in logs, logs[-4000:]
    # The chief's reports, as the master got them from the harness.
    assert trial["totalBatchesProcessed"] == 50, trial
    assert "loss" in trial["latestValidation"]["metrics"]["avgMetrics"], trial["latestValidation"]
    listed = det("experiment", "list-checkpoints", str(exp_id))
    uuids = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", listed)
    assert uuids, listed
    target = tmp_path / "downloaded"
    # boto3 signs for the site region (the CLI reads S3 itself: --mode auto, direct first).
    run_det(
        det.master, det.home, "checkpoint", "download", uuids[-1], "-o", str(target), cwd=det.home,
        AWS_DEFAULT_REGION=lab.storage.region,
    )  # fmt: skip
    state = json.loads((target / "state.json").read_text())
    assert state["steps_completed"] == 50 and abs(state["w"] - 3) < 1, state
    print(f"experiment new's example: {exp_id}, checkpoints {uuids}, state {state}")
    assert f"Archived experiment {exp_id}" in det("experiment", "archive", str(exp_id))


def test_the_fairness_example_reports_its_gaps_and_pauses_itself(api, lab, tmp_path):
    """`experiment new --example fairness` with stop_on_gap, through the pinned CLI: the real
    harness in the lab's task image reports the two gaps with the validation, the trial pauses
    its own experiment with its task session, and the master's metrics read back over the
    threshold. (Resuming from the pause is proven against the master stand-in in
    tests/unit/test_standin_core_api.py; here it would cost a second trial start.)"""
    from .test_day_two_lab import wait_registered

    for agent in lab.agents:  # the master refuses an experiment its pool cannot hold yet
        wait_registered(lab, agent, timeout=120)
    out_dir = experiment_new(tmp_path / "fairness", "--example", "fairness")
    config = out_dir / "experiment.yaml"
    text = config.read_text()
    assert text.count("stop_on_gap: false") == 1 and text.count("steps: 200") == 1, text
    config.write_text(
        text.replace("stop_on_gap: false", "stop_on_gap: true").replace("steps: 200", "steps: 100")
    )
    (tmp_path / "home").mkdir()
    det = Det(lab, tmp_path / "home")
    det("user", "login", "admin", stdin=lab.determined.admin_password.value + "\n")
    out = det("experiment", "create", str(config), str(out_dir / "model"))
    exp_id = int(out.rsplit("Created experiment ", 1)[1].split()[0])
    try:
        trial = api.wait(exp_id, states=("STATE_PAUSED", *TERMINAL), timeout=300)
        logs = "".join(entry.get("log") or entry.get("message") or "" for entry in api.logs(trial["id"]))
        assert trial["state"] == "STATE_PAUSED", logs[-4000:]
        assert f"fairness audit: pausing experiment {exp_id}" in logs, logs[-4000:]
        assert api.experiment(exp_id)["state"] == "STATE_PAUSED"
        audit = trial["latestValidation"]["metrics"]["avgMetrics"]
        assert trial["latestValidation"]["totalBatches"] == 50, trial["latestValidation"]
        assert audit["fairness/over_threshold"] == 1.0, audit
        gaps = audit["fairness/equal_opportunity_gap"], audit["fairness/demographic_parity_gap"]
        assert max(gaps) > 0.1 and audit["accuracy"] > 0.8, audit
        assert re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", det("experiment", "list-checkpoints", str(exp_id)))
        print(f"fairness example: experiment {exp_id} paused at step 50 with {audit}")
    finally:
        det("experiment", "kill", str(exp_id))
    assert api.wait(exp_id, timeout=60)["state"] == "STATE_CANCELED"
    assert f"Archived experiment {exp_id}" in det("experiment", "archive", str(exp_id))
