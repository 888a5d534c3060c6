"""Rebuild one node: `python -m deploy rebuild --cluster FILE NODE [pyinfra options]`
(deploy/cli.py: the inventory is the one beside FILE, or generated). The old form
`python -m deploy.rebuild INVENTORY NODE [pyinfra options]` is an alias, for one release.

The node may be a blank reinstall (the dead server back from the vendor) or a working node
being reinstalled. The command
0. asks the master what runs on the node's agents (GET /api/v1/tasks): a node that trains is
   alive, and the rebuild stops there (exit status 5) naming the trials, unless --force; drain
   the node first and nothing runs;
1. takes the node's Determined agents out of scheduling on the master (POST
   /api/v1/agents/{id}/disable with an admin token), so no trial is placed on it while the
   deploy restarts its agent; an agent the master already lost (dead node) needs nothing;
2. runs `pyinfra -y INVENTORY deploy.py --limit NODE [pyinfra options]` from the repository;
3. waits until the node's agents are registered again, enables them (POST .../enable) and
   confirms they are enabled. For the master node it waits for the master's /health and for
   every agent node to be registered again (the agents reconnect on their own).
Other nodes are not touched. If the deploy fails the agents stay disabled: fix the cause and
run the same command again.

Options other than --timeout go to pyinfra (e.g. -v, --json: this command's own messages go
to stderr, so stdout stays pyinfra's). The admin login is `admin` with
determined.admin_password from cluster.yaml; DET_USER / DET_PASS override it, as for the
`det` CLI, when the master's admin password is not (yet) determined.admin_password (a deploy
of the master sets it). Exit status: pyinfra's when
the deploy fails, 3 when the deploy passed but the agents were not confirmed, 4 when the
master refuses the login (HTTP 401/403: nothing was deployed, or the agents were not
confirmed), 5 when the node still runs trials and --force was not given, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from deploy import master_http, training
from deploy.cluster import Cluster, Node
from deploy.summary import redact_argv

REPO = Path(__file__).resolve().parent.parent
NOT_CONFIRMED = 3
PROG = "python -m deploy.rebuild"


def say(message: str) -> None:
    print(f"--> rebuild: {message}", file=sys.stderr, flush=True)


class MasterError(Exception):
    """The master did not answer, or answered with an error."""


class MasterRefused(Exception):
    """HTTP 401/403: the master answers but refuses our login. Not a MasterError, which the
    waits below take for "not back yet": going on would wait out every timeout, then leave
    the node's agents disabled."""


REFUSED = 4  # exit status
BUSY = 5  # exit status: the node trains, and --force was not given


class Master:
    """The few REST calls a rebuild needs (Determined 0.38's /api/v1)."""

    def __init__(self, cluster: Cluster, timeout: float = 10):
        self.url = master_http.base_url(cluster)
        self.username = os.environ.get("DET_USER") or "admin"
        # Read only when a login happens; never printed.
        self._password = os.environ.get("DET_PASS") or cluster.determined.admin_password.value
        self.timeout = timeout
        self.token: str | None = None

    def request(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> dict:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.login()}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with master_http.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise MasterRefused(
                    f"the master at {self.url} refuses {self.username} ({method} {path}: "
                    f"HTTP {e.code}): set DET_USER/DET_PASS to an admin login that works "
                    "(the master has another admin password than determined.admin_password until "
                    "a deploy of the master sets it)"
                ) from None
            raw = e.read()
            try:
                detail = json.loads(raw)["error"]["error"]
            except (ValueError, KeyError, TypeError):
                detail = raw.decode(errors="replace")[:200]
            raise MasterError(f"{method} {path}: HTTP {e.code}: {detail}") from None
        except (OSError, urllib.error.URLError) as e:
            raise MasterError(f"{self.url} does not answer: {getattr(e, 'reason', e)}") from None
        return json.loads(raw) if raw else {}

    def login(self) -> str:
        if self.token is None:
            body = {"username": self.username, "password": self._password}
            try:
                self.token = self.request("POST", "/api/v1/auth/login", body, auth=False)["token"]
            except MasterError as e:
                raise MasterError(
                    f"login as {self.username} failed ({e}); if the master's admin password "
                    "is not determined.admin_password, set DET_USER/DET_PASS"
                ) from None
        return self.token

    def healthy(self) -> bool:
        try:
            return self.request("GET", "/health", auth=False).get("status") == "up"
        except MasterError:
            return False

    def agents(self) -> list[dict]:
        return self.request("GET", "/api/v1/agents")["agents"]

    def disable(self, agent_id: str, drain: bool = False) -> dict:
        # drain=false (a rebuild): whatever still runs there is killed and rescheduled elsewhere
        # from its last checkpoint; the node is about to be wiped anyway. drain=true (an
        # upgrade): what runs goes on, nothing new is scheduled there.
        return self.request("POST", f"/api/v1/agents/{agent_id}/disable", {"drain": drain})["agent"]

    def enable(self, agent_id: str) -> dict:
        return self.request("POST", f"/api/v1/agents/{agent_id}/enable")["agent"]

    def holders(self, cluster: Cluster) -> dict[str, tuple[str, ...]]:
        """{hostname: allocation names} of what runs on the agents (GET /api/v1/tasks)."""
        summaries = self.request("GET", "/api/v1/tasks").get("allocationIdToSummary") or {}
        return training.holders_by_node(cluster, summaries)


