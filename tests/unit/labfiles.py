"""The lab's cluster.yaml for unit tests, with the files it names under /var/lib/dtlab/ (the
secrets, the registry's CA) made in the test's own directory: a unit test must pass on a
controller where no lab was ever brought up, and must not read or write a running lab's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.lab.spec import ensure_secrets

LAB_STATE = "/var/lib/dtlab/"


def lab_text(tmp_path: Path, text: str) -> str:
    """`text` (a lab cluster.yaml) naming files under tmp_path, which exist: the secrets made
    by the lab's own code (0600), the registry CA a real self-signed certificate."""
    text = text.replace(LAB_STATE, f"{tmp_path}/dtlab/")
    path = tmp_path / "dtlab-cluster.yaml"
    path.write_text(text)
    ensure_secrets(path)
    ca = tmp_path / "dtlab" / "registry" / "ca.crt"
    if not ca.exists():
        ca.parent.mkdir(parents=True, exist_ok=True)
        key = ca.with_name("ca.key")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
            + ["-keyout", str(key), "-out", str(ca), "-days", "1", "-subj", "/CN=unit test CA"],
            capture_output=True,
            check=True,
        )
    return text
