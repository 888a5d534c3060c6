"""The CUDA keyring is pinned like every other download and re-checked on every run."""

import hashlib
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import StringCommand

from deploy.cluster import ClusterError, load_cluster
from deploy.facts.keyring import KeptKeyring
from roles.apt import cuda_repo as apt_pins
from tests.lab import debs

from .labfiles import lab_text
from .optest import fact, run_op

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "inventories" / "lab" / "cluster.yaml"
PIN = "ab" * 32


def lab_with(tmp_path, block: str) -> Path:
    text = lab_text(tmp_path, LAB.read_text())
    start = text.index("  cuda_keyring:\n")
    end = text.index("  mofed_tarball:\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(text[:start] + block + text[end:])
    return path


def test_the_lab_pins_its_folder_and_lookups_go_by_os(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(lab_text(tmp_path, LAB.read_text()))
    sources = load_cluster(path).sources
    assert sources.cuda_keyring_sha256("debian", "12") == dict(sources.cuda_keyring)["debian12"]
    assert sources.cuda_keyring_sha256("ubuntu", "22.04") is None


@pytest.mark.parametrize(
    "block, problem",
    [
        ("  cuda_keyring:\n    ubuntu2204: null\n", "sources.cuda_keyring.ubuntu2204: None: not pinned"),
        ("  cuda_keyring:\n    ubuntu2204: abc\n", "sources.cuda_keyring.ubuntu2204: 'abc': must be 64 hex"),
        (
            f"  cuda_keyring:\n    'ubuntu 22.04': {PIN}\n",
            "sources.cuda_keyring: 'ubuntu 22.04': keys must be NVIDIA's",
        ),
        (f"  cuda_keyring: {PIN}\n", "sources.cuda_keyring: "),
        ("  cuda_keyring: {}\n", "sources.cuda_keyring: {}: must map repo folders"),
    ],
)
def test_a_bad_keyring_pin_is_one_clean_line(tmp_path, block, problem):
    with pytest.raises(ClusterError) as e:
        load_cluster(lab_with(tmp_path, block))
    assert len(e.value.problems) == 1 and problem in e.value.problems[0], e.value.problems


# --- the fact: is the installed keyring the one inside the kept, pinned .deb? ---------------


def keyring_deb(out: Path, member: str, key: bytes) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    return debs.build_deb(out, "cuda-keyring", "1.1-1", {member: (key, 0o644)}, arch="all")


def read_fact(deb: Path, keyring: Path) -> dict:
    fact = KeptKeyring()
    command = fact.command(deb=str(deb), keyring=str(keyring), package="dtlab-no-such-package")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    return fact.process(out.splitlines())


def test_the_fact_compares_the_installed_file_with_the_kept_deb(tmp_path):
    installed = tmp_path / "usr/share/keyrings/cuda-archive-keyring.gpg"
    installed.parent.mkdir(parents=True)
    installed.write_bytes(b"the pinned key")
    member = str(installed).lstrip("/")
    deb = keyring_deb(tmp_path / "good", member, b"the pinned key")
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    assert read_fact(deb, installed) == {"deb": digest, "keyring": True, "version": ""}
    installed.write_bytes(b"a planted key")  # same package version, other file
    assert read_fact(deb, installed)["keyring"] is False
    installed.unlink()
    assert read_fact(deb, installed)["keyring"] is False
    assert read_fact(tmp_path / "gone.deb", installed) == {"deb": "", "keyring": False, "version": ""}


# --- the operation: no-op only when all three hold; otherwise a verified fetch first ---------


def run(found, sha256=PIN):
    # KeptKeyring read for the kept .deb, the keyring file and its package: any other read
    # (another path, another fact) fails the test.
    commands, noops = run_op(
        apt_pins.keyring,
        {
            fact(
                KeptKeyring,
                deb=apt_pins.KEPT_KEYRING,
                keyring=apt_pins.CUDA_KEYRING_FILE,
                package=apt_pins.CUDA_KEYRING_PACKAGE,
            ): found
        },
        "http://m/cuda/repos/debian12/x86_64/k.deb",
        sha256,
        "debian12",
    )
    return [str(c) for c in commands if isinstance(c, StringCommand)], noops


ANY_NOOP = f"{apt_pins.CUDA_KEYRING_FILE} is the one in the pinned {apt_pins.CUDA_KEYRING_DEB}"


def test_a_node_on_the_pinned_keyring_is_a_no_op():
    assert run({"deb": PIN, "keyring": True, "version": "1.1-1"}) == ([], [ANY_NOOP])


@pytest.mark.parametrize(
    "found, fetches",
    [
        ({"deb": "", "keyring": False, "version": ""}, True),  # first deploy
        ({"deb": "", "keyring": False, "version": "1.1-1"}, True),  # installed by hand, unverified
        ({"deb": "cd" * 32, "keyring": True, "version": "1.1-1"}, True),  # the pin changed
        ({"deb": PIN, "keyring": False, "version": "1.1-1"}, False),  # keyring file replaced
        ({"deb": PIN, "keyring": True, "version": "1.2-1"}, False),  # another version installed
    ],
)
def test_anything_else_reinstalls_from_a_verified_deb(found, fetches):
    commands, noops = run(found)
    assert not noops
    assert ("fetch-verified" in commands[0] and PIN in commands[0]) is fetches
    assert commands[-1].startswith("DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall")
    assert commands[-1].endswith(apt_pins.KEPT_KEYRING)


def test_a_node_whose_folder_has_no_pin_stops_before_anything_is_fetched():
    commands, _ = run({"deb": "", "keyring": False, "version": ""}, sha256=None)
    assert len(commands) == 1 and "exit 1" in commands[0]
    assert "sources.cuda_keyring has no sha256 for debian12" in commands[0]
