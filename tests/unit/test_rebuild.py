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
