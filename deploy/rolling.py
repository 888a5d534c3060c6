"""`python -m deploy upgrade --cluster FILE [-y] [--max-unavailable N] [--canary NODE]
[--drain-timeout S] [--pause-experiments] [--timeout S] [pyinfra options]`: roll a changed
cluster.yaml (new pins or new settings) through a cluster that trains, one batch of nodes at a
time, so that the training elsewhere goes on.

1. The plan: pyinfra's own dry run of the whole deploy (`pyinfra --dry --json INVENTORY
   deploy.py`, without -y so that pyinfra detects the changes; --data disruptive=yes so that
   the training guard, which never runs in a dry run's place, does not hide a busy node's
   changes). Each node's operations that will change are listed; "may reboot" when an
   operation of the NVIDIA driver's changes (its reboot follows a changed driver). Nodes
   without a change are left alone. Without -y the command prints the plan and stops.
2. With -y: when the master node changes, a database dump first (`pg-backup backup --reason
   upgrade`, as Determined's upgrade notes ask before a master upgrade), then the master and
   storage nodes alone (the master restarts; agents reconnect on their own and their trials
   keep running through agent_reconnect_wait), each deployed with `--limit NODE`.
3. Then the agent nodes: the --canary node alone first, then batches of --max-unavailable nodes
   (default 1; counted in nodes, each with all its agents). For each: every agent disabled with
   drain (POST /api/v1/agents/{id}/disable {"drain": true}: Determined 0.38 keeps running tasks
   and schedules nothing new there), waited for until the master runs nothing on it (GET
   /api/v1/tasks), bounded by --drain-timeout. Past it, with --pause-experiments, the
   experiments still on it are paused (POST /api/v1/experiments/{id}/pause: their trials
   checkpoint and stop) and activated again once the batch is back; without it the node's
   agents are enabled again, untouched, and the rollout stops naming the experiments. Then
   `pyinfra -y INVENTORY deploy.py --limit NODE...` (the plain deploy: its guard still refuses
   if something runs there), the agents waited for until they are registered again and kept
   disabled (an agent back after its reboot comes back enabled), this node's verify rows run
   (`python -m deploy verify --no-smoke -k "[NODE]"`, the enabled-agent row excepted: the
   rollout holds it disabled), and only when they pass, the agents enabled.
4. The first node that fails stops the rollout: it stays disabled and its verify rows are
   printed; the nodes not reached keep their versions and their work. The summary names each
   node's outcome and the command that resumes: the same command. A second run plans again:
   nodes already done have nothing to change and are left alone; a node this command left
   disabled (recorded in <state>/rollout/<cluster name>.json, deploy/state.py) is taken up
   first, even when its deploy went through and only its verify failed.

Exit status: 0 when every node is done (or nothing changes), 1 when a node failed, 6 when a
node did not drain in time, 4 when the master refuses the admin login, 2 on bad usage or a
plan that could not be made.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy import state
from deploy.cluster import Cluster, ClusterError, Node, load_cluster
from deploy.rebuild import (
    Master,
    MasterError,
    MasterRefused,
    agents_of,
    enable_all,
    master_back,
    pyinfra_argv,
    pyinfra_executable,
    registered,
    wait,
)
from deploy.restore_drill import PROGRAM as PG_BACKUP
from deploy.restore_drill import exec_argv
from deploy.summary import redact_argv

REPO = Path(__file__).resolve().parent.parent
FAILED, REFUSED, NOT_DRAINED = 1, 4, 6
DRIVER_GROUP = "NVIDIA driver | "  # the driver role's operations (roles/nvidia/driver.py)
# The rows of a node the rollout makes red on purpose: they want its agents enabled, and the
# rollout holds them disabled until the other rows pass.
GATE_EXCEPT = "(test_agents_registered_with_domain_slots or test_agent_registered_with_its_slots)"
# "Trial 12 (Experiment 7)": a trial allocation's name (master/internal/trial.go).
EXPERIMENT = re.compile(r"\(Experiment (\d+)\)")


def say(message: str) -> None:
    print(f"--> upgrade: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class NodePlan:
    hostname: str
    changes: tuple[str, ...] = ()

    @property
    def may_reboot(self) -> bool:
        return any(name.startswith(DRIVER_GROUP) for name in self.changes)


def plan_from_dry_run(payload: dict, cluster: Cluster) -> dict[str, NodePlan]:
    """pyinfra --dry --json's {"plan": [{"name", "hosts_with_change", ...}]} -> each node's plan.
    Conditional changes (an operation run only `_if` an earlier one changed) are not counted:
    they follow a listed change, or do nothing."""
    changes: dict[str, list[str]] = {n.hostname: [] for n in cluster.nodes}
    for op in payload.get("plan") or []:
        for hostname in op.get("hosts_with_change") or []:
            if hostname in changes:
                changes[hostname].append(str(op.get("name", "?")))
    return {h: NodePlan(h, tuple(names)) for h, names in changes.items()}


def stages(
    cluster: Cluster, plans: dict[str, NodePlan], held: list[str], canary: str | None, max_unavailable: int
) -> list[list[Node]]:
    """The order: nodes without an agent first (the master, then storage), one at a time; then
    the agent nodes this command left disabled before, then the canary alone, then batches of
    max_unavailable. Only nodes with a change, or left disabled."""
    todo = [n for n in cluster.nodes if plans[n.hostname].changes or n.hostname in held]
    first = sorted((n for n in todo if "agent" not in n.roles), key=lambda n: "master" not in n.roles)
    agents = [n for n in todo if "agent" in n.roles]
    agents.sort(key=lambda n: (n.hostname not in held, n.hostname != canary))
    out: list[list[Node]] = [[n] for n in first]
    batch: list[Node] = []
    for node in agents:
        alone = node.hostname in held or node.hostname == canary
        if alone:
            out.append([node])
            continue
        batch.append(node)
        if len(batch) == max_unavailable:
            out.append(batch)
            batch = []
    if batch:
        out.append(batch)
    return out


def experiments_of(holders: tuple[str, ...]) -> list[int]:
    return sorted({int(m.group(1)) for h in holders for m in EXPERIMENT.finditer(h)})


def plan_lines(plans: dict[str, NodePlan], order: list[list[Node]]) -> list[str]:
    lines = []
    for i, batch in enumerate(order, 1):
        for node in batch:
            plan = plans[node.hostname]
            reboot = " (may reboot: the driver changes)" if plan.may_reboot else ""
            lines.append(f"step {i}: {node.hostname}: {len(plan.changes)} change(s){reboot}")
            lines += [f"    {name}" for name in plan.changes]
    return lines


@dataclass
class Record:
    """What this command left on the cluster, for the next run: nodes held disabled, experiments
    it paused."""

    path: Path
    held: set[str] = field(default_factory=set)
    paused: set[int] = field(default_factory=set)

    @classmethod
    def load(cls, cluster_file: str) -> Record:
        path = state.state_home() / "rollout" / f"{state.cluster_name(cluster_file)}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        return cls(path, set(data.get("held") or []), {int(e) for e in data.get("paused") or []})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"held": sorted(self.held), "paused": sorted(self.paused)}))


class Rollout:
    def __init__(self, args: argparse.Namespace, inventory: str, cluster: Cluster, extra: list[str]):
        self.args, self.inventory, self.cluster, self.extra = args, inventory, cluster, extra
        self.master = Master(cluster)
        self.record = Record.load(args.cluster)
        self.outcome: dict[str, str] = {}

    def pyinfra(self, argv: list[str], capture: bool = False) -> subprocess.CompletedProcess:
        say(" ".join(redact_argv(argv)))
        return subprocess.run(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, check=False, text=True, capture_output=capture
        )

    def dry_run(self) -> dict[str, NodePlan] | None:
        argv = [
            pyinfra_executable(),
            "--dry",
            "--json",
            self.inventory,
            "deploy.py",
            "--data",
            "disruptive=yes",
            *self.extra,
        ]
        run = self.pyinfra(argv, capture=True)
        try:
            payload = json.loads(run.stdout)
        except ValueError:
            payload = None
        if run.returncode != 0 or not isinstance(payload, dict):
            tail = "\n".join(run.stderr.strip().splitlines()[-15:])
            say(f"the dry run failed (exit status {run.returncode}): no plan, nothing changed\n{tail}")
            return None
        return plan_from_dry_run(payload, self.cluster)

    def deploy(self, nodes: list[Node]) -> int:
        return self.pyinfra(pyinfra_argv(self.inventory, [n.hostname for n in nodes], self.extra)).returncode

    def gate(self, node: Node) -> tuple[bool, str]:
        """This node's verify rows (no smoke: its agents are disabled)."""
        reports = state.reports_dir(self.args.cluster).with_name(
            f"{state.cluster_name(self.args.cluster)}-upgrade-{node.hostname}"
        )
        argv = [
            sys.executable, "-m", "deploy", "verify", "--cluster", self.args.cluster, "--no-smoke",
            "--reports", str(reports), "-k", f"[{node.hostname}] and not {GATE_EXCEPT}",
        ]  # fmt: skip
        run = subprocess.run(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
        return run.returncode == 0, run.stdout + run.stderr

    def disable(self, node: Node) -> None:
        for agent in agents_of(node, self.master.agents()):
            self.master.disable(agent["id"], drain=True)

    def running(self, node: Node) -> tuple[str, ...]:
        return self.master.holders(self.cluster).get(node.hostname, ())

    def drained(self, node: Node, timeout: float) -> tuple[str, ...]:
        """What still runs on the node after waiting up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.running(node)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(2)

    def drain_batch(self, batch: list[Node]) -> bool:
        for node in batch:
            self.disable(node)
            self.record.held.add(node.hostname)
            self.record.save()
            say(f"{node.hostname}: agents disabled with drain")
        for node in batch:
            left = self.drained(node, self.args.drain_timeout)
            if left and self.args.pause_experiments:
                for exp in experiments_of(left):
                    self.master.request("POST", f"/api/v1/experiments/{exp}/pause")
                    self.record.paused.add(exp)
                    self.record.save()
                    say(f"{node.hostname}: experiment {exp} paused (it checkpoints and stops)")
                left = self.drained(node, self.args.timeout)
            if left:
                exps = ", ".join(str(e) for e in experiments_of(left)) or ", ".join(left)
                say(
                    f"{node.hostname} still runs {', '.join(left)} after {self.args.drain_timeout:.0f} s: "
                    f"experiments {exps} hold it. Its agents are enabled again, untouched; wait for them, "
                    "or re-run with a longer --drain-timeout, or with --pause-experiments"
                )
                for n in batch:
                    enable_all(self.master, agents_of(n, self.master.agents()))
                    self.record.held.discard(n.hostname)
                    self.outcome[n.hostname] = "not changed: did not drain"
                self.record.save()
                return False
            say(f"{node.hostname}: drained")
        return True

    def back(self, node: Node) -> bool:
        """Registered again, held disabled, verify rows green, then enabled."""
        if not wait(lambda: registered(self.master, node, []), self.args.timeout):
            self.outcome[node.hostname] = "FAILED: its agents did not register again"
            return False
        time.sleep(3)  # a per_domain node's agents start together: let the others in
        for agent in agents_of(node, self.master.agents()):
            if agent.get("enabled", True):  # back enabled after a reboot: no work until the gate
                self.master.disable(agent["id"], drain=True)
        ok, out = self.gate(node)
        if not ok:
            print(out[-6000:], file=sys.stderr)
            self.outcome[node.hostname] = "FAILED: its verify rows are red (above); it stays disabled"
            return False
        if enable_all(self.master, agents_of(node, self.master.agents())) is None:
            self.outcome[node.hostname] = "FAILED: the master refused to enable its agents"
            return False
        self.record.held.discard(node.hostname)
        self.record.save()
        self.outcome[node.hostname] = "upgraded: verify rows green, agents enabled"
        return True

    def resume_paused(self) -> None:
        for exp in sorted(self.record.paused):
            try:
                self.master.request("POST", f"/api/v1/experiments/{exp}/activate")
                say(f"experiment {exp} activated again")
                self.record.paused.discard(exp)
            except MasterError as e:
                say(f"experiment {exp} not activated ({e}): `det experiment activate {exp}`")
        self.record.save()

    def backup(self) -> int:
        command = [PG_BACKUP, "backup", "--reason", "upgrade"]
        master = self.cluster.master_node.hostname
        return self.pyinfra(exec_argv(self.inventory, master, self.extra, command)).returncode

    def run(self) -> int:
        plans = self.dry_run()
        if plans is None:
            return 2
        held = [h for h in self.record.held if h in plans]
        order = stages(self.cluster, plans, held, self.args.canary, self.args.max_unavailable)
        if not order:
            say("nothing to change: every node runs what the cluster file says")
            self.resume_paused()
            return 0
        for line in plan_lines(plans, order):
            print(line, file=sys.stderr)
        if not self.args.yes:
            say("the plan only: nothing was changed; -y carries it out")
            return 0
        try:
            return self.carry_out(order, plans)
        finally:
            self.resume_paused()
            self.summary()

    def carry_out(self, order: list[list[Node]], plans: dict[str, NodePlan]) -> int:
        master_changes = any("master" in n.roles and plans[n.hostname].changes for b in order for n in b)
        if master_changes and self.backup() != 0:
            say("the database dump before the master's upgrade failed: nothing else was changed")
            return FAILED
        for step, batch in enumerate(order, 1):
            names = ", ".join(n.hostname for n in batch)
            say(f"step {step}/{len(order)}: {names}")
            agent_batch = [n for n in batch if "agent" in n.roles]
            if agent_batch and not self.drain_batch(agent_batch):
                return NOT_DRAINED
            rc = self.deploy(batch)
            if rc != 0:
                for n in batch:
                    self.outcome[n.hostname] = f"FAILED: the deploy exited {rc}" + (
                        "; it stays disabled" if n in agent_batch else ""
                    )
                return FAILED
            ok = True
            for node in batch:
                if "master" in node.roles:
                    ok = master_back(self.master, self.cluster, self.args.timeout) and ok
                if node in agent_batch:
                    ok = self.back(node) and ok
                else:
                    self.outcome.setdefault(node.hostname, "upgraded")
            if not ok:
                return FAILED
            self.resume_paused()
        return 0

    def summary(self) -> None:
        again = self.args.again
        try:
            versions = {a["id"]: a.get("version", "?") for a in self.master.agents()}
        except MasterError:
            versions = {}
        say("summary:")
        for node in self.cluster.nodes:
            shown = self.outcome.get(node.hostname, "unchanged")
            ids = [i for i in versions if node.owns_agent(i)]
            ver = f" (agent {', '.join(sorted({str(versions[i]) for i in ids}))})" if ids else ""
            print(f"    {node.hostname}: {shown}{ver}", file=sys.stderr)
        if any(o.startswith(("FAILED", "not changed")) for o in self.outcome.values()):
            print(f"    resume with: {again}", file=sys.stderr)


def main(inventory: str, args: argparse.Namespace, extra: list[str]) -> int:
    try:
        cluster = load_cluster(args.cluster)
    except ClusterError as e:
        print("\n".join(e.problems), file=sys.stderr)
        return 2
    if args.max_unavailable < 1:
        print(
            f"{args.cluster}: --max-unavailable {args.max_unavailable}: must be at least 1", file=sys.stderr
        )
        return 2
    if args.canary is not None and args.canary not in {n.hostname for n in cluster.agents}:
        names = ", ".join(n.hostname for n in cluster.agents)
        print(f"{args.cluster}: --canary {args.canary}: not an agent node ({names})", file=sys.stderr)
        return 2
    try:
        return Rollout(args, inventory, cluster, extra).run()
    except MasterRefused as e:
        say(str(e))
        return REFUSED
    except MasterError as e:
        say(f"the master did not answer ({e}); the summary above says where the rollout stopped")
        return FAILED
