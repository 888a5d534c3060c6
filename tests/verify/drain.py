"""pytest plugin: `--hardware` and `--drain-unhealthy` (loaded by `python -m deploy verify`).

--hardware runs the health rows that need real GPUs (tests/verify/test_health.py).

--drain-unhealthy: after the checks, each agent node whose health rows (test_health.py) are
red gets its Determined agents disabled through the master's REST API, and a node drained
earlier by this tool whose health rows are all green again gets them enabled:

  POST /api/v1/agents/{agentId}/disable  body {"drain": true}: running tasks finish, no new ones
  POST /api/v1/agents/{agentId}/enable
  (determined-ai/determined proto/src/determined/api/v1/api.proto, rpc DisableAgent / EnableAgent)

A node is never drained because its health could not be read: a row that failed with "could
not run", in its setup, or over SSH counts as unknown, and a node with unknown rows and no red
one keeps its state. Only agents this tool disabled are enabled again: their ids are kept in
--drain-state (default $XDG_STATE_HOME/gpu-cluster/drained-agents.json; ~/.local/state/...
when XDG_STATE_HOME is unset), so an agent an operator disabled by hand stays disabled.
Every action is logged, with its reason, to stdout and to --drain-log (verify passes drain.log
in its --reports directory; without it the default is reports/drain.log under pytest's rootdir).
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploy.state import state_home

HEALTH_MODULE = "test_health.py"
COULD_NOT_RUN = "could not run"


def state_file(given: str | None) -> Path:
    """--drain-state, or the toolkit's state directory (deploy/state.py: XDG_STATE_HOME, as
    verify's reports)."""
    return Path(os.path.expanduser(given)) if given else state_home() / "drained-agents.json"


def pytest_addoption(parser):
    group = parser.getgroup("verify-health", "node health (tests/verify/drain.py)")
    group.addoption("--hardware", action="store_true", help="run the bandwidth rows that need real GPUs")
    group.addoption(
        "--drain-unhealthy",
        action="store_true",
        help="disable the Determined agents of nodes with red health rows; re-enable them when green",
    )
    group.addoption(
        "--drain-state",
        default=None,
        help="agents this tool disabled (JSON; default $XDG_STATE_HOME/gpu-cluster/drained-agents.json)",
    )
    group.addoption("--drain-log", default=None, help="append each action here (default reports/drain.log)")


def pytest_configure(config):
    if config.getoption("--drain-unhealthy") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Drainer(config), "verify-drainer")


@dataclass
class Health:
    """One node's health rows: red (a finding), unknown (could not run), green."""

    red: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    green: int = 0

    @property
    def verdict(self) -> str:
        if self.red:
            return "unhealthy"
        return "unknown" if self.unknown else "healthy"


def _node_of(report) -> str | None:
    for name, value in report.user_properties:
        if name == "verify.node":
            return str(value)
    # Without the matrix plugin: the parametrisation id, before --dist loadgroup's "@<group>".
    nodeid = report.nodeid.split("@", 1)[0]
    if "[" in nodeid:
        return nodeid.rsplit("[", 1)[1].rstrip("]")
    return None


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    return text.strip().splitlines()[0] if text.strip() else "failed"


def classify(health: dict[str, Health], report) -> None:
    """Add one report of a health row to its node's Health."""
    if HEALTH_MODULE not in report.nodeid:
        return
    node = _node_of(report)
    if node is None:
        return
    h = health.setdefault(node, Health())
    check = report.nodeid.split("::")[-1].split("[")[0]
    if report.when == "call" and report.passed:
        h.green += 1
    elif report.skipped:
        return  # --hardware rows without --hardware: not run, says nothing about the node
    elif report.failed:
        message = _message(report).removeprefix("AssertionError: ").removeprefix("Failed: ")
        ssh = any(name == "verify.ssh" for name, _ in report.user_properties)
        if report.when != "call" or ssh or message.startswith(COULD_NOT_RUN):
            h.unknown.append(f"{check}: {message}")
        else:
            h.red.append(f"{check}: {message}")


def plan(health: dict[str, Health], agents_of: dict[str, dict[str, bool]], drained: set[str]) -> list[tuple]:
    """[(action, agent id, node, reason)]: disable the enabled agents of unhealthy nodes (also
    again after an agent restart: a re-registered agent starts enabled; one an operator disabled
    is left alone), enable the ones this tool disabled on nodes healthy again."""
    actions = []
    for node, h in sorted(health.items()):
        for agent_id, enabled in sorted(agents_of.get(node, {}).items()):
            if h.verdict == "unhealthy" and enabled:
                actions.append(("disable", agent_id, node, "; ".join(h.red)))
            elif h.verdict == "healthy" and agent_id in drained:
                actions.append(("enable", agent_id, node, f"all {h.green} health rows green"))
    return actions


class Drainer:
    def __init__(self, config):
        self.config = config
        self.health: dict[str, Health] = {}

    def pytest_runtest_logreport(self, report):
        classify(self.health, report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        from tests.verify.conftest import _cluster
        from tests.verify.master_api import _agents_of, admin_token, list_agents

        cluster = _cluster(self.config.getoption("--cluster"))
        state = state_file(self.config.getoption("--drain-state"))
        log = Path(self.config.getoption("--drain-log") or self.config.rootpath / "reports" / "drain.log")
        drained = set(json.loads(state.read_text())) if state.exists() else set()
        token = admin_token(cluster)
        agents = {a["id"]: a for a in list_agents(cluster, token)}
        agents_of = {
            n.hostname: {i: a.get("enabled", True) for i, a in _agents_of(n, agents).items()}
            for n in cluster.agents
        }
        for node, h in sorted(self.health.items()):
            if h.verdict == "unknown":
                self._log(
                    log, f"keep {node}: health unknown, never drained for that ({'; '.join(h.unknown)})"
                )
        for action, agent_id, node, reason in plan(self.health, agents_of, drained):
            status = set_agent_enabled(cluster, token, agent_id, action == "enable")
            ok = status == 200
            if ok and action == "disable":
                drained.add(agent_id)
            elif ok:
                drained.discard(agent_id)
            result = "done" if ok else f"FAILED (HTTP {status})"
            self._log(log, f"{action} agent {agent_id} of {node}: {result}; reason: {reason}")
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps(sorted(drained)) + "\n")

    def _log(self, log: Path, line: str) -> None:
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"{stamp} {line}\n")
        # pytest's output capture may still be on at session end: write through its reporter.
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"drain-unhealthy: {line}", bold=True)
        else:
            print(f"drain-unhealthy: {line}", flush=True)


def set_agent_enabled(cluster, token: str, agent_id: str, enabled: bool) -> int:
    """POST .../enable (no body), or .../disable with {"drain": true} (DisableAgentRequest)."""
    import urllib.error
    import urllib.request
    from urllib.parse import quote

    from deploy import master_http
    from tests.verify.master_api import _master_url

    action = "enable" if enabled else "disable"
    url = f"{_master_url(cluster)}/api/v1/agents/{quote(agent_id, safe='')}/{action}"
    body = b"" if enabled else json.dumps({"drain": True}).encode()
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with master_http.urlopen(request, timeout=15) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