def agents_of(node: Node, agents: list[dict]) -> list[dict]:
    """The node's agents: id `<hostname>` (per_node) or `<hostname>-<i>` (per_domain), or
    connected from the node's management address."""
    return [a for a in agents if node.owns_agent(a["id"]) or str(node.address) in (a.get("addresses") or [])]


def expected_back(node: Node, ids: list[str]) -> list[str]:
    """Of the agents seen before, those the node's current agent_layout brings back."""
    if node.agent_layout == "per_node":
        return [i for i in ids if i == node.hostname]
    return [i for i in ids if i != node.hostname and node.owns_agent(i)]


def cluster_of(inventory: Path) -> Cluster:
    """The cluster an inventory module was built from (deploy.inventory.groups)."""
    namespace = runpy.run_path(str(inventory))
    for value in namespace.values():
        if isinstance(value, list):
            for entry in value:
                if (
                    isinstance(entry, tuple)
                    and len(entry) == 2
                    and isinstance(entry[1], dict)
                    and isinstance(entry[1].get("cluster"), Cluster)
                ):
                    return entry[1]["cluster"]
    raise SystemExit(f"{inventory}: not an inventory built by deploy.inventory.groups()")


def pyinfra_executable() -> str:
    """The pyinfra beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "pyinfra"
    return str(beside) if beside.exists() else (shutil.which("pyinfra") or "pyinfra")


def pyinfra_argv(inventory: Path | str, hostnames: Sequence[str], extra: list[str]) -> list[str]:
    """The plain deploy limited to `hostnames` (rebuild's one node, an upgrade's batch)."""
    limits = [a for name in hostnames for a in ("--limit", name)]
    return [pyinfra_executable(), "-y", str(inventory), "deploy.py", *limits, *extra]


def take_out_of_service(master: Master, node: Node) -> list[str]:
    """Disable the node's agents; returns their ids."""
    try:
        found = agents_of(node, master.agents())
    except MasterError as e:
        say(f"cannot reach the master to disable {node.hostname}'s agents, going on: {e}")
        return []
    if not found:
        say(f"the master lists no agent of {node.hostname}")
    for agent in found:
        try:
            master.disable(agent["id"])
            say(f"agent {agent['id']} disabled")
        except MasterError as e:
            # A dead node's agent awaits its reconnect or is gone: nothing is scheduled there.
            say(f"agent {agent['id']} not disabled ({e}); it is not connected")
    return [a["id"] for a in found]


