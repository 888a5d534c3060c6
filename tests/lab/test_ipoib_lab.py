"""IPoIB on the lab: the netplan node (Ubuntu's way), a per-node interface name, and a node
whose interface is missing failing alone with a message that says what it found."""

import json

import pytest
import yaml

from .conftest import LAB_CLUSTER, run_verify
from .hardware import node_packages

HEADER = "# Managed by gpu-cluster: IPoIB"


def netplan_nodes() -> list[str]:
    return [h for h, packages in node_packages(LAB_CLUSTER).items() if "netplan.io" in packages]


def ifupdown_node(lab) -> str:
    return next(n.hostname for n in lab.agents if n.hostname not in netplan_nodes())


def test_lab_has_a_netplan_node():
    assert netplan_nodes(), f"no node with `network: netplan` next to {LAB_CLUSTER}"


@pytest.mark.parametrize("hostname", netplan_nodes())
def test_netplan_node_is_configured_by_netplan(deployed, lab, lab_ssh, hostname):
    node = lab.node(hostname)
    iface = node.ipoib_interface
    conf = f"/etc/netplan/60-gpu-cluster-{iface}.yaml"
    # netplan warns about (and Ubuntu's installer never writes) a file others can read.
    assert lab_ssh(hostname, f"stat -c '%a %U' {conf}").stdout.split() == ["600", "root"]
    doc = yaml.safe_load(lab_ssh(hostname, f"cat {conf}").stdout)
    entry = doc["network"]["ethernets"][iface]
    assert entry["renderer"] == "networkd" and entry["mtu"] == lab.network.ipoib.mtu
    # The lab's ib0 is a veth (type 1): no infiniband-mode, which netplan documents for IB only.
    assert "infiniband-mode" not in entry
    # systemd-networkd runs the link from the file netplan generated, not ifupdown.
    status = lab_ssh(hostname, f"networkctl status --no-pager {iface}").stdout
    assert f"/run/systemd/network/10-netplan-{iface}.network" in status, status
    assert lab_ssh(hostname, "dpkg -s ifupdown", check=False).returncode != 0
    assert lab_ssh(hostname, f"test -e /etc/network/interfaces.d/{iface}", check=False).returncode != 0
    link = json.loads(lab_ssh(hostname, f"ip -d -j addr show dev {iface}").stdout)[0]
    assert link["mtu"] == lab.network.ipoib.mtu and link["operstate"] == "UP"
    assert [(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"] == [
        (str(node.ipoib_address), lab.network.ipoib.subnet.prefixlen)
    ]


def _copy(lab, tmp_path, hostname: str, interface: str):
    raw = yaml.safe_load(lab.path.read_text())
    for n in raw["nodes"]:
        if n["hostname"] == hostname:
            n["ipoib_interface"] = interface
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(raw, sort_keys=False))
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(cluster)!r}))\n")
    return cluster, inventory


def test_missing_interface_fails_that_node_alone(deployed, deploy, lab, tmp_path):
    node = ifupdown_node(lab)
    _, inventory = _copy(lab, tmp_path, node, "ibp65s0")
    try:
        run = deploy(inventory=inventory)
        assert run.returncode == 1, run.stderr[-4000:]
        assert run.results["failed_hosts"] == [node]
        assert (
            f"{node}: IPoIB interface ibp65s0 not found; InfiniBand interfaces on this node "
            "(/sys/class/net/*/type 32): none (is the ib_ipoib module loaded?"
        ) in run.stderr, run.stderr[-3000:]
    finally:
        restored = deploy()
    assert restored.returncode == 0, restored.stderr[-4000:]


def _managed(lab_ssh, node: str, stack: str) -> list[str]:
    directory = "/etc/netplan" if stack == "netplan" else "/etc/network/interfaces.d"
    return lab_ssh(node, f"ls {directory}").stdout.split()


@pytest.mark.parametrize("stack", ["ifupdown", "netplan"])
def test_port_named_otherwise_is_configured_by_its_node_name(deployed, deploy, lab, lab_ssh, tmp_path, stack):
    """A node whose port is ibp65s0 (the kernel's name on many real hosts): its ipoib_interface
    names it, the deploy configures it, drops the file for the old name (a stale ifupdown
    stanza fails `ifup -a` at boot) and every /etc/hosts maps <host>-ibp65s0."""
    node = netplan_nodes()[0] if stack == "netplan" else ifupdown_node(lab)
    old, new = (
        ("60-gpu-cluster-ib0.yaml", "60-gpu-cluster-ibp65s0.yaml")
        if stack == "netplan"
        else ("ib0", "ibp65s0")
    )
    cluster, inventory = _copy(lab, tmp_path, node, "ibp65s0")
    lab_ssh(node, "ifdown --force ib0 2>/dev/null; ip link set ib0 down && ip link set ib0 name ibp65s0")
    try:
        run = deploy(inventory=inventory)
        assert run.returncode == 0, run.stderr[-4000:]
        address = str(lab.node(node).ipoib_address)
        assert address in lab_ssh(node, "ip -br addr show ibp65s0").stdout
        for other in lab.nodes:
            assert f"{address}\t{node}-ibp65s0" in lab_ssh(other.hostname, "cat /etc/hosts").stdout
        assert _managed(lab_ssh, node, stack) == [new]
        verify = run_verify("-k", "ipoib or etc_hosts", cluster=cluster)
        assert verify.returncode == 0, verify.stdout[-4000:]
    finally:
        lab_ssh(
            node,
            "ifdown --force ibp65s0 2>/dev/null; ip link set ibp65s0 down && ip link set ibp65s0 name ib0",
            check=False,
        )
        restored = deploy()
    assert restored.returncode == 0, restored.stderr[-4000:]
    assert f"{node}-ib0" in lab_ssh(node, "cat /etc/hosts").stdout
    assert _managed(lab_ssh, node, stack) == [old]
    assert f"{lab.node(node).ipoib_address}/" in lab_ssh(node, "ip -br addr show ib0").stdout
