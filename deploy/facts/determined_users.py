"""The Determined master's built-in users as the master itself reports them (roles/determined/users.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra.api import FactBase

PROGRAM = Path(__file__).resolve().parents[2] / "files" / "determined" / "master-users.py"


def program_command(*args: object, tls: tuple[str, str] | None = None) -> str:
    """`python3 -c <files/determined/master-users.py> ARGS`: the program travels inside the
    command (nothing is uploaded or left on the node); every argument is quoted. tls: (the
    name master_host, the CA file) when the master serves https, handed over as Determined's
    own client reads them (DET_MASTER_CERT_NAME, DET_MASTER_CERT_FILE)."""
    text = PROGRAM.read_text()
    env = (
        []
        if tls is None
        else [f"DET_MASTER_CERT_NAME={shlex.quote(tls[0])}", f"DET_MASTER_CERT_FILE={shlex.quote(tls[1])}"]
    )
    return " ".join([*env, "python3", "-c", shlex.quote(text), *(shlex.quote(str(a)) for a in args)])


class MasterUsers(FactBase):
    """{"master": "up"|"down", "admin": "ok"|"refused"|"inactive"|"unconfigured"|"error",
    "determined": "active"|"inactive"|"absent"|"unknown", "smoke": "ok"|"absent"|"admin"|
    "inactive"|"refused"|"nofile"|"unknown"}, or None without python3.

    The program logs in as admin with the password master.yaml (`config`, 0600) holds, on
    127.0.0.1:`port`, and prints only these words: no password, hash or token leaves the node.
    """

    def requires_command(self, port: int, config: str, cert_name: str = "", cert_file: str = ""):
        return "python3"

    def command(self, port: int, config: str, cert_name: str = "", cert_file: str = ""):
        tls = (cert_name, cert_file) if cert_name and cert_file else None
        return program_command("status", int(port), config, tls=tls)

    def process(self, output):
        try:
            state = json.loads(" ".join(output))
        except ValueError:
            return None
        return state if isinstance(state, dict) else None
