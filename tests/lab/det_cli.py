"""The pinned `det` CLI (Determined 0.38.0, the project's own dependency) in a subprocess, as
an operator runs it: DET_MASTER names the master, HOME holds the login (auth.json), and there
is no terminal, so getpass reads a password from stdin (never from the command line). Used by
the lab's det test and the unit tests of the master stand-in against the same CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DET = Path(sys.executable).parent / "det"


def run_det(
    master: str,
    home: Path,
    *args: str,
    cwd: Path,
    stdin: str = "",
    ok: bool = True,
    timeout: float = 120,
    **env: str,
) -> str:
    """`det ARGS` against `master` (a URL); its output, asserted to succeed (or, with ok=False,
    to fail) without a traceback."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "DTLAB_", "AWS_", "DOCKER_"))}
    clean.update(DET_MASTER=master, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), **env)
    result = subprocess.run(
        [str(DET), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        start_new_session=True,  # no controlling terminal: getpass reads stdin
        env=clean,
    )
    out = result.stdout + result.stderr
    assert (result.returncode == 0) == ok, f"det {' '.join(args)} -> {result.returncode}:\n{out}"
    assert "Traceback" not in out, out
    return out
