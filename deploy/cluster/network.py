"""cluster.yaml's `network` section: the management network and the IPoIB fabric."""

import ipaddress
from dataclasses import dataclass
from typing import Annotated

from deploy.cluster import checks
from deploy.cluster.keys import Key, Required, Section

IPOIB_MODES = ("datagram", "connected")


# Linux caps interface names at 15 bytes (IFNAMSIZ 16); the characters are those a shell
# word and a YAML key carry unquoted.
INTERFACE_NAME = checks.matching(
    r"[A-Za-z0-9_.-]{1,15}",
    "a network interface name (1-15 characters)",
    rule="interface name, 1-15 characters",
)


@dataclass(frozen=True)
class IpoibNetwork:
    interface: Annotated[
        str,
        Key(
            INTERFACE_NAME,
            "ib0",
            "the IPoIB interface; a node's `ipoib_interface` overrides it",
        ),
    ]
    subnet: Annotated[
        ipaddress.IPv4Network,
        Key(
            checks.cidr,
            Required("the IPoIB subnet, like '10.10.0.0/24'"),
            "the IPoIB network; must not overlap `network.management`",
        ),
    ]
    mtu: Annotated[
        int,
        Key(
            checks.integer(576, 65520),
            2044,
            "2044 suits datagram mode on a 2K fabric; `datagram` allows up to 4092, `connected` 65520",
        ),
    ]
    # The kernel's two IPoIB transports (Documentation/infiniband/ipoib.rst).
    mode: Annotated[
        str,
        Key(
            checks.choice(IPOIB_MODES),
            "datagram",
            "the IPoIB mode set on InfiniBand links; ConnectX-4 and later (enhanced IPoIB) "
            "support `datagram` only",
        ),
    ]


@dataclass(frozen=True)
class Network:
    management: Annotated[
        ipaddress.IPv4Network,
        Key(
            checks.cidr,
            Required("the management subnet, like '10.0.0.0/24'"),
            "the network pyinfra reaches the nodes on",
        ),
    ]
    ipoib: Annotated[IpoibNetwork, Section(required="at least its subnet")]
    # NCCL_IB_HCA's syntax (NCCL's environment-variable docs): `^` excludes, `=` exact names,
    # else prefixes; each HCA with an optional `:port`.
    nccl_ib_hca: Annotated[
        str | None,
        Key(
            checks.matching(
                r"\^?=?[A-Za-z0-9_]+(:[0-9]+)?(,[A-Za-z0-9_]+(:[0-9]+)?)*", "like mlx5_0:1,mlx5_1:1"
            ),
            None,
            "NCCL_IB_HCA for every trial (the fabric's HCAs, not a storage one); unset: NCCL uses every HCA",
        ),
    ]
    # One InfiniBand subnet needs one master SM (MLNX_OFED user manual, "OpenSM"); unset: the
    # switch or UFM runs it. Every node is on the fabric (each has an ipoib_address).
    subnet_manager: Annotated[
        str | None,
        Key(
            checks.hostname,
            None,
            "hostname of a declared node that runs MLNX_OFED's opensm (opensmd); unset: the "
            "fabric's subnet manager runs elsewhere (a managed switch, UFM)",
        ),
    ]
