"""cluster.yaml's `nodes` list: one entry per machine."""

import ipaddress
from dataclasses import dataclass
from typing import Annotated

from deploy.cluster import checks, hardware
from deploy.cluster.determined import AGENT_LAYOUTS
from deploy.cluster.hardware import Hardware
from deploy.cluster.keys import Computed, Key, Required
from deploy.cluster.network import INTERFACE_NAME

ROLES = ("master", "storage", "agent")


@dataclass(frozen=True)
class Node:
    hostname: Annotated[
        str, Key(checks.hostname, Required("the node's hostname"), "unique (case-insensitive)")
    ]
    address: Annotated[
        ipaddress.IPv4Address,
        Key(
            checks.ipv4,
            Required("the node's management address"),
            "in `network.management`, not its network or broadcast address; unique",
        ),
    ]
    ipoib_address: Annotated[
        ipaddress.IPv4Address,
        Key(
            checks.ipv4,
            Required("the node's IPoIB address"),
            "in `network.ipoib.subnet` (so never in the management network); unique, "
            "also against management addresses",
        ),
    ]
    ipoib_interface: Annotated[
        str,
        Key(
            INTERFACE_NAME,
            Computed("`network.ipoib.interface`"),
            "this node's IPoIB interface, where its name differs (like `ibp65s0`)",
        ),
    ]
    # The effective roles, in ROLES order: the declared ones plus master / storage for the
    # nodes named by master_host / storage.host.
    roles: Annotated[
        tuple[str, ...],
        Key(checks.role_list(ROLES), (), "the node's roles; see below for master and storage"),
    ]
    slots: Annotated[int | None, Key(checks.integer(1), 8, "the agent's GPU slots", agents_only=True)]
    agent_layout: Annotated[
        str | None,
        Key(
            checks.choice(AGENT_LAYOUTS),
            Computed("`determined.agent_layout`"),
            "overrides the cluster's layout for this node",
            agents_only=True,
        ),
    ]
    hardware: Annotated[
        Hardware | None,
        Key(
            hardware.node_keys,
            Computed("the cluster's `hardware`"),
            "this node's own `hardware.*` keys; a `preset` here fills what the node does not write",
            agents_only=True,
        ),
    ]

    @property
    def ipoib_name(self) -> str:
        """The node's name on the IPoIB network, in every node's /etc/hosts (roles/node/hosts.py)."""
        return f"{self.hostname}-{self.ipoib_interface}"

    def owns_agent(self, agent_id: str) -> bool:
        """Whether a Determined agent id is one the deploy gives this node: the hostname
        (agent_layout per_node) or `<hostname>-<i>` (per_domain, one per NVLink domain;
        deploy/topology.py agent_plan). Either layout's ids: a node mid-flip has both."""
        if agent_id == self.hostname:
            return True
        head, _, index = agent_id.rpartition("-")
        return head == self.hostname and index.isascii() and index.isdigit()

    def to_json(self) -> dict:
        return {
            "hostname": self.hostname,
            "address": str(self.address),
            "ipoib_address": str(self.ipoib_address),
            "ipoib_interface": self.ipoib_interface,
            "roles": list(self.roles),
            "slots": self.slots,
            "agent_layout": self.agent_layout,
        }
