"""IPoIB: a static address on the node's IPoIB interface, written the way its network stack
expects: netplan where the node has netplan (Ubuntu's way), ifupdown otherwise.

The interface is found by name (the node's `ipoib_interface`, else `network.ipoib.interface`),
the way netplan and ifupdown match it. A match by driver would be ambiguous on GPU servers with
one HCA per GPU pair (every port is ib_ipoib), and a port GUID changes with the card and must
be collected per node anyway. A node without that interface fails here, naming the InfiniBand
interfaces it does have, instead of passing until verify finds no address.

This role runs after MLNX_OFED's (deploy/site.py): the IPoIB interface exists only once
ib_ipoib is loaded, which on a bare Ubuntu node without rdma-core nothing does until
MLNX_OFED's openibd loads the stack (its openib.conf: IPOIB_LOAD=yes). On a node's first
deploy the interface is therefore missing while pyinfra plans (facts are read before any
operation runs), and appears when the MLNX_OFED role's install has run: then one operation,
`configure_when_present`, looks again when it runs and writes and applies the same file the
planned path writes, so the next deploy finds it in place and changes nothing.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files, server
from pyinfra.operations.util import any_changed

from deploy.cluster import Cluster, Node
from deploy.facts.system import ManagedFiles, NetDevice, NetLinkTypes, NetplanFeatures
from roles.shared.ops import fail, packages
from roles.shared.templates import render

# include/uapi/linux/if_arp.h: the link type the IPoIB driver gives its interfaces.
ARPHRD_INFINIBAND = 32
NETPLAN_DIR = "/etc/netplan"
IFUPDOWN_DIR = "/etc/network/interfaces.d"
# The first line of every file this role writes (files/fabric/*.j2).
HEADER = "# Managed by gpu-cluster: IPoIB, static (no DHCP on the fabric)"


def missing_message(node: Node, links: dict[str, int]) -> str:
    """Why the node fails when its IPoIB interface does not exist."""
    ib = sorted(name for name, kind in links.items() if kind == ARPHRD_INFINIBAND)
    have = ", ".join(ib) if ib else "none (is the ib_ipoib module loaded? `lsmod | grep ib_ipoib`)"
    return (
        f"{node.hostname}: IPoIB interface {node.ipoib_interface} not found; InfiniBand "
        f"interfaces on this node (/sys/class/net/*/type 32): {have}; name the right one in "
        f"cluster.yaml as ipoib_interface of node {node.hostname}"
    )


@operation()
def interface_present(node: Node, links: dict[str, int]):
    """Stop this host, saying what it has, unless its IPoIB interface exists."""
    if node.ipoib_interface in links:
        host.noop(f"{node.ipoib_interface} exists")
        return
    yield fail(missing_message(node, links))


def ib_mode(cluster: Cluster, link_type: int | None, netplan_features: list[str] | None) -> str | None:
    """The mode to write, or None to leave the kernel's: only an InfiniBand link has one (the
    lab's stand-in is a veth), and only a netplan that knows `infiniband-mode` may be told."""
    if link_type != ARPHRD_INFINIBAND:
        return None
    if netplan_features is not None and "infiniband" not in netplan_features:
        return None
    return cluster.network.ipoib.mode


def netplan_doc(interface: str, cidr: str, mtu: int, mode: str | None) -> str:
    return render("fabric/netplan.yaml.j2", interface=interface, cidr=cidr, mtu=mtu, mode=mode)


def ifupdown_stanza(interface: str, cidr: str, mtu: int, mode: str | None) -> str:
    return render("fabric/ifupdown.j2", interface=interface, cidr=cidr, mtu=mtu, mode=mode)


def netplan_path(interface: str) -> str:
    return f"{NETPLAN_DIR}/60-gpu-cluster-{interface}.yaml"


def ifupdown_path(interface: str) -> str:
    return f"{IFUPDOWN_DIR}/{interface}"


def stale_files(directory: str, keep: str) -> list[str]:
    """This role's files for another interface (the node's port was renamed, or its
    ipoib_interface corrected): a stale ifupdown stanza fails `ifup -a` at boot."""
    return [p for p in host.get_fact(ManagedFiles, directory=directory, header=HEADER) if p != keep]


def drop_stale(directory: str, keep: str) -> list:
    return [
        files.file(name=f"No stale {path}", path=path, present=False) for path in stale_files(directory, keep)
    ]


def netplan_apply(interface: str) -> str:
    # What `netplan apply` does for networkd, for this link alone: apply would also reconfigure
    # every other networkd link (the management one this SSH session runs over) and re-trigger
    # udev for all of them (`udevadm trigger` fails where /sys is read-only, as in a container).
    # The file renames nothing, and networkd sets the MTU from the .network file itself.
    return (
        "netplan generate && systemctl daemon-reload && systemctl start systemd-networkd.service "
        f"&& networkctl reload && networkctl reconfigure {interface}"
    )


