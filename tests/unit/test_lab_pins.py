"""The lab cluster.yaml pins the sha256 of exactly what the lab mirror builds."""

import yaml

from deploy.cluster import load_cluster  # noqa: F401  (the model must import without root)
from tests.lab import mirror
from tests.lab.paths import DEFAULT_CLUSTER
from tests.lab.pins import KEYRING, LAB_DISTRO, expected_pins


def test_lab_cluster_pins_match_a_fresh_mirror_build(tmp_path):
    mirror_dir = tmp_path / "mirror"
    mirror.build_mirror(mirror_dir, "http://10.77.0.1:8077", tmp_path / "gpg")
    pins = expected_pins(DEFAULT_CLUSTER, mirror_dir)
    sources = yaml.safe_load(DEFAULT_CLUSTER.read_text())["sources"]
    written = {name: sources[name][LAB_DISTRO if name == KEYRING else "sha256"] for name in pins}
    assert written == pins, "stale pins: run `python -m tests.lab.pins` after changing a stand-in"


def test_rewrite_updates_the_keyring_pin_of_the_lab_folder():
    from tests.lab.pins import rewrite

    text = DEFAULT_CLUSTER.read_text()
    new = rewrite(text, {KEYRING: "a" * 64})
    assert yaml.safe_load(new)["sources"][KEYRING] == {LAB_DISTRO: "a" * 64}
    assert rewrite(new, {KEYRING: yaml.safe_load(text)["sources"][KEYRING][LAB_DISTRO]}) == text
