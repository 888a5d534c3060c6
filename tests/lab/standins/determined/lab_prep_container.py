# Lab stand-in: the master contact of Determined 0.38.0's harness prep step (determined.exec.prep_container)
"""The first thing a trial container does with the master, for the lab's TLS trials.

The lab's task images carry no Determined harness (lab_trials.py), so nothing in a trial
container talked to the master. With TLS on, the master puts this script into every trial
container (/run/determined/lab/prep_container.py) and runs the entrypoint through it, so that
the trust a real trial needs is exercised: the real entrypoint (/run/determined/train/
entrypoint.sh) first runs `python3 -m determined.exec.prep_container --trial --resources`,
whose first request is GET /api/v1/tasks/<DET_TASK_ID>/context_directory
(harness/determined/exec/prep_container.py download_context_directory), made the way
harness/determined/common/api/certs.py default_load sets it up:
- DET_MASTER_CERT_FILE names the master's certificate, trusted on top of the usual bundle
  ("noverify" turns verification off; a path that does not exist is warned about and
  ignored);
- DET_MASTER_CERT_NAME, when set, is the name the master's certificate must carry (the
  connection still goes to DET_MASTER's host: _session.py _HTTPSAdapter server_hostname);
- retries as prep_container's Retry(total=6, backoff_factor=0.5): seven tries, 0, 1, 2, 4, 8
  and 16 seconds apart (urllib3 2.x Retry.get_backoff_time), then the trial fails with
  requests' "HTTPSConnectionPool(host=..., port=...): Max retries exceeded with url: ...
  (Caused by SSLError(...))" after a traceback, exit status 1.
On success it runs the entrypoint in its place (exec). Lab-only: DTLAB_PREP_RETRIES sets the
retry count (tests); the context directory's content is not used (the lab's master copies the
model definition in itself).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import sys
import time
from urllib.parse import urlsplit


class _Connection(http.client.HTTPConnection):
    """HTTPS to DET_MASTER's address, checking the certificate against `server_name`."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext | None, server_name: str):
        super().__init__(host, port, timeout=30)
        self.context = context
        self.server_name = server_name

    def connect(self) -> None:
        super().connect()
        if self.context is not None:
            self.sock = self.context.wrap_socket(self.sock, server_hostname=self.server_name)


def tls_context() -> ssl.SSLContext:
    """certs.default_load + requests' verify: the system's bundle plus the master's file."""
    path = os.environ.get("DET_MASTER_CERT_FILE") or ""
    if path.lower() == "noverify":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context = ssl.create_default_context()
    context.hostname_checks_common_name = False  # urllib3 2.x matches subjectAltName only
    if path:
        if os.path.exists(path):
            context.load_verify_locations(cafile=path)
        else:
            print(f"DET_MASTER_CERT_FILE={path} path not found; continuing without cert", file=sys.stderr)
    return context


def contact_master() -> None:
    url = urlsplit(os.environ["DET_MASTER"])
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    context = tls_context() if url.scheme == "https" else None
    server_name = os.environ.get("DET_MASTER_CERT_NAME") or host
    path = f"/api/v1/tasks/{os.environ.get('DET_TASK_ID', '')}/context_directory"
    retries = int(os.environ.get("DTLAB_PREP_RETRIES", "6"))
    last: Exception | None = None
    for attempt in range(retries + 1):
        if attempt > 1:
            time.sleep(min(0.5 * 2 ** (attempt - 1), 120))
        conn = _Connection(host, port, context, server_name)
        try:
            conn.request(
                "GET", path, headers={"Authorization": f"Bearer {os.environ.get('DET_SESSION_TOKEN', '')}"}
            )
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as e:
            last = e
            continue
        finally:
            conn.close()
        if resp.status != 200:
            # bindings raise APIException with the master's error; no retry for an answer.
            try:
                message = json.loads(body)["error"]["error"]
            except (ValueError, KeyError, TypeError):
                message = body.decode(errors="replace")
            fail(f"determined.common.api.errors.APIException: {message}")
        return
    kind = "SSLError" if isinstance(last, ssl.SSLError) else "NewConnectionError"
    pool = "HTTPSConnectionPool" if url.scheme == "https" else "HTTPConnectionPool"
    fail(
        f"requests.exceptions.{'SSLError' if kind == 'SSLError' else 'ConnectionError'}: "
        f"{pool}(host={host!r}, port={port}): Max retries exceeded with url: {path} "
        f"(Caused by {kind}({last!r}))"
    )


def fail(line: str) -> None:
    sys.stderr.write("Traceback (most recent call last):\n  (lab: determined.exec.prep_container)\n")
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    sys.exit(1)


def main(argv: list[str]) -> None:
    contact_master()
    sys.stdout.flush()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main(sys.argv[1:])
