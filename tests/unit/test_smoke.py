"""Verify's smoke experiment: the configurations, the trial's S3 part against the MinIO stand-in,
the log-to-verdict and failure-to-hint mapping, the runner with a fake master, the lab image's
Debian layer."""

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

from deploy.experiment import lint, smoke
from deploy.experiment.target import load
from tests.unit.test_standin_minio import PASSWORD, REGION, USER, MinioProcess
from tests.verify import smoke_client as sc
from tests.verify.hints import HINTS
from tests.verify.matrix import FAIL, Cell, Result

REPO = Path(__file__).resolve().parents[2]
LAB = str(REPO / "inventories" / "lab" / "cluster.yaml")
TRIAL = REPO / "deploy" / "experiment" / "smoke_model" / smoke.TRIAL_FILE


@pytest.fixture(scope="module")
def target():
    return load(LAB)


# --- configurations ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", smoke.KINDS)
def test_configs_come_from_the_template_and_pass_the_lint(kind, target, tmp_path):
    kwargs = {"restore_uuid": "0" * 8 + "-0000-4000-8000-" + "0" * 12} if kind == smoke.RESTORE else {}
    slots = 16 if kind == smoke.ALLREDUCE else 1
    doc = smoke.config(target, kind, "20260101-000000-abcdef", slots=slots, **kwargs)
    assert doc["entrypoint"] == f"python3 {smoke.TRIAL_FILE}"
    assert doc["max_restarts"] == 0
    assert doc["resources"]["slots_per_trial"] == slots
    assert doc["hyperparameters"]["smoke"] == kind
    storage = doc["checkpoint_storage"]
    assert storage["prefix"] == "verify-smoke/20260101-000000-abcdef"
    assert (storage["bucket"], storage["endpoint_url"]) == (target.bucket, target.endpoint_url)
    assert not {"region", "access_key", "secret_key"} & set(storage)  # the master gives trials those
    assert doc["environment"]["image"] == {"cuda": target.image_gpu, "cpu": target.image_cpu}
    path = tmp_path / "experiment.yaml"
    path.write_text(smoke.config_yaml(target, kind, "20260101-000000-abcdef", slots=slots, **kwargs))
    model = tmp_path / "model"
    model.mkdir()
    (model / smoke.TRIAL_FILE).write_text(smoke.TRIAL_PY)
    errors = [p for p in lint.lint(str(path), target, str(model)) if not p.warning]
    assert errors == []


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
    ],
)
def test_failure_hints(kind, line, hint):
    assert sc.failure_hint(kind, line) == hint


def test_every_smoke_row_has_a_static_hint_and_the_matrix_takes_a_fitted_one():
    rows = (
        "test_smoke_trial_saves_a_checkpoint",
        "test_smoke_trial_restores_it",
        "test_smoke_two_agent_allreduce",
    )
    assert all(r in HINTS for r in rows)
    fitted = Result(
        "test_smoke.py::x", "(cluster)", None, FAIL, "m", hint=(sc.REGION.symptom, sc.REGION.action)
    )
    assert Cell([fitted]).hint("test_smoke.py::x", "") == sc.REGION
    plain = Result("test_smoke.py::test_smoke_trial_restores_it", "(cluster)", None, FAIL, "m")
    assert Cell([plain]).hint(plain.check, "").symptom == HINTS["test_smoke_trial_restores_it"].symptom


# --- the runner, with a fake master -----------------------------------------------------------


class FakeApi:
    """A master whose experiments end at once; `say[kind]` is what that trial prints."""

    def __init__(self, say: dict[str, list[str]], refuse: set[str] = frozenset(), states=None):
        self.say, self.refuse, self.states = say, refuse, states or {}
        self.experiments: dict[int, tuple[str, dict]] = {}
        self.ended: list[int] = []

    def create(self, config_yaml: str) -> int:
        doc = yaml.safe_load(config_yaml)
        kind = doc["hyperparameters"]["smoke"]
        if kind in self.refuse:
            raise sc.SmokeError("POST /api/v1/experiments -> 400: invalid experiment")
        number = len(self.experiments) + 1
        self.experiments[number] = (kind, doc)
        return number

    def state(self, experiment: int) -> str:
        kind = self.experiments[experiment][0]
        return self.states.get(kind, "STATE_COMPLETED")

    def trials(self, experiment: int) -> list[dict]:
        return [{"id": experiment, "state": "STATE_COMPLETED"}]

    def logs(self, trial: int) -> list[str]:
        return self.say[self.experiments[trial][0]]

    def end(self, experiment: int) -> str:
        self.ended.append(experiment)
        return self.state(experiment)


UUID = "1b4e28ba-2fa1-4d3b-883f-0016d3cca427"


def run(api, target, slots=16):
    removed: list[str] = []

    def remove(prefix):
        removed.append(prefix)
        return f"removed {prefix}"

    runner = sc.Smoke(api, target, "r1", slots, remove)
    sc.POLL, old = 0.0, sc.POLL
    try:
        rows = runner.run()
    finally:
        sc.POLL = old
    return runner, rows, removed


