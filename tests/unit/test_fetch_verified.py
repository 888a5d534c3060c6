"""files/shared/fetch-verified.sh without curl and with a mirror login (download.netrc):
refused only for the host the login is for, the usual fallbacks for every other host.

The script runs with a PATH that has every tool it uses but curl (and wget), so its last
fallback, Python's urllib, fetches from a loopback HTTP server.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

from roles.shared import ops as shared_ops
from roles.shared.templates import files_path

TOOLS = ("sh", "mkdir", "dirname", "rm", "awk", "tr", "sha256sum", "cut", "mv", "chown", "chmod", "python3")


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "tool").write_bytes(b"tool\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def no_curl(tmp_path):
    """A PATH with the script's tools, curl and wget left out."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        # The interpreter itself, not a version manager's shell shim in front of it.
        found = os.path.realpath(sys.executable) if tool == "python3" else shutil.which(tool)
        if found is None:
            pytest.skip(f"needs {tool}")
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def fetch(tmp_path, path_dir, url, netrc_text):
    netrc = tmp_path / "download.netrc"
    if netrc_text is None:
        netrc.unlink(missing_ok=True)
    else:
        netrc.write_text(netrc_text)
    script = files_path("shared/fetch-verified.sh").read_text()
    assert f"netrc={shared_ops.DOWNLOAD_NETRC}\n" in script
    local = script.replace(shared_ops.DOWNLOAD_NETRC, str(netrc))
    dest = tmp_path / "out" / "tool"
    pin = hashlib.sha256(b"tool\n").hexdigest()
    proc = subprocess.run(
        ["sh", "-c", local, "fetch-verified.sh", url, str(dest), "Tool", pin],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path_dir},
        timeout=60,
    )
    return proc, dest


def test_login_for_this_host_needs_curl(tmp_path, served, no_curl):
    # curl matches a machine by host name, in any case, without the port.
    proc, dest = fetch(tmp_path, no_curl, f"{served}/tool", "machine 127.0.0.1 login u password p\n")
    assert proc.returncode == 1 and not dest.exists()
    assert proc.stderr.strip() == (
        f"Tool: the mirror login for 127.0.0.1 ({tmp_path}/download.netrc) needs curl, which is not installed"
    )
    assert "password" not in proc.stderr and " p " not in proc.stderr


def test_login_for_another_host_leaves_the_fallbacks(tmp_path, served, no_curl):
    netrc = "machine Mirror.Example login u password p\nmachine proxy.example login v password q\n"
    proc, dest = fetch(tmp_path, no_curl, f"{served}/tool", netrc)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == b"tool\n"


def test_without_a_login_the_fallbacks_as_before(tmp_path, served, no_curl):
    proc, dest = fetch(tmp_path, no_curl, f"{served}/tool", None)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == b"tool\n"
