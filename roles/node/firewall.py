"""No firewall between nodes: ufw off for good, iptables/ip6tables empty with ACCEPT policies.

`ufw disable` alone leaves its empty chains behind (the article's `iptables -L -n` check
would still show them), so the tables are flushed and the chains deleted too.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FindInFile
from pyinfra.facts.systemd import SystemdEnabled
from pyinfra.operations import files, server, systemd

from deploy.cluster import Cluster, Node
from deploy.facts.system import FirewallRules
from deploy.iptables import foreign_rules
from roles.shared.ops import packages

TABLES = ("filter", "nat", "mangle", "raw")


def flush_commands(tool: str) -> list[str]:
    cmds = []
    for table in TABLES:
        cmds += [f"{tool} -t {table} -F", f"{tool} -t {table} -X"]
    cmds += [f"{tool} -P {chain} ACCEPT" for chain in ("INPUT", "FORWARD", "OUTPUT")]
    return cmds


@deploy("Firewall off")
def apply(cluster: Cluster, node: Node) -> None:
    packages(["iptables"], "iptables (for the checks)")
    if host.get_fact(FindInFile, path="/etc/ufw/ufw.conf", pattern="^ENABLED=yes"):
        server.shell(name="Disable ufw (also at boot)", commands=["ufw --force disable"])
    for unit in ("firewalld.service", "netfilter-persistent.service"):
        if host.get_fact(SystemdEnabled, services=[unit]).get(unit):  # not all units: 80 ms
            systemd.service(name=f"Stop {unit}", service=unit, running=False, enabled=False)
    for saved in ("/etc/iptables/rules.v4", "/etc/iptables/rules.v6"):
        files.file(name=f"No saved rules in {saved}", path=saved, present=False)

    dumps = host.get_fact(FirewallRules)
    dirty = [tool for tool, dump in dumps.items() if foreign_rules(dump)]
    if dirty:
        commands = [c for tool in dirty for c in flush_commands(tool)]
        # dockerd recreates its own NAT chains, which the flush removed.
        commands.append("if systemctl is-active -q docker; then systemctl restart docker; fi")
        server.shell(name="Flush firewall rules and chains", commands=commands)
