"""Attacks on what the toolkit trusts, tried on the lab and refused.

- verify against an impostor: a known_hosts file whose key for one node is wrong, with strict
  host key checking (a modified copy of the lab's cluster.yaml; the lab itself opts out, its
  node keys change on every rebuild): that node's column is SSH with the host-key reason, the
  others run their checks as usual.
- a forged cuda-keyring on the mirror (another .deb at the same path, same name and version):
  the node that has to fetch it refuses it (sha256 pin, sources.cuda_keyring) and installs
  nothing; with the mirror repaired, the next deploy installs the pinned one.
"""

import re
import shutil
import subprocess

import pytest
import yaml

from deploy.pins import CUDA_KEYRING_DEB, CUDA_KEYRING_FILE
from roles.apt_pins import KEPT_KEYRING

from . import debs
from .conftest import LAB_CLUSTER, run_verify
from .paths import MIRROR
from .pins import LAB_DISTRO


@pytest.fixture
def impostor_cluster(lab, tmp_path):
    """(cluster.yaml copy checking host keys, hostname whose known key is wrong)."""
    victim = lab.agents[0]
    lines = []
    for node in lab.nodes:
        if node is victim:
            key = tmp_path / "impostor"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            kind, blob = key.with_suffix(".pub").read_text().split()[:2]
            name = str(node.address) if lab.ssh.port == 22 else f"[{node.address}]:{lab.ssh.port}"
            lines.append(f"{name} {kind} {blob}\n")
            continue
        scan = subprocess.run(
            ["ssh-keyscan", "-T", "5", "-p", str(lab.ssh.port), "-t", "ed25519", str(node.address)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert scan.stdout.strip(), f"no host key from {node.hostname}: {scan.stderr}"
        lines.append(scan.stdout)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("".join(lines))
    raw = yaml.safe_load(LAB_CLUSTER.read_text())
    text = LAB_CLUSTER.read_text()
    assert raw["ssh"]["strict_host_key_checking"] is False  # the lab's documented opt-out
    text = re.sub(r"(?m)^  strict_host_key_checking: false$", "  strict_host_key_checking: true", text)
    text = re.sub(r"(?m)^  known_hosts_file: .*$", f"  known_hosts_file: {known_hosts}", text)
    copy = tmp_path / "cluster.yaml"
    copy.write_text(text)
    return copy, victim.hostname, known_hosts


def node_rows(matrix: str) -> dict[str, str]:
    rows = {}
    for line in matrix.split("## Nodes", 1)[1].split("## Checks", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] not in ("node", "---"):
            rows[cells[0]] = line
    return rows


def test_verify_refuses_a_node_whose_host_key_does_not_match(lab, impostor_cluster, tmp_path):
    cluster, victim, known_hosts = impostor_cluster
    matrix_md = tmp_path / "matrix.md"
    result = run_verify(
        "-n",
        "4",
        "--dist",
        "loadgroup",
        "-p",
        "tests.verify.matrix",
        f"--verify-matrix={matrix_md}",
        cluster=cluster,
    )
    assert result.returncode != 0
    header = f"host keys: checked against {known_hosts}; unknown or different keys refused"
    assert header in result.stdout
    matrix = matrix_md.read_text()
    assert header in matrix
    rows = node_rows(matrix)
    assert "UNREACHABLE" in rows[victim] and "host key does not match known_hosts" in rows[victim], matrix
    others = {name: row for name, row in rows.items() if name not in (victim, "(cluster)")}
    assert others and not [row for row in others.values() if "UNREACHABLE" in row], matrix
    # The other nodes were checked (the lab as deployed, or not: the point is who verify talks
    # to): at least one check passed on each, none was cut by SSH.
    for row in others.values():
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[2]) > 0 and cells[4] == "0", row


def node_keyring_state(lab_ssh, hostname: str) -> str:
    return lab_ssh(
        hostname,
        f"sha256sum {CUDA_KEYRING_FILE}; dpkg-query -W -f='${{Status}} ${{Version}}\\n' cuda-keyring; "
        f"ls {KEPT_KEYRING}.part 2>/dev/null || true",
    ).stdout


@pytest.fixture
def forged_keyring(lab, tmp_path):
    """The mirror's keyring .deb for the lab's folder replaced by another one: same package,
    same version, a key the pin never saw. Put back afterwards."""
    served = MIRROR / "cuda" / "repos" / LAB_DISTRO / "x86_64" / CUDA_KEYRING_DEB
    saved = tmp_path / "saved.deb"
    shutil.copy2(served, saved)
    forged = debs.build_deb(
        tmp_path / "forged",
        "cuda-keyring",
        "1.1-1",
        {CUDA_KEYRING_FILE.lstrip("/"): (b"an attacker's keyring", 0o644)},
        arch="all",
    )
    try:
        shutil.copyfile(forged, served)
        yield served
    finally:
        shutil.copyfile(saved, served)


def test_a_forged_keyring_on_the_mirror_is_refused(deployed, lab, lab_ssh, deploy, forged_keyring):
    victim = lab.agents[-1].hostname
    # The node must fetch: as a freshly installed node would, it has no verified copy yet.
    lab_ssh(victim, f"rm -f {KEPT_KEYRING}")
    before = node_keyring_state(lab_ssh, victim)
    run = deploy(limit=victim)
    assert run.returncode != 0
    assert f"{CUDA_KEYRING_DEB}: sha256 mismatch" in run.stderr, run.stderr[-3000:]
    assert "nothing was installed" in run.stderr
    assert node_keyring_state(lab_ssh, victim) == before  # same keyring file, same package
    assert lab_ssh(victim, f"test -e {KEPT_KEYRING}", check=False).returncode != 0


def test_the_pinned_keyring_is_restored_and_then_left_alone(lab, lab_ssh, deploy):
    victim = lab.agents[-1].hostname
    lab_ssh(victim, f"rm -f {KEPT_KEYRING}")
    first = deploy(limit=victim)
    assert first.returncode == 0, first.stderr[-3000:]
    assert any("Trust the CUDA repository" in op for op in first.changed_operations())
    again = deploy(limit=victim)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not [op for op in again.changed_operations() if "Trust the CUDA repository" in op]
