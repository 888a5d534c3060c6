"""Bridges, network namespaces and veth pairs: the lab's two fabrics.

Every step checks before it acts, so `up` can repair a half-built lab.
"""

import json
from pathlib import Path

from .shell import run
from .spec import LabNode, LabSpec


def _links() -> dict[str, dict]:
    return {link["ifname"]: link for link in json.loads(run("ip", "-j", "link", "show").stdout)}


def netns_list() -> set[str]:
    lines = run("ip", "netns", "list").stdout.splitlines()
    return {line.split()[0] for line in lines if line.strip()}


def _has_addr(dev: str, cidr: str, netns: str | None = None) -> bool:
    argv = ["ip", "-j"] + (["-n", netns] if netns else []) + ["addr", "show", "dev", dev]
    for entry in json.loads(run(*argv).stdout or "[]"):
        for a in entry.get("addr_info", []):
            if f"{a['local']}/{a['prefixlen']}" == cidr:
                return True
    return False


# The IB fabric's side of the emulated IPoIB links carries IPoIB connected mode's largest MTU:
# a real fabric passes whatever IPoIB MTU the deploy gives ib0 (datagram 2044 on a 2048 IB MTU,
# up to 65520 connected); a 1500-byte bridge silently dropped every larger frame (MPI's
# out-of-band messages over ib0 timed out).
FABRIC_MTU = "65520"

# The node's end of its fabric link before anything has loaded ib_ipoib. On a real server the
# IPoIB interface does not exist until that module is loaded: rdma-core's udev rules
# (kernel-boot/rdma-hw-modules.rules loads the HCA's verbs driver; ipoib comes with the
# rdma-core modules-load list) or MLNX_OFED's openibd (it loads ib_ipoib with the stack), and a
# bare Ubuntu node has neither. So the lab's link waits under a name no role looks for, down,
# and the MLNX_OFED stand-in's openibd gives it the kernel's name, ib0
# (tests/lab/standins/mofed/openibd.sh); every boot parks it again (tests/lab/supervise.py),
# as a reboot unloads the module. The alias finds the link whatever it is called at the time.
IB_PARKED = "ibparked0"
IB_ALIAS = "dtlab-fabric-port"
IB_KERNEL_NAME = "ib0"  # ib%d: the name ib_ipoib gives its first interface


def ensure_bridges(spec: LabSpec) -> None:
    links = _links()
    for bridge in (spec.bridge_mgmt, spec.bridge_ib):
        if bridge not in links:
            run("ip", "link", "add", bridge, "type", "bridge")
        run("ip", "link", "set", bridge, "up")
    run("ip", "link", "set", spec.bridge_ib, "mtu", FABRIC_MTU)
    cidr = f"{spec.controller_address}/{spec.management.prefixlen}"
    if not _has_addr(spec.bridge_mgmt, cidr):
        run("ip", "addr", "add", cidr, "dev", spec.bridge_mgmt)


def ensure_node_network(spec: LabSpec, node: LabNode) -> None:
    if node.netns not in netns_list():
        run("ip", "netns", "add", node.netns)
    links = _links()
    for host_end, peer, bridge in (
        (node.veth_mgmt, "eth0", spec.bridge_mgmt),
        (node.veth_ib, IB_PARKED, spec.bridge_ib),
    ):
        if host_end not in links:
            run("ip", "link", "add", host_end, "type", "veth", "peer", "name", peer, "netns", node.netns)
            if peer == IB_PARKED:
                run("ip", "-n", node.netns, "link", "set", IB_PARKED, "alias", IB_ALIAS)
        run("ip", "link", "set", host_end, "master", bridge, "up")
        if bridge == spec.bridge_ib:
            run("ip", "link", "set", host_end, "mtu", FABRIC_MTU)
    ns = ("ip", "-n", node.netns)
    run(*ns, "link", "set", "lo", "up")
    run(*ns, "link", "set", "eth0", "up")
    cidr = f"{node.address}/{node.prefixlen}"
    if not _has_addr("eth0", cidr, node.netns):
        run(*ns, "addr", "add", cidr, "dev", "eth0")
    # The fabric port is left parked, unconfigured and down: loading the IPoIB driver
    # (MLNX_OFED's openibd) and configuring the interface are the deploy's job.
    # dockerd needs forwarding and cannot set it from inside nspawn (read-only /proc/sys).
    run(
        "ip",
        "netns",
        "exec",
        node.netns,
        "sysctl",
        "-q",
        "-w",
        "net.ipv4.ip_forward=1",
        "net.ipv6.conf.all.forwarding=1",
    )


def remove_node_network(node: LabNode) -> None:
    links = _links()
    for host_end in (node.veth_mgmt, node.veth_ib):
        if host_end in links:
            run("ip", "link", "del", host_end)
    if node.netns in netns_list():
        run("ip", "netns", "del", node.netns)


def remove_bridges(spec: LabSpec) -> None:
    links = _links()
    for bridge in (spec.bridge_mgmt, spec.bridge_ib):
        if bridge in links:
            run("ip", "link", "del", bridge)


def netns_path(node: LabNode) -> Path:
    return Path("/run/netns") / node.netns
