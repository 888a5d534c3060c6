"""Per-node checks for the node base: OS, hosts, IPoIB, firewall."""

import fnmatch
import json
import shlex

from deploy.iptables import foreign_rules
from tests.verify.matrix import P_SEEN


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
    expected = {}
    for other in cluster.nodes:
        expected[other.hostname] = [str(other.address)]
        expected[other.ipoib_name] = [str(other.ipoib_address)]
    resolved = ipv4_of(host_of(node), list(expected))
    wrong = {name: got for name, got in resolved.items() if got != expected[name]}
    assert not wrong, "resolved differently from cluster.yaml: " + ", ".join(
        f"{name} -> {got or 'nothing'} (expected {expected[name][0]})" for name, got in wrong.items()
    )


def test_ipoib_interface_static_and_up(node, host_of, cluster, record_property):
    """The node's own IPoIB interface (nodes[].ipoib_interface): every message names it, and the
    matrix lists it per node (P_SEEN) so a renamed port shows even when green."""
    h = host_of(node)
    ib, name = cluster.network.ipoib, node.ipoib_interface
    seen = {"what": "IPoIB interface", "node": node.hostname, "value": name}
    record_property(P_SEEN, json.dumps(seen))
    iface = h.interface(name)
    assert iface.exists, f"{name}: no such interface on {node.hostname}"
    assert f"{node.ipoib_address}" in iface.addresses, f"{name}: {node.ipoib_address} missing"
    link = json.loads(h.check_output(f"ip -j link show dev {shlex.quote(name)}"))[0]
    assert link["operstate"] == "UP", f"{name}: {link['operstate']}"
    assert link["mtu"] == ib.mtu, f"{name}: MTU {link['mtu']}, expected {ib.mtu}"
    method = "netplan" if h.exists("netplan") else "ifupdown"
    seen["value"] = f"{name} {node.ipoib_address} mtu {link['mtu']} ({method})"
    record_property(P_SEEN, json.dumps(seen))
    # Only an InfiniBand link (type 32) has a mode (the lab's stand-in is a veth).
    mode = h.file(f"/sys/class/net/{name}/mode")
    if link.get("link_type") == "infiniband" and mode.exists:
        assert mode.content_string.strip() == ib.mode, f"{name}: mode {mode.content_string.strip()}"


def test_no_firewall_rules(node, host_of):
    h = host_of(node)
    for tool in ("iptables", "ip6tables"):
        dump = h.check_output(f"{tool}-save").splitlines()
        assert foreign_rules(dump) == [], f"{tool}: firewall rules present"


def test_ufw_disabled(node, host_of):
    conf = host_of(node).file("/etc/ufw/ufw.conf")
    assert not conf.exists or "ENABLED=yes" not in conf.content_string
