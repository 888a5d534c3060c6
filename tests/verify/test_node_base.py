"""Per-node checks for the node base: OS, hosts, IPoIB, firewall."""

import fnmatch
import json
import shlex

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


def ipv4_of(host, names: list[str]) -> dict[str, list[str]]:
    """{name: sorted IPv4 addresses} as testinfra's `host.addr(name).ipv4_addresses` reads them
    (`getent ahostsv4`), in one command for every name: one per name is 2,000 commands at 32
    nodes."""
    script = 'for n in "$@"; do echo "== $n"; getent ahostsv4 "$n"; done; true'
    out = host.check_output(f"sh -c {shlex.quote(script)} - {' '.join(map(shlex.quote, names))}")
    found: dict[str, set[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("== "):
            current = found.setdefault(line[3:], set())
        elif line.split() and current is not None:
            current.add(line.split()[0])
    return {name: sorted(found.get(name, ())) for name in names}


def test_etc_hosts_maps_every_node(node, host_of, cluster):
    interface = cluster.network.ipoib.interface
    expected = {}
    for other in cluster.nodes:
        expected[other.hostname] = [str(other.address)]
        expected[ib_name(other.hostname, interface)] = [str(other.ipoib_address)]
    resolved = ipv4_of(host_of(node), list(expected))
    wrong = {name: got for name, got in resolved.items() if got != expected[name]}
    assert not wrong, "resolved differently from cluster.yaml: " + ", ".join(
        f"{name} -> {got or 'nothing'} (expected {expected[name][0]})" for name, got in wrong.items()
    )


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