def ifup(interface: str) -> str:
    return f"ifdown --force {interface} 2>/dev/null; ip addr flush dev {interface}; ifup {interface}"


@deploy("IPoIB")
def apply(cluster: Cluster, node: Node) -> None:
    ib = cluster.network.ipoib
    interface = node.ipoib_interface
    links = host.get_fact(NetLinkTypes)
    features = host.get_fact(NetplanFeatures)
    cidr = f"{node.ipoib_address}/{ib.subnet.prefixlen}"
    if interface not in links:
        # Not there while the plan is made: the MLNX_OFED role before this one may be about to
        # load ib_ipoib (a first deploy). Decide when the step runs, not now.
        if features is None:
            _ifupdown_base()
        configure_when_present(
            name=f"IPoIB interface {interface} present and configured",
            cluster=cluster,
            node=node,
            netplan=features is not None,
        )
        return
    interface_present(name=f"IPoIB interface {interface} present", node=node, links=links)

    current = host.get_fact(NetDevice, interface=interface)
    in_place = current["up"] and current["addresses"] == [cidr] and current["mtu"] == ib.mtu
    # Known drift is an unconditional step (no _if), so a dry run shows it as a change.
    if features is not None:
        _netplan(interface, cidr, ib.mtu, ib_mode(cluster, links[interface], features), in_place)
    else:
        _ifupdown(interface, cidr, ib.mtu, ib_mode(cluster, links[interface], None), in_place)


@operation()
def configure_when_present(cluster: Cluster, node: Node, netplan: bool):
    """The interface's file and its activation, decided from the node as this step runs.

    For an interface that did not exist while the deploy was planned (see the module's
    docstring): the same file as the planned path (netplan_doc / ifupdown_stanza, the mode
    from the link type found now), always applied, since nothing configured it before.
    """
    interface = node.ipoib_interface
    links = host.get_fact(NetLinkTypes)
    if interface not in links:
        yield fail(missing_message(node, links))
        return
    ib = cluster.network.ipoib
    cidr = f"{node.ipoib_address}/{ib.subnet.prefixlen}"
    if netplan:
        mode = ib_mode(cluster, links[interface], host.get_fact(NetplanFeatures))
        directory, dest, file_mode = NETPLAN_DIR, netplan_path(interface), "600"
        text, activate = netplan_doc(interface, cidr, ib.mtu, mode), netplan_apply(interface)
    else:
        mode = ib_mode(cluster, links[interface], None)
        directory, dest, file_mode = IFUPDOWN_DIR, ifupdown_path(interface), "644"
        text, activate = ifupdown_stanza(interface, cidr, ib.mtu, mode), ifup(interface)
    for path in stale_files(directory, dest):
        yield from files.file._inner(path=path, present=False)
    yield from files.put._inner(src=StringIO(text), dest=dest, mode=file_mode)
    yield activate


def _netplan(interface: str, cidr: str, mtu: int, mode: str | None, in_place: bool) -> None:
    dest = netplan_path(interface)
    stale = drop_stale(NETPLAN_DIR, dest)
    # netplan warns that a world-readable file may hold secrets; 0600 is what it writes itself.
    conf = files.put(
        name=f"{interface} in netplan",
        src=StringIO(netplan_doc(interface, cidr, mtu, mode)),
        dest=dest,
        mode="600",
    )
    server.shell(
        name=f"Apply netplan to {interface}",
        commands=[netplan_apply(interface)],
        _if=[any_changed(conf, *stale)] if in_place else [],
    )


def _ifupdown_base() -> None:
    packages(["ifupdown"], "ifupdown")
    files.line(
        name="interfaces sources interfaces.d",
        path="/etc/network/interfaces",
        line=r"^source /etc/network/interfaces.d/\*",
        replace="source /etc/network/interfaces.d/*",
    )


def _ifupdown(interface: str, cidr: str, mtu: int, mode: str | None, in_place: bool) -> None:
    _ifupdown_base()
    dest = ifupdown_path(interface)
    drop_stale(IFUPDOWN_DIR, dest)
    conf = files.put(
        name=f"{interface} in ifupdown",
        src=StringIO(ifupdown_stanza(interface, cidr, mtu, mode)),
        dest=dest,
        mode="644",
    )
    server.shell(
        name=f"Bring {interface} up",
        commands=[ifup(interface)],
        _if=[conf.did_change] if in_place else [],
    )