def wait(predicate, timeout: float, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def registered(master: Master, node: Node, expected: list[str]) -> list[dict] | None:
    """The node's agents once at least one (and every expected id) is listed."""
    try:
        found = [a for a in agents_of(node, master.agents()) if a.get("addresses")]
    except MasterError:
        return None
    ids = {a["id"] for a in found}
    if not found or not set(expected) <= ids:
        return None
    return found


def enable_all(master: Master, agents: list[dict]) -> list[dict] | None:
    """Enable each agent; None while one is refused (an agent the master lost just before
    still awaits its reconnect: it is enabled once the rebuilt node has connected)."""
    enabled = []
    for agent in agents:
        try:
            enabled.append(master.enable(agent["id"]))
        except MasterError:
            return None
    return enabled


def back_in_service(master: Master, node: Node, expected: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    enabled = None
    while enabled is None and time.monotonic() < deadline:
        found = registered(master, node, expected)
        if found:
            time.sleep(3)  # agents of one node start together: let a per_domain node's others in
            enabled = enable_all(master, registered(master, node, expected) or found)
        if enabled is None:
            time.sleep(2)
    if enabled is None:
        say(
            f"{node.hostname}: its agents did not register and accept enable within "
            f"{timeout:.0f} s (expected {', '.join(expected) or 'at least one'}); check "
            "`journalctl -u 'determined-agent*'` on the node"
        )
        return False
    for agent in enabled:
        slots = len(agent.get("slots") or {})
        say(
            f"agent {agent['id']} registered ({slots} slots) and "
            f"{'enabled' if agent['enabled'] else 'NOT enabled'}"
        )
    return all(agent["enabled"] for agent in enabled)


def master_back(master: Master, cluster: Cluster, timeout: float) -> bool:
    if not wait(master.healthy, timeout):
        say(f"the master at {master.url} is not healthy after {timeout:.0f} s")
        return False
    ok = True
    for node in cluster.agents:
        found = wait(lambda n=node: registered(master, n, []), timeout)
        if found:
            say(f"{node.hostname}: {', '.join(a['id'] for a in found)} registered again")
        else:
            say(f"{node.hostname}: no agent registered again within {timeout:.0f} s")
            ok = False
    return ok


def main(argv: list[str] | None = None, *, prog: str = PROG, cluster_args: list[str] | None = None) -> int:
    """`prog` is the command as the user typed it, for messages; `cluster_args` how that
    command names the cluster (default [INVENTORY]): python -m deploy passes its own
    ["--cluster", FILE], so that the re-run line it prints is the one the user typed."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inventory", type=Path, help="e.g. inventories/prod.py")
    parser.add_argument("node", help="hostname of the node to rebuild, as in cluster.yaml")
    parser.add_argument(
        "--timeout",
        type=float,
        default=300,
        help="seconds to wait for the master and agents after the deploy",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="rebuild although the master runs trials on the node (they are killed)",
    )
    args, extra = parser.parse_known_args(argv)
    inventory = args.inventory.resolve()
    # Bad input is one line (no usage block): the usage would name INVENTORY, which a user of
    # python -m deploy never typed.
    if not inventory.exists():
        print(f"{prog}: {args.inventory}: no such inventory file", file=sys.stderr)
        return 2
    cluster = cluster_of(inventory)
    try:
        node = cluster.node(args.node)
    except KeyError:
        names = ", ".join(n.hostname for n in cluster.nodes)
        print(f"{prog}: {args.node}: not a node of {cluster.path} ({names})", file=sys.stderr)
        return 2

    again = shlex.join([*shlex.split(prog), *(cluster_args or [str(args.inventory)]), node.hostname])
    try:
        return rebuild(again, inventory, cluster, node, extra, args.timeout, args.force)
    except MasterRefused as e:
        say(str(e))
        return REFUSED


def still_training(master: Master, cluster: Cluster, node: Node) -> tuple[str, ...]:
    """What the master runs on the node's agents: a node that trains is alive, and a rebuild
    would end its trials. Unknown (the master does not answer) counts as nothing: a dead
    master's node is what a rebuild is for."""
    if "agent" not in node.roles:
        return ()
    try:
        return master.holders(cluster).get(node.hostname, ())
    except MasterError as e:
        say(f"what runs on {node.hostname} is unknown (the master was not asked: {e}); going on")
        return ()


def rebuild(
    again: str,
    inventory: Path,
    cluster: Cluster,
    node: Node,
    extra: list[str],
    timeout: float,
    force: bool = False,
) -> int:
    """`again`: the command that re-runs this rebuild, for the message when the deploy fails."""
    master = Master(cluster)
    running = still_training(master, cluster, node)
    if running and not force:
        say(
            f"{node.hostname} runs {', '.join(running)}: it is alive and training, and a rebuild "
            "would end that. Drain its agents first (det agent disable --drain AGENT, until `det "
            f"slot list` shows them free) and run the same command again; or kill them: {again} --force"
        )
        return BUSY
    if running:
        say(f"--force: {', '.join(running)} on {node.hostname} will be killed")
    disabled = take_out_of_service(master, node) if "agent" in node.roles else []
    expected = expected_back(node, disabled)

    argv_ = pyinfra_argv(inventory, [node.hostname], extra)
    say(f"deploying {node.hostname}: {' '.join(redact_argv(argv_))}")
    rc = subprocess.run(argv_, cwd=REPO, stdin=subprocess.DEVNULL, check=False).returncode
    if rc != 0:
        say(
            f"the deploy of {node.hostname} failed (exit status {rc})"
            + ("; its agents stay disabled" if disabled else "")
            + f"; fix the cause and re-run: {again}"
        )
        return rc

    ok = True
    if "agent" in node.roles:
        ok = back_in_service(master, node, expected, timeout)
    if "master" in node.roles:
        ok = master_back(master, cluster, timeout) and ok
    if not ok:
        return NOT_CONFIRMED
    say(f"{node.hostname} rebuilt")
    return 0


if __name__ == "__main__":
    from deploy.cli import alias_note

    alias_note("deploy.rebuild", "rebuild --cluster FILE NODE")
    sys.exit(main())
