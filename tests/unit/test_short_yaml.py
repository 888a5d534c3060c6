"""python -m deploy short-yaml: the short cluster.yaml shape, derived from ours, without secret values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy.cluster import load_cluster
from deploy.short_yaml import main, render_short_yaml

REPO = Path(__file__).resolve().parents[2]
PROD = REPO / "inventories" / "prod" / "cluster.yaml"
PIN = "cd" * 32
ENV = {
    "DET_MINIO_ACCESS_KEY": "Art-Access-1",
    "DET_MINIO_SECRET_KEY": "Art-Secret-22",
    "DET_DB_PASSWORD": "Art-Db-333",
    "DET_ADMIN_PASSWORD": "Art-Admin-4444",
}


PROD_TLS = "/etc/gpu-cluster/tls/"  # where the prod example's certificates and keys are


def prod_pki(directory: Path) -> Path:
    """The prod example's TLS files under `directory`: one CA, the master's certificate for
    gpu-master and MinIO's for gpu-master and its address, each key 0600."""
    from tests.unit.tls_material import make_ca, make_server, write

    directory.mkdir(exist_ok=True)
    ca = make_ca("prod example CA")
    write(directory / "ca.crt", ca.cert_pem)
    for stem, names in (("master", ["gpu-master"]), ("minio", ["gpu-master", "192.168.1.10"])):
        server = make_server(ca, names, cn=stem)
        write(directory / f"{stem}.crt", server.cert_pem)
        write(directory / f"{stem}.key", server.key_pem(), 0o600)
    return directory


def pinned_prod_text(text: str, pin: str, pki: Path) -> str:
    """The prod example with everything an operator supplies filled in: the sha256 nulls, the
    task images' digests, and its TLS files (made by prod_pki in `pki`)."""
    text = text.replace(": null   # operator: pin it", f": {pin}")
    text = text.replace(PROD_TLS, f"{prod_pki(pki)}/")
    return text.replace("-748dda4   # operator: pin it by digest", f"-748dda4@sha256:{pin}")


def pinned_prod(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(pinned_prod_text(PROD.read_text(), PIN, tmp_path / "pki") + extra)
    return path


def test_prod_renders_the_short_file(tmp_path, monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    text = render_short_yaml(load_cluster(pinned_prod(tmp_path)))
    assert yaml.safe_load(text) == {
        "master_host": "192.168.1.10",
        "master_port": 23457,
        "agents": [
            {"host": "192.168.1.11", "slots": 8},
            {"host": "192.168.1.12", "slots": 8},
            {"host": "192.168.1.13", "slots": 8},
        ],
        "storage": {
            "type": "s3",
            "bucket": "det-checkpoints",
            "endpoint_url": "https://gpu-master:9000",
            "access_key": {"env": "DET_MINIO_ACCESS_KEY"},
            "secret_key": {"env": "DET_MINIO_SECRET_KEY"},
        },
    }
    assert "  access_key: {env: DET_MINIO_ACCESS_KEY}\n" in text
    for value in ENV.values():
        assert value not in text


def test_prefix_is_carried_over(tmp_path, monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    path = pinned_prod(tmp_path)
    path.write_text(
        path.read_text().replace(
            "  bucket: det-checkpoints\n", "  bucket: det-checkpoints\n  prefix: team-a\n"
        )
    )
    document = yaml.safe_load(render_short_yaml(load_cluster(path)))
    assert document["storage"]["prefix"] == "team-a"
    assert "region" not in document["storage"]


@pytest.mark.parametrize(
    "command",
    [["deploy", "short-yaml", "--cluster"], ["deploy.article"]],  # the front door, the old alias
    ids=["front-door", "alias"],
)
def test_command_needs_no_secrets(tmp_path, command):
    """Only references are written, so the environment need not hold the secrets."""
    path = pinned_prod(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run(
        [sys.executable, "-m", *command, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert yaml.safe_load(run.stdout)["master_host"] == "192.168.1.10"
    assert run.stdout.startswith(f"# The short cluster.yaml, generated from {path} by\n")
    assert f"# `python -m deploy short-yaml --cluster {path}`: edit that file" in run.stdout


def test_command_on_a_broken_file(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text(PROD.read_text())  # sha256 not pinned
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    # 2 keyrings, 2 OFED distros, 3 files; the 2 task images' digests
    assert len(err) == 9 and sum(": not pinned: " in line for line in err) == 7
    assert sum(": has no digest: " in line for line in err) == 2
    assert main([]) == 2
