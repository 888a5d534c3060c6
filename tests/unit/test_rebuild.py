"""deploy/rebuild.py without a master: a refused login stops the rebuild, naming DET_USER/DET_PASS."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from deploy import rebuild


class Refusing(BaseHTTPRequestHandler):
    code = 401

    def do_POST(self):
        body = json.dumps({"error": {"error": "invalid credentials"}}).encode()
        self.send_response(self.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture(params=[401, 403])
def master(request, monkeypatch):
    handler = type("H", (Refusing,), {"code": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DET_USER", "admin")
    monkeypatch.setenv("DET_PASS", "not-the-password")
    cluster = SimpleNamespace(
        master_node=SimpleNamespace(address="127.0.0.1"),
        master_port=server.server_address[1],
        determined=SimpleNamespace(admin_password=None),
    )
    yield rebuild.Master(cluster), request.param  # type: ignore[arg-type]
    server.shutdown()


def test_a_refused_login_is_not_taken_for_an_unreachable_master(master):
    m, code = master
    with pytest.raises(rebuild.MasterRefused) as e:
        m.agents()
    assert f"HTTP {code}" in str(e.value) and "DET_USER/DET_PASS" in str(e.value)
    assert "not-the-password" not in str(e.value)
    # take_out_of_service carries on after a MasterError ("cannot reach the master"), not this.
    node = SimpleNamespace(hostname="gpu-node1")
    with pytest.raises(rebuild.MasterRefused):
        rebuild.take_out_of_service(m, node)  # type: ignore[arg-type]


def test_main_stops_with_one_line_and_deploys_nothing(master, monkeypatch, capsys, tmp_path):
    m, _ = master
    inventory = tmp_path / "inv.py"
    inventory.write_text("")
    node = SimpleNamespace(hostname="gpu-node1", roles=("agent",))
    cluster = SimpleNamespace(node=lambda name: node, nodes=[node], path=inventory)
    monkeypatch.setattr(rebuild, "cluster_of", lambda path: cluster)
    monkeypatch.setattr(rebuild, "Master", lambda c: m)
    ran = []
    monkeypatch.setattr(rebuild.subprocess, "run", lambda *a, **k: ran.append(a))
    assert rebuild.main([str(inventory), "gpu-node1", "--password", "hunter2"]) == rebuild.REFUSED
    err = capsys.readouterr().err
    assert ran == [] and "DET_USER/DET_PASS" in err and len(err.strip().splitlines()) == 1


class Training(BaseHTTPRequestHandler):
    """A master that logs in and lists one trial on lab-gpu1's agent (GET /api/v1/tasks as
    Determined 0.38 answers it: allocationIdToSummary, each resource's agentDevices)."""

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"token": "t"} if self.path == "/api/v1/auth/login" else {"agent": {}})

    def do_GET(self):
        assert self.path == "/api/v1/tasks", self.path
        summary = {"name": "Trial 7 (Experiment 5)", "resources": [{"agentDevices": {"lab-gpu1": {}}}]}
        self._send({"allocationIdToSummary": {"a.1": summary}})

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("force", [False, True])
def test_a_node_that_trains_is_not_rebuilt_without_force(monkeypatch, capsys, tmp_path, force):
    """#35 L9: a rebuild of a healthy node killed its trials; it now names them and stops."""
    from deploy.cluster import load_cluster
    from tests.unit.test_cluster import lab_copy

    server = ThreadingHTTPServer(("127.0.0.1", 0), Training)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cluster = load_cluster(lab_copy(tmp_path)[0])
        monkeypatch.setattr(
            rebuild.master_http, "base_url", lambda c: f"http://127.0.0.1:{server.server_address[1]}"
        )
        inventory = tmp_path / "inv.py"
        inventory.write_text("")
        monkeypatch.setattr(rebuild, "cluster_of", lambda path: cluster)
        ran = []
        monkeypatch.setattr(
            rebuild.subprocess, "run", lambda *a, **k: ran.append(a) or SimpleNamespace(returncode=1)
        )
        code = rebuild.main([str(inventory), "lab-gpu1", *(["--force"] if force else [])])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    if force:
        assert code == 1 and len(ran) == 1  # the deploy ran (and failed here)
        assert "--force: Trial 7 (Experiment 5) on lab-gpu1 will be killed" in err
    else:
        assert code == rebuild.BUSY and ran == []
        assert "lab-gpu1 runs Trial 7 (Experiment 5): it is alive and training" in err
        assert "lab-gpu1 --force" in err
