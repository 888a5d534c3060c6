"""The Determined master's built-in users as the master itself reports them (roles/determined_users.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra.api import FactBase

PROGRAM = Path(__file__).resolve().parents[2] / "files" / "determined" / "master-users.py"


def program_command(*args: object) -> str:
    """`python3 -c <files/determined/master-users.py> ARGS`: the program travels inside the
    command (nothing is uploaded or left on the node); every argument is quoted."""
    text = PROGRAM.read_text()
    return " ".join(["python3", "-c", shlex.quote(text), *(shlex.quote(str(a)) for a in args)])


class MasterUsers(FactBase):
    """{"master": "up"|"down", "admin": "ok"|"refused"|"inactive"|"unconfigured"|"error",
    "determined": "active"|"inactive"|"absent"|"unknown"}, or None without python3.

    The program logs in as admin with the password master.yaml (`config`, 0600) holds, on
    127.0.0.1:`port`, and prints only these words: no password, hash or token leaves the node.
    """

    def requires_command(self, port: int, config: str):
        return "python3"

    def command(self, port: int, config: str):
        return program_command("status", int(port), config)

    def process(self, output):
        try:
            state = json.loads(" ".join(output))
        except ValueError:
            return None
        return state if isinstance(state, dict) else None
