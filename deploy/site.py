"""The ordered plan: the article's checklist, one role per line.

Reordering or skipping a role is a one-line change here. Roles on the master come before
the agents' so that the master is up when the agents register.
"""

import importlib

from pyinfra import host

ALL, MASTER, STORAGE, AGENTS = None, "master", "storage", "agent"

PLAN = (
    ("preflight", ALL),
    ("apt_proxy", ALL),
    ("hosts", ALL),
    ("ipoib", ALL),
    ("firewall", ALL),
    ("nvidia_driver", AGENTS),
    ("cuda", AGENTS),
    ("nccl", AGENTS),
    ("mofed", ALL),
    ("minio", STORAGE),
    ("postgresql", MASTER),
    ("determined_master", MASTER),
    ("docker", AGENTS),
    ("determined_agent", AGENTS),
)


def roles_for(node_roles, plan=PLAN) -> list[str]:
    return [name for name, role in plan if role is None or role in node_roles]


def run(plan=PLAN) -> None:
    for name in roles_for(host.data.node.roles, plan):
        importlib.import_module(f"roles.{name}").apply()