def test_all_green_restore_gets_the_saved_uuid(target):
    api = FakeApi(
        {
            "save": [f"SMOKE-OK checkpoint-save: uuid={UUID} s3://b/verify-smoke/r1/{UUID}"],
            "restore": [f"SMOKE-OK checkpoint-restore: uuid={UUID} read back, sha256 matches"],
            "allreduce": ["SMOKE-PART allreduce: container 1", "SMOKE-OK allreduce: 2 ranks over ib0: sum 3"],
        }
    )
    runner, rows, removed = run(api, target)
    assert {k: r.status for k, r in rows.items()} == dict.fromkeys(smoke.KINDS, sc.OK)
    restore_doc = next(doc for kind, doc in api.experiments.values() if kind == smoke.RESTORE)
    assert restore_doc["hyperparameters"]["restore_uuid"] == UUID
    assert restore_doc["resources"]["slots_per_trial"] == 1
    allreduce_doc = next(doc for kind, doc in api.experiments.values() if kind == smoke.ALLREDUCE)
    assert allreduce_doc["resources"]["slots_per_trial"] == 16
    assert sorted(api.ended) == [1, 2, 3] and removed == ["verify-smoke/r1"]


def test_a_failed_save_skips_the_restore_and_keeps_its_hint(target):
    api = FakeApi(
        {"save": [f"SMOKE-FAIL checkpoint-save: {REGION_LINE}"], "allreduce": ["SMOKE-OK allreduce: ok"]},
        states={"save": "STATE_ERROR"},
    )
    _, rows, removed = run(api, target)
    assert rows[smoke.SAVE].status == sc.FAIL and rows[smoke.SAVE].hint == sc.REGION
    assert rows[smoke.RESTORE].status == sc.SKIP
    assert rows[smoke.RESTORE].line == "not run: no checkpoint from the save trial"
    assert rows[smoke.ALLREDUCE].status == sc.OK
    assert len(api.experiments) == 2 and removed  # the cleanup ran


def test_a_refused_experiment_and_no_two_agents(target):
    api = FakeApi({}, refuse={"save"})
    _, rows, _ = run(api, target, slots=None)
    assert rows[smoke.SAVE].status == sc.FAIL and rows[smoke.SAVE].hint == sc.REFUSED
    assert rows[smoke.RESTORE].status == sc.SKIP
    assert rows[smoke.ALLREDUCE].status == sc.SKIP and "fewer than two" in rows[smoke.ALLREDUCE].line


def test_a_trial_that_dies_without_a_verdict(target):
    api = FakeApi({"save": ["docker: pull access denied"], "allreduce": []}, states={"save": "STATE_ERROR"})
    _, rows, _ = run(api, target)
    assert rows[smoke.SAVE].status == sc.FAIL and "pull access denied" in rows[smoke.SAVE].line
    assert rows[smoke.ALLREDUCE].status == sc.FAIL and rows[smoke.ALLREDUCE].hint == sc.CRASHED


def test_cleanup_runs_when_the_master_goes_away(target):
    class Broken(FakeApi):
        def state(self, experiment):
            raise sc.SmokeError("GET /api/v1/experiments/1: connection refused")

        def end(self, experiment):
            raise sc.SmokeError("POST kill: connection refused")

    api = Broken({})
    removed: list[str] = []
    runner = sc.Smoke(api, target, "r1", 16, lambda p: removed.append(p) or "ok")
    with pytest.raises(sc.SmokeError):
        runner.run()
    assert removed == ["verify-smoke/r1"] and any("not archived" in n for n in runner.cleanup_notes)


@pytest.mark.parametrize(
    ("agents", "slots"),
    [
        ([("lab-gpu1-0", 8), ("lab-gpu2-0", 8), ("lab-gpu3", 8)], 16),
        ([("lab-gpu1-0", 4), ("lab-gpu1-1", 4), ("lab-gpu2", 8), ("lab-gpu3", 8)], 16),  # 4s on one node
        ([("lab-gpu1-0", 4), ("lab-gpu2-0", 4), ("lab-gpu3", 8)], 8),
        ([("lab-gpu1", 8)], None),
        ([("lab-gpu1", 8), ("lab-gpu2", 8, False)], None),  # disabled
        ([("other-1", 8), ("lab-gpu2", 8)], None),  # not this cluster's
    ],
)
def test_allreduce_slots(agents, slots):
    api_agents = [
        {"id": a[0], "slots": {str(i): {} for i in range(a[1])}, "enabled": a[2] if len(a) > 2 else True}
        for a in agents
    ]
    node_of = sc.node_of_agent({"lab-gpu1", "lab-gpu2", "lab-gpu3"})
    assert sc.allreduce_slots(api_agents, node_of) == slots


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
