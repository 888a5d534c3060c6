"""The Determined agent on each agent node (after roles/docker: the unit requires Docker).

configure: /etc/determined/agent.yaml from files/determined/agent.yaml.j2 and a unit drop-in,
           written BEFORE the package for the same reason as the master's (its postinst
           restarts an enabled agent; dpkg keeps an existing conffile)
install:   determined-agent <version> from sources.determined_agent, sha256-verified;
           skipped when that version is installed
activate:  enabled and running; restarted only when agent.yaml or its unit drop-in changed and
           the package did not. The drop-in lifts systemd's start limit: an agent started
           before its master is reachable (or left behind by a master restart) keeps retrying
           every 5 s instead of failing for good after five quick exits.

Registration with the master (GET /api/v1/agents, slots per agent) is checked by
tests/verify/test_determined.py.
"""

from __future__ import annotations

import io
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

from deploy.cluster import Cluster, Node
from roles.determined_master import CONFIG_DIR, render
from roles.shared_ops import packages, verified_deb

FILES = Path(__file__).resolve().parent.parent / "files" / "determined"
AGENT_YAML = f"{CONFIG_DIR}/agent.yaml"
DROP_IN = "/etc/systemd/system/determined-agent.service.d/10-restart.conf"
SERVICE = "determined-agent.service"


def layout_problem(node: Node) -> str | None:
    if node.agent_layout == "per_node":
        return None
    # One agent per NVLink domain needs the GPU topology (nvidia-smi topo -m) read when the
    # driver is in place, one config and one unit per agent: not written yet.
    return (f"{node.hostname}: agent_layout {node.agent_layout!r} is not implemented yet; "
            "use per_node in cluster.yaml")


def agent_yaml(cluster: Cluster, node: Node) -> str:
    problem = layout_problem(node)
    if problem:
        raise NotImplementedError(problem)
    determined = cluster.determined
    return render(
        "agent.yaml.j2",
        master_host=cluster.master_host,
        master_port=cluster.master_port,
        container_master_host=str(cluster.master_node.address),
        agent_id=node.hostname,
        resource_pool=determined.resource_pool,
        slot_type=determined.slot_type,
    )


@deploy("Determined agent")
def apply():
    cluster: Cluster = host.data.cluster
    node: Node = host.data.node
    version = cluster.determined.version
    source = cluster.sources.determined_agent
    problem = layout_problem(node)
    if problem:
        # Fails this host only, with the reason, instead of aborting the whole plan.
        server.shell(name="Agent layout", commands=[f"echo {shlex.quote(problem)} >&2; exit 1"])
        return

    packages(["curl", "ca-certificates"], "download tools")

    # configure (before the package: see the module docstring)
    files.directory(name=CONFIG_DIR, path=CONFIG_DIR, user="root", group="root", mode="755")
    config = files.put(name=f"Agent configuration {AGENT_YAML}",
                       src=io.StringIO(agent_yaml(cluster, node)), dest=AGENT_YAML,
                       user="root", group="root", mode="644")
    drop_in = files.put(name="Agent unit drop-in: keep retrying until the master answers",
                        src=str(FILES / "agent-10-restart.conf"), dest=DROP_IN,
                        user="root", group="root", mode="644")

    # install
    package = verified_deb(
        name=f"Install determined-agent {version} (sha256-pinned)",
        package="determined-agent", version=version,
        url=cluster.sources.determined_url("agent", version), sha256=source.sha256,
        artifact=f"determined-agent {version} package",
    )

    # activate
    systemd.service(name="Restart the agent for its new configuration", service=SERVICE,
                    running=True, restarted=True, daemon_reload=True,
                    _if=lambda: (config.did_change() or drop_in.did_change())
                    and not package.did_change())
    systemd.service(name="Agent enabled and running", service=SERVICE,
                    running=True, enabled=True)
