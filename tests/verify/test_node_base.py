"""Per-node checks for the node base: OS, hosts, IPoIB, firewall."""

import fnmatch
import json

from deploy.firewall import foreign_rules
from roles.hosts import ib_name


def test_os_and_kernel_allowed(node, host_of, cluster):
    h = host_of(node)
    label = f"{h.system_info.distribution.capitalize()} {h.system_info.release}"
    allowed = dict(cluster.preflight.allowed_os)
    assert label in allowed, f"{label} not in {list(allowed)}"
    kernel = h.check_output("uname -r")
    assert any(fnmatch.fnmatchcase(kernel, p) for p in allowed[label]), kernel


def test_hostname(node, host_of):
    assert host_of(node).check_output("hostname") == node.hostname


def test_etc_hosts_maps_every_node(node, host_of, cluster):
    h = host_of(node)
    interface = cluster.network.ipoib.interface
    for other in cluster.nodes:
        assert h.addr(other.hostname).ipv4_addresses == [str(other.address)]
        assert h.addr(ib_name(other.hostname, interface)).ipv4_addresses == [str(other.ipoib_address)]


def test_ipoib_interface_static_and_up(node, host_of, cluster):
    h = host_of(node)
    ib = cluster.network.ipoib
    iface = h.interface(ib.interface)
    assert iface.exists
    assert f"{node.ipoib_address}" in iface.addresses
    link = json.loads(h.check_output(f"ip -j link show dev {ib.interface}"))[0]
    assert link["operstate"] == "UP"
    assert link["mtu"] == ib.mtu


def test_no_firewall_rules(node, host_of):
    h = host_of(node)
    for tool in ("iptables", "ip6tables"):
        dump = h.check_output(f"{tool}-save").splitlines()
        assert foreign_rules(dump) == [], f"{tool}: firewall rules present"


def test_ufw_disabled(node, host_of):
    conf = host_of(node).file("/etc/ufw/ufw.conf")
    assert not conf.exists or "ENABLED=yes" not in conf.content_string
