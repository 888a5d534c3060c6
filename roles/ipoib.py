"""IPoIB: a static address on ib0, written the way the node's network stack expects."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import Directory, FindFiles
from pyinfra.operations import apt, files, server

from deploy.cluster import Cluster, Node
from deploy.facts.system import NetDevice


def ifupdown_stanza(interface: str, cidr: str, mtu: int) -> str:
    return (
        f"# Managed by gpu-cluster: IPoIB, static (no DHCP on the fabric)\n"
        f"auto {interface}\n"
        f"iface {interface} inet static\n"
        f"    address {cidr}\n"
        f"    mtu {mtu}\n"
    )


def netplan_doc(interface: str, cidr: str, mtu: int) -> str:
    return (
        "# Managed by gpu-cluster: IPoIB, static (no DHCP on the fabric)\n"
        "network:\n"
        "  version: 2\n"
        "  ethernets:\n"
        f"    {interface}:\n"
        "      dhcp4: false\n"
        f"      addresses: [{cidr}]\n"
        f"      mtu: {mtu}\n"
    )


def uses_netplan() -> bool:
    if not host.get_fact(Directory, path="/etc/netplan"):
        return False
    return bool(host.get_fact(FindFiles, path="/etc/netplan", quote_path=True))


@deploy("IPoIB")
def apply(cluster: Cluster, node: Node) -> None:
    ib = cluster.network.ipoib
    cidr = f"{node.ipoib_address}/{ib.subnet.prefixlen}"
    current = host.get_fact(NetDevice, interface=ib.interface)
    in_place = current["up"] and current["addresses"] == [cidr] and current["mtu"] == ib.mtu
    # Known drift is an unconditional step (no _if), so a dry run shows it as a change.

    if uses_netplan():
        conf = files.put(
            name=f"{ib.interface} in netplan",
            src=StringIO(netplan_doc(ib.interface, cidr, ib.mtu)),
            dest=f"/etc/netplan/60-gpu-cluster-{ib.interface}.yaml",
            mode="600",
        )
        server.shell(
            name="Apply netplan", commands=["netplan apply"], _if=[conf.did_change] if in_place else []
        )
        return

    apt.packages(name="ifupdown", packages=["ifupdown"], update=True, cache_time=3600)
    files.line(
        name="interfaces sources interfaces.d",
        path="/etc/network/interfaces",
        line=r"^source /etc/network/interfaces.d/\*",
        replace="source /etc/network/interfaces.d/*",
    )
    conf = files.put(
        name=f"{ib.interface} in ifupdown",
        src=StringIO(ifupdown_stanza(ib.interface, cidr, ib.mtu)),
        dest=f"/etc/network/interfaces.d/{ib.interface}",
        mode="644",
    )
    server.shell(
        name=f"Bring {ib.interface} up",
        commands=[
            f"ifdown --force {ib.interface} 2>/dev/null; ip addr flush dev {ib.interface}; "
            f"ifup {ib.interface}"
        ],
        _if=[conf.did_change] if in_place else [],
    )
