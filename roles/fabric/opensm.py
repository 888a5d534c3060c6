"""The fabric's subnet manager: MLNX_OFED's opensm on the node `network.subnet_manager` names.

An InfiniBand port stays `State: Initializing` until a subnet manager sweeps the fabric and gives
it a LID (MLNX_OFED user manual, "OpenSM": "One SM must be running for each InfiniBand subnet").
unset:     nothing here: the fabric's SM runs elsewhere (a managed switch, UFM)
the node:  opensmd enabled and running (pyinfra's systemd.service: no change once it is). Its
           package comes with MLNX_OFED (mlnxofedinstall installs `opensm` with libopensm; the
           mofed role runs before this one): missing, the host stops. On a fresh node the
           installer runs in this same deploy, after the facts were read, so the package is
           checked when the step runs, not when it is planned. apt is never asked for it: the
           distribution's opensm (3.3.x) would pull in its own infiniband-diags and libraries
           over MLNX_OFED's.
the others: opensmd stopped and disabled where an earlier deploy (another subnet_manager) left
           it on; two SMs elect one master, but the named node is the one verify checks.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import systemd

from deploy.cluster import Cluster, Node
from deploy.fabric_node import OPENSM_PACKAGE, OPENSMD_UNIT
from deploy.facts.system import UnitState
from roles.shared.ops import fail


@operation()
def package_installed(node: str):
    """Stop this host unless MLNX_OFED's opensm is installed by now (nothing else installs it)."""
    stop = fail(
        f"{node} is network.subnet_manager but MLNX_OFED's {OPENSM_PACKAGE} package is not "
        "installed (mlnxofedinstall installs it with its default package set): reinstall "
        "MLNX_OFED without a reduced package set, or name another node"
    )
    query = f"dpkg-query -W -f='${{db:Status-Abbrev}}' {shlex.quote(OPENSM_PACKAGE)} 2>/dev/null"
    yield StringCommand(f'case "$({query})" in ii*) ;; *) {stop.get_raw_value()};; esac')


@deploy("Subnet manager")
def apply(cluster: Cluster, node: Node) -> None:
    manager = cluster.network.subnet_manager
    if manager is None:
        host.noop("network.subnet_manager is unset: the fabric's subnet manager runs elsewhere")
        return
    if node.hostname != manager:
        active, enabled = host.get_fact(UnitState, unit=OPENSMD_UNIT)
        if active in ("active", "activating") or enabled == "enabled":
            systemd.service(
                name=f"opensmd off here: {manager} runs the subnet manager",
                service=OPENSMD_UNIT,
                running=False,
                enabled=False,
            )
        else:
            host.noop(f"opensmd is off: {manager} runs the subnet manager")
        return
    if OPENSM_PACKAGE not in (host.get_fact(DebPackages) or {}):
        # A fresh node (MLNX_OFED is installed in this deploy) or a reduced OFED install.
        package_installed(name=f"MLNX_OFED's {OPENSM_PACKAGE} is installed", node=node.hostname)
    systemd.service(
        name="opensmd enabled and running (the fabric's subnet manager)",
        service=OPENSMD_UNIT,
        running=True,
        enabled=True,
    )
