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
NAMESPACE = 'mount -t tmpfs lab /run && mkdir /run/determined && mount --bind "$0" /run/determined && exec "$@"'


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
            body = {"logs": [{"container_id": self.spec["container_id"], "stdtype": "stdout", "message": line}]}
            self.lab.master.request("POST", f"/agents/logs?id={self.agent}", body)
        code = self.proc.wait()
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


def start(lab: Lab, config: str, containers: int = 1) -> tuple[int, list[Container]]:
    """`det experiment create`, then the trial's containers started where the master put them."""
    path = lab.tmp / "core-experiment.yaml"
    path.write_text(config)
    out = lab.det("experiment", "create", str(path), str(lab.model))
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


@pytest.mark.pg
def test_a_core_api_trial_completes_and_its_reports_read_back(lab):
    exp_id, (box,) = start(lab, experiment("core-api"))
    try:
        assert box.wait() == 0, box.text
    finally:
        box.kill()
    print(box.text)
    print(lab.master.log.read_text()[-20000:])
    assert "done" in box.text
