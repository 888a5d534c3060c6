"""deploy/training.py: what the master runs on each agent node, asked once per deploy.

A local HTTP server answers as Determined 0.38's master does (POST /api/v1/auth/login, GET
/api/v1/tasks with its allocationIdToSummary); the cluster is the lab's with the master's
address and port pointed at it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deploy import training
from deploy.cluster import load_cluster
from tests.unit.test_cluster import lab_copy

SUMMARIES = {
    "a1": {  # a 16-slot trial on two per_node agents
        "name": "Trial 7 (Experiment 5)",
        "resources": [
            {"agentDevices": {"lab-gpu1": {"devices": []}}},
            {"agentDevices": {"lab-gpu2": {"devices": []}}},
        ],
    },
    "a2": {
        "name": "Trial 9 (Experiment 6)",
        "resources": [{"agentDevices": {"lab-gpu1-1": {}}}],
    },  # per_domain id
    "a3": {"name": "Command 3", "resources": [{"agentDevices": {"elsewhere": {}}}]},  # not a node's agent
}


class Master(BaseHTTPRequestHandler):
    calls: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        Master.calls.append(self.path)
        length = int(self.headers.get("Content-Length", 0))
        login = json.loads(self.rfile.read(length))
        ok = login == {"username": "admin", "password": "Lab-admin_password-S3cret"}
        self.reply(200, {"token": "t0k"}) if ok else self.reply(401, {"error": {"error": "invalid"}})

    def do_GET(self) -> None:
        Master.calls.append(self.path)
        if self.headers.get("Authorization") != "Bearer t0k":
            self.reply(401, {"error": {"error": "unauthenticated"}})
        else:
            self.reply(200, {"allocationIdToSummary": SUMMARIES})


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("DET_USER", raising=False)
    monkeypatch.delenv("DET_PASS", raising=False)
    monkeypatch.setattr(training, "_ASKED", {})
    path, _ = lab_copy(tmp_path)
    lab = load_cluster(path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Master)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    local = ipaddress.IPv4Address("127.0.0.1")
    nodes = tuple(
        dataclasses.replace(n, address=local) if n.hostname == lab.master_host else n for n in lab.nodes
    )
    Master.calls = []
    yield dataclasses.replace(lab, nodes=nodes, master_port=server.server_address[1])
    server.shutdown()


def test_each_node_gets_what_runs_on_its_agents_asked_once(cluster):
    gpu1, gpu2, gpu3 = cluster.agents
    one = training.busy(cluster, gpu1)
    assert one.holders == ("Trial 7 (Experiment 5)", "Trial 9 (Experiment 6)") and one.guarded
    assert training.busy(cluster, gpu2).holders == ("Trial 7 (Experiment 5)",)
    idle = training.busy(cluster, gpu3)
    assert idle.holders == () and not idle.guarded
    assert Master.calls == ["/api/v1/auth/login", "/api/v1/tasks"]  # once per deploy, not per host


@pytest.mark.parametrize("value", ["yes", "true", "YES", "1"])
def test_the_operator_accepts_the_loss_with_data_disruptive(cluster, value):
    accepted = training.busy(cluster, cluster.agents[0], value)
    assert accepted.holders and accepted.accepted and not accepted.guarded


def test_a_master_that_does_not_answer_leaves_nothing_known_to_run(cluster, monkeypatch):
    down = dataclasses.replace(cluster, master_port=1)  # nothing listens there
    busy = training.busy(down, down.agents[0])
    assert busy.holders == () and not busy.guarded


def test_a_refused_login_leaves_nothing_known_to_run(cluster, monkeypatch):
    monkeypatch.setenv("DET_PASS", "not-the-password")
    assert training.busy(cluster, cluster.agents[0]).holders == ()


def test_the_refusal_names_the_node_the_trials_and_both_ways_on():
    busy = training.Busy(node="lab-gpu1", holders=("Trial 7 (Experiment 5)",), cluster_file="inv/my lab.yaml")
    line = busy.refusal("restarting Docker for a new daemon.json")
    assert line.startswith("lab-gpu1: restarting Docker for a new daemon.json would end what the master")
    assert "Trial 7 (Experiment 5)" in line
    assert "python -m deploy upgrade --cluster 'inv/my lab.yaml' -y" in line
    assert line.endswith("deploy with --data disruptive=yes") and "\n" not in line
