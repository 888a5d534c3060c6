"""files/shared/apt-update.sh against a real apt-get and a repository behind an HTTP server
that fails its first requests, the way a loaded caching proxy does (503)."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from roles.shared.apt_lists import DEPLOY_SOURCES, update_command
from roles.shared.scripts import script

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("apt-get", "apt-cache")), reason="needs apt"
)


def serve(repo: Path, failures: int):
    """An HTTP server for `repo` that answers its first `failures` requests with 503."""
    left = [failures]

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(repo), **kwargs)

        def do_GET(self):
            if left[0] > 0:
                left[0] -= 1
                self.send_error(503, "Service Unavailable")
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def node(tmp_path):
    """An apt root (Dir=) whose one source is the served repository; yields (serve, run, cache)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "Packages").write_text(
        "Package: nvidia-utils-515\nVersion: 515.65.01-0ubuntu1\nArchitecture: all\n"
        "Maintainer: lab\nFilename: ./nvidia-utils-515.deb\nSize: 1\nDescription: x\n\n"
    )
    (repo / "Release").write_text("Origin: NVIDIA\nLabel: NVIDIA\nArchitectures: all\n")
    root = tmp_path / "root"
    for d in ("etc/apt/apt.conf.d", "etc/apt/sources.list.d", "var/lib/apt/lists/partial", "var/lib/dpkg"):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    # apt reads APT_CONFIG before its command line: the same Dir for every apt run in the script.
    conf = root / "apt.conf"
    conf.write_text(
        f'Dir "{root}/";\nDir::State::status "{root}/var/lib/dpkg/status";\nDebug::NoLocking "1";\n'
        f'APT::Sandbox::User "{os.environ.get("USER", "root")}";\nAcquire::Retries "0";\n'
    )
    env = {**os.environ, "LC_ALL": "C", "APT_CONFIG": str(conf)}
    servers = []

    def start(failures: int, where: str = "etc/apt/sources.list") -> None:
        server = serve(repo, failures)
        servers.append(server)
        (root / where).write_text(f"deb [trusted=yes] http://127.0.0.1:{server.server_port}/ /\n")

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, check=False)

    def offered() -> str:
        return run("apt-cache madison nvidia-utils-515").stdout

    yield start, run, offered
    for server in servers:
        server.shutdown()


def test_plain_apt_get_update_hides_a_failed_fetch(node):
    """Why the script exists: apt-get update exits 0 and the package is simply not there."""
    start, run, offered = node
    start(failures=1)
    proc = run("apt-get update")
    assert proc.returncode == 0, proc.stderr
    assert "503" in proc.stderr or "503" in proc.stdout
    assert "nvidia-utils-515" not in offered()


def test_a_failed_fetch_is_tried_again(node):
    start, run, offered = node
    start(failures=1)
    proc = run(script("shared/apt-update.sh", 600, 3, 0).get_raw_value())
    assert proc.returncode == 0, proc.stderr
    assert "(attempt 1 of 3)" in proc.stderr
    assert "515.65.01-0ubuntu1" in offered()


def test_a_fetch_that_keeps_failing_fails_the_host(node):
    start, run, offered = node
    start(failures=1000)
    proc = run(script("shared/apt-update.sh", 600, 2, 0).get_raw_value())
    assert proc.returncode == 1
    assert "503" in proc.stdout + proc.stderr
    assert proc.stderr.strip().endswith("apt-get update failed 2 times (apt's messages above)")
    assert "nvidia-utils-515" not in offered()


def test_a_failing_repository_the_deploy_does_not_use_is_a_warning(node):
    """A site's own repository that does not answer (a stale PPA, a monitoring agent's) leaves
    the host to the deploy: the repositories it installs from were fetched."""
    start, run, offered = node
    start(failures=0)  # the distribution's sources.list: fine
    start(failures=1000, where="etc/apt/sources.list.d/site-monitoring.list")
    proc = run(update_command().get_raw_value())
    assert proc.returncode == 0, proc.stderr
    assert "a repository the deploy does not install from failed" in proc.stderr
    assert "503" in proc.stdout + proc.stderr  # apt's own message stays in the output
    assert "515.65.01-0ubuntu1" in offered()


def test_a_failing_repository_of_the_deploy_still_fails_the_host(node):
    """The CUDA repo's list (a DEPLOY_SOURCES name) that keeps failing fails the host, even with
    a healthy sources.list beside it."""
    start, run, offered = node
    assert "cuda-*-x86_64.list" in DEPLOY_SOURCES
    start(failures=0)
    start(failures=1000, where="etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list")
    proc = run(script("shared/apt-update.sh", 600, 2, 0, *DEPLOY_SOURCES).get_raw_value())
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().endswith("apt-get update failed 2 times (apt's messages above)")


@pytest.mark.parametrize("os_id, os_version", [("ubuntu", "20.04"), ("ubuntu", "22.04"), ("debian", "12")])
def test_the_deploys_own_lists_are_named_in_deploy_sources(os_id, os_version):
    from fnmatch import fnmatch

    from roles.apt.pinsets import sources_list_path
    from roles.postgresql.server import PGDG_LIST

    for path in (sources_list_path(os_id, os_version), PGDG_LIST):
        assert path.startswith("/etc/apt/sources.list.d/")
        assert any(fnmatch(path.rsplit("/", 1)[1], p) for p in DEPLOY_SOURCES), path
