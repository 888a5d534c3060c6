"""The Determined agent(s) on each agent node (after roles/determined/docker: the units require Docker).

The node's `agent_layout` (cluster.yaml) picks how its GPUs are offered (docs/topology.md):

per_node    one agent, the package's determined-agent.service with /etc/determined/agent.yaml,
            agent_id = hostname, every GPU. This module.
per_domain  one agent per NVLink domain, determined-agent@<i>.service: roles/determined/domains.py.
            agent.yaml then holds no master_host, so starting the package's plain unit by
            mistake fails instead of offering the GPUs twice.

configure: agent.yaml (per_node: from agent.yaml.j2; per_domain: agent.per_domain.yaml), a
           unit drop-in and with determined.tls the master's CA (roles/determined/tls.py),
           written BEFORE the package (its postinst restarts an enabled agent; dpkg keeps an
           existing conffile)
install:   determined-agent <version> from sources.determined_agent, sha256-verified;
           skipped when that version is installed
activate:  per_node: every determined-agent@ instance stopped and disabled, its config and
           the template removed; then the plain unit enabled and running, restarted only when
           agent.yaml, its drop-in or the master's CA changed and the package did not.
           per_domain: see roles/determined/domains.py.
           Stale agents are stopped before new ones start, so no GPU is offered twice.
           The drop-in (and the same lines in the template) lift systemd's start limit: an
           agent started before its master is reachable keeps retrying every 5 s.

guard:     while the master runs trials on a per_node agent (deploy/training.py), a change that
           restarts the agent (agent.yaml, its drop-in, another determined-agent version)
           stops the host before anything is written: a new agent process takes no running
           container with it unless the pool reattaches them (Determined's master hands a
           restarted agent ContainersToReattach only with agent_reattach_enabled, which
           master.yaml does not set: master/internal/agent/agent.go), so its trials end.
           Not guarded: the master's CA (determined.tls on or off, or a new CA) and the
           per_domain units (roles/determined/domains.py).

A stopped agent closes its connection; the master lists it as disabled for the resource
pool's agent_reconnect_wait (25 s by default) and then drops it. Registration with the master
is checked by tests/verify/test_determined.py and tests/verify/test_topology_agents.py.
"""

from __future__ import annotations

import hashlib
import io

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files, systemd

from deploy.cluster import Cluster, Node
from deploy.training import IDLE, Busy
from roles.determined import domains as determined_domains
from roles.determined import tls as determined_tls
from roles.determined.common import CONFIG_DIR, agent_config, install_determined
from roles.shared.ops import fail, packages
from roles.shared.templates import files_path

AGENT_YAML = f"{CONFIG_DIR}/agent.yaml"
DROP_IN = "/etc/systemd/system/determined-agent.service.d/10-restart.conf"
SERVICE = "determined-agent.service"


def agent_yaml(cluster: Cluster, node: Node) -> str:
    """/etc/determined/agent.yaml, the package unit's config: the node's one agent
    (agent_layout per_node: id = hostname, no visible_gpus: every GPU nvidia-smi lists), or
    on a per_domain node a file without master_host (see files/determined/)."""
    if node.agent_layout == "per_domain":
        return files_path("determined/agent.per_domain.yaml").read_text()
    return agent_config(cluster, node.hostname, None, AGENT_YAML)


@operation()
def agent_kept(wanted: dict[str, str], version: str, refusal: str):
    """Stop this host if the agent would restart now: a file in `wanted` ({path: content})
    differs from what the node has (by sha1, as files.put compares), or determined-agent
    `version` is not installed. `refusal` names the trials; "{what}" in it becomes the cause."""
    what = [path for path, text in wanted.items() if host.get_fact(Sha1File, path=path) != _sha1(text)]
    if version not in host.get_fact(DebPackages).get("determined-agent", ()):
        what.append(f"determined-agent {version}")
    if not what:
        host.noop("the agent's configuration and version stay: it keeps its containers")
        return
    yield fail(refusal.replace("{what}", ", ".join(what)))


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


@deploy("Determined agent")
def apply(cluster: Cluster, node: Node, busy: Busy = IDLE) -> None:
    per_domain = node.agent_layout == "per_domain"

    packages(["curl", "ca-certificates"], "download tools")
    if busy.guarded and not per_domain:
        agent_kept(
            name="The agent is not restarted while trials run here",
            wanted={
                AGENT_YAML: agent_yaml(cluster, node),
                DROP_IN: files_path("determined/agent-10-restart.conf").read_text(),
            },
            version=cluster.determined.version,
            refusal=busy.refusal("restarting the agent for a changed {what}"),
        )

    # configure (before the package: see the module docstring)
    files.directory(name=CONFIG_DIR, path=CONFIG_DIR, user="root", group="root", mode="755")
    config = files.put(
        name=(
            f"{AGENT_YAML}: unused on a per_domain node (no master_host)"
            if per_domain
            else f"Agent configuration {AGENT_YAML}"
        ),
        src=io.StringIO(agent_yaml(cluster, node)),
        dest=AGENT_YAML,
        user="root",
        group="root",
        mode="644",
    )
    drop_in = files.put(
        name="Agent unit drop-in: keep retrying until the master answers",
        src=str(files_path("determined/agent-10-restart.conf")),
        dest=DROP_IN,
        user="root",
        group="root",
        mode="644",
    )
    ca = determined_tls.agent_files(cluster)

    # install
    package = install_determined(cluster, "agent")

    # activate
    if per_domain:
        determined_domains.activate(cluster, node, SERVICE, package, ca)
        return

    determined_domains.remove_all()
    systemd.service(
        name="Restart the agent for its new configuration",
        service=SERVICE,
        running=True,
        restarted=True,
        daemon_reload=True,
        _if=lambda: any(op.did_change() for op in (config, drop_in, *ca)) and not package.did_change(),
    )
    systemd.service(name="Agent enabled and running", service=SERVICE, running=True, enabled=True)
