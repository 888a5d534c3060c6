"""The lab's cluster.yaml for unit tests, with the files it names under /var/lib/dtlab/ (the
secrets, the registry's CA, the SSH key) made in the test's own directory: a unit test must pass on a
controller where no lab was ever brought up, and must not read or write a running lab's."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.lab.spec import ensure_secrets
from tests.unit.tls_material import ca_pem

LAB_STATE = "/var/lib/dtlab/"


def lab_text(tmp_path: Path, text: str) -> str:
    """`text` (a lab cluster.yaml) naming files under tmp_path, which exist: the secrets made
    by the lab's own code (0600), the registry CA a readable CA certificate, as
    test_cluster.lab_copy's (the loader parses its blocks: deploy/cluster/images.py)."""
    text = text.replace(LAB_STATE, f"{tmp_path}/dtlab/")
    path = tmp_path / "dtlab-cluster.yaml"
    path.write_text(text)
    ensure_secrets(path)
    ca = tmp_path / "dtlab" / "registry" / "ca.crt"
    ca.parent.mkdir(parents=True, exist_ok=True)
    ca.write_text(ca_pem())
    # ssh.key_file must exist, for its owner only (deploy/cluster/ssh.py); nothing logs in.
    key_file = (yaml.safe_load(text).get("ssh") or {}).get("key_file")
    if key_file and key_file.startswith(f"{tmp_path}/"):
        key = Path(key_file)
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
        key.chmod(0o600)
    return text
