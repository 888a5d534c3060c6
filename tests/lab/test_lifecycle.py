"""The lab's own lifecycle on a small second lab: up repairs, recreate blanks, down cleans.

It uses its own cluster file (two nodes on 10.77.9.0/24) so the shared lab is untouched.
"""

import os
import subprocess
from pathlib import Path

import pytest

from . import lifecycle, network, nodes, rootfs
from .paths import REPO
from .spec import load_spec

CLUSTER = (REPO / "inventories" / "lab" / "cluster.yaml").read_text()


@pytest.fixture(scope="module")
def small_lab(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    path = tmp_path_factory.mktemp("lifecycle") / "cluster.yaml"
    text = CLUSTER.replace("10.77.0.", "10.77.9.").replace("10.78.0.", "10.78.9.")
    text = text.replace("lab-master", "lc-master").replace("lab-gpu1", "lc-gpu1")
    # Two nodes are enough here.
    head, _, rest = text.partition("  - hostname: lab-gpu2")
    text = head + rest[rest.index("\nsources:") :].lstrip("\n")
    path.write_text(text)
    yield path
    lifecycle.down(path, log=lambda *_: None)


def _ssh(spec, hostname, command):
    return subprocess.run(
        nodes.ssh_argv(spec, spec.node(hostname), command),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _leftovers(spec) -> list[str]:
    found = []
    names = network.netns_list()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    for node in spec.nodes:
        if node.netns in names:
            found.append(f"netns {node.netns}")
        for ifname in (node.veth_mgmt, node.veth_ib):
            if f" {ifname}@" in links or f" {ifname}:" in links:
                found.append(f"link {ifname}")
        if rootfs.is_mounted(node.root):
            found.append(f"mount {node.root}")
        if node.dir.exists():
            found.append(f"dir {node.dir}")
        ps = subprocess.run(
            ["pgrep", "-f", f"-M {node.hostname} "], capture_output=True, text=True, check=False
        )
        if ps.stdout.strip():
            found.append(f"nspawn of {node.hostname}")
    for bridge in (spec.bridge_mgmt, spec.bridge_ib):
        if f" {bridge}:" in links:
            found.append(f"bridge {bridge}")
    return found


def test_up_boots_real_systemd_nodes_reachable_over_ssh(small_lab):
    spec = lifecycle.up(small_lab, log=lambda *_: None)
    for node in spec.nodes:
        probe = _ssh(spec, node.hostname, "hostname; ps -p 1 -o comm=; systemctl is-system-running")
        assert probe.stdout.split() == [node.hostname, "systemd", "running"], probe.stderr


def test_up_repairs_a_half_built_lab(small_lab):
    spec = load_spec(small_lab)
    a, b = spec.nodes
    # A node killed hard (its supervisor too) and another whose namespace lost its veth.
    os.kill(nodes.supervisor_pid(a), 9)
    os.kill(nodes.nspawn_pid(a), 9)
    subprocess.run(["ip", "link", "del", b.veth_ib], check=True)
    lifecycle.up(small_lab, log=lambda *_: None)
    for node in spec.nodes:
        assert nodes.is_running(node)
        # The fabric port is back, parked until MLNX_OFED's openibd names it (tests/lab/network.py).
        assert _ssh(spec, node.hostname, f"ip -br link show {network.IB_PARKED}").returncode == 0


def test_recreate_gives_a_blank_root_filesystem(small_lab):
    spec = load_spec(small_lab)
    node = spec.nodes[1]
    assert _ssh(spec, node.hostname, "touch /root/was-here").returncode == 0
    lifecycle.recreate(small_lab, node.hostname, log=lambda *_: None)
    probe = _ssh(spec, node.hostname, "test -e /root/was-here; echo $?")
    assert probe.stdout.strip() == "1"


def test_down_leaves_nothing_behind(small_lab):
    spec = load_spec(small_lab)
    lifecycle.down(small_lab, log=lambda *_: None)
    assert _leftovers(spec) == []
    assert not Path(f"/run/netns/{spec.nodes[0].netns}").exists()
