"""pytest plugin: the verify run as a checks x nodes matrix, in the terminal and in Markdown.

Loaded only by `python -m deploy verify` (`-p tests.verify.matrix`): plain pytest runs never see
it. It works the same with and without pytest-xdist:
- every process that collects (each xdist worker, or the single pytest process) stamps each
  test's user_properties with its check name and its node / peer hostnames, taken from the
  parametrisation values (hostnames may contain '-', so the ids `nodeA-nodeB` are not parsed);
- a failure whose exception comes out of paramiko (connect refused, timed out, auth, ...), or
  a check stopped at setup because verify's first step found its node dead
  (tests/verify/reach.py NodeUnreachable), is recognised where the exception object still
  exists (pytest_runtest_makereport), labelled with one reason, and its traceback replaced by
  that one line: an unreachable node gives one line per check instead of a wall of frames;
- reports carry user_properties to the controller, the only process that builds the matrix
  (pytest_runtest_logreport), writes it to --verify-matrix (Markdown) and prints it;
- the dead nodes come first: in the final summary line with the first thing to look at, and
  beside each with what its peers saw of it (verify's first step, tests/verify/reach.py);
- a cell whose check could not look (a cross-node check on a node whose probe did not run:
  a skip carrying P_NOT_PROBED) is n/p, neither ok nor FAIL, and the run's exit status is
  EXIT_NOT_PROBED when nothing else failed (Recorder.pytest_sessionfinish);
- after the matrix, the NVLink domains the topology checks read on each agent node and the
  largest slots_per_trial inside one domain on every agent node (nvlink_lines).
"""

from __future__ import annotations

import ast
import datetime
import errno
import json
import os
import re
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploy.topology import Observed, summary_lines
from tests.verify.hints import NOT_PROBED, SSH_HINTS, Hint, hint_for
from tests.verify.reach import NodeUnreachable, Reach

# Parameters that name the node a check is about, in order of preference; the first one
# present is the row's node. Parameters in PEER_PARAMS are the other end of a cross-node check.
NODE_PARAMS = ("node", "agent", "master", "storage")
PEER_PARAMS = ("peer",)
CLUSTER = "(cluster)"  # column of checks not parametrised over nodes (run once, cluster-wide)

P_CHECK = "verify.check"  # "test_module.py::test_name"
P_NODE = "verify.node"  # row node hostname
P_PEER = "verify.peer"  # peer hostname (cross-node checks)
P_ADDRESS = "verify.address"  # "hostname address", to name the node behind an SSH target
P_ORDER = "verify.order"  # index in the all-nodes parametrisation: cluster.yaml order
P_SSH = "verify.ssh"  # one-line reason an SSH connection failed
P_SSH_KIND = "verify.ssh_kind"
P_SSH_TARGET = "verify.ssh_target"  # "address:port" paramiko tried to reach
P_NVLINK = "verify.nvlink"  # JSON, what a topology check read (tests/verify/test_topology_agents.py)
# JSON {"what", "node", "value"}: what a check found on a node that an operator wants to see per
# node even when it is green (e.g. which interface carries IPoIB there).
P_SEEN = "verify.seen"
# JSON [hostname, ...]: nodes a cluster-wide check could not ask (dead before the checks), from
# tests/verify/conftest.py `answering`.
P_NOT_ASKED = "verify.not_asked"
# JSON [symptom, action]: a check whose failures differ in cause gives the hint that fits this
# one (tests/verify/test_smoke.py); it replaces the check's entry in hints.py for that cell.
P_HINT = "verify.hint"
# Why the check could not look at its node although the node answered (tests/verify/reach.py
# not_probed): set by a check that then skips with NOT_PROBED_PREFIX, so that plain pytest
# shows it as a skip with its reason and the matrix shows it as n/p.
P_NOT_PROBED = "verify.not_probed"
NOT_PROBED_PREFIX = "not probed: "

OK, FAIL, SKIP, NA, SSH, NP = "ok", "FAIL", "skip", "n/a", "SSH", "n/p"
MARKUP = {
    OK: {"green": True},
    FAIL: {"red": True, "bold": True},
    SKIP: {"yellow": True},
    NA: {"light": True},
    SSH: {"red": True, "bold": True},
    NP: {"purple": True, "bold": True},
}
LEGEND = (
    f"{OK} = passed (cross-node checks: with every peer the other nodes reach), {FAIL} = failed, "
    f"{SKIP} = skipped, {NA} = does not apply to that node, "
    f"{SSH} = could not run: the node is unreachable over SSH, "
    f"{NP} = not probed: the node answered but its probe did not run (nothing found broken, "
    f"nothing tested), {CLUSTER} = checks run once for the whole cluster"
)
# The exit status of a run where no check failed but some cells are n/p: not 0 (something was
# not verified), not pytest's 1 (nothing was found broken), and outside pytest's own codes
# (0-6, pytest.ExitCode) so that a script can tell it apart. tests/verify/__main__.py passes it on.
EXIT_NOT_PROBED = 10


def pytest_addoption(parser):
    group = parser.getgroup("verify-matrix", "verify matrix (tests/verify/matrix.py)")
    group.addoption(
        "--verify-matrix",
        metavar="PATH",
        default=None,
        help="write the checks x nodes matrix (Markdown) here (default: <rootdir>/reports/verify-matrix.md)",
    )


def pytest_configure(config):
    # xdist workers only annotate; the controller (or the lone process) records and reports.
    if not hasattr(config, "workerinput") and not config.option.collectonly:
        config.pluginmanager.register(Recorder(config), "verify-matrix-recorder")


# --- every collecting process: stamp items, shorten SSH failures ---------------------------


def _hostname(value) -> str | None:
    name = getattr(value, "hostname", None)
    return name if isinstance(name, str) else None


def item_properties(item) -> list[tuple[str, str]]:
    name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    props = [(P_CHECK, f"{item.path.name}::{name}")]
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return props
    params = callspec.params
    ordered = [p for p in NODE_PARAMS if p in params] + [p for p in params if p not in NODE_PARAMS]
    node_param = next((p for p in ordered if p not in PEER_PARAMS and _hostname(params[p])), None)
    for param in ordered:
        host = _hostname(params[param])
        if host is None:
            continue
        props.append((P_NODE if param == node_param else P_PEER, host))
        address = getattr(params[param], "address", None)
        if address is not None:
            props.append((P_ADDRESS, f"{host} {address}"))
        if param == "node":
            props.append((P_ORDER, str(callspec.indices["node"])))
    return props


def pytest_itemcollected(item):
    item.user_properties.extend(item_properties(item))


def _mro_names(exc) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}


def _paramiko_frames(tb):
    sep = os.sep
    return [f for f, _ in traceback.walk_tb(tb) if f"{sep}paramiko{sep}" in f.f_code.co_filename]


def ssh_problem(exc: BaseException) -> tuple[str, str, str | None] | None:
    """(kind, reason, "address:port" or None) when `exc` is an SSH connection failure, else None.

    Only exceptions raised inside paramiko count: a check's own HTTP or S3 request from the
    controller failing with 'connection refused' is a finding about that service, not about
    reaching the node."""
    if isinstance(exc, NodeUnreachable):  # found dead before the checks: the first step's reason
        return exc.kind, exc.reason, exc.target
    frames = _paramiko_frames(exc.__traceback__)
    names = _mro_names(exc)
    if not frames and not any(n.startswith("paramiko.") for n in names):
        return None
    target = None
    for frame in frames:
        if frame.f_code.co_name == "connect" and "hostname" in frame.f_locals:
            target = f"{frame.f_locals['hostname']}:{frame.f_locals.get('port', 22)}"
    errors = getattr(exc, "errors", None)  # NoValidConnectionsError: {(addr, port): OSError}
    if isinstance(errors, dict) and errors:
        addr = min(errors)
        target = target or f"{addr[0]}:{addr[1]}"
        codes = {getattr(e, "errno", None) for e in errors.values()}
    else:
        codes = {getattr(exc, "errno", None)}
    message = str(exc).strip() or type(exc).__name__
    if "paramiko.ssh_exception.AuthenticationException" in names:
        detail = "" if message.lower().rstrip(".") == "authentication failed" else f" ({message})"
        kind, what = "auth", f"authentication failed{detail}"
    elif "paramiko.ssh_exception.BadHostKeyException" in names:
        kind, what = "hostkey", "host key does not match known_hosts"
    elif any(n.endswith(".UnknownHostKey") for n in names):  # tests/verify/conftest.py
        kind, what = "hostkey", f"host key unknown: {message}"
    elif isinstance(exc, TimeoutError) or "timed out" in message:
        kind, what = "timeout", "connection timed out"
    elif codes == {errno.ECONNREFUSED}:
        kind, what = "refused", "connection refused"
    elif codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        kind, what = "unreachable", "no route to host"
    elif "socket.gaierror" in names:
        kind, what = "resolve", f"cannot resolve the address ({message})"
    elif "banner" in message.lower():
        kind, what = "timeout", f"no SSH banner ({message})"
    elif isinstance(exc, (OSError, EOFError)) or any(n.startswith("paramiko.") for n in names):
        kind, what = "other", f"{type(exc).__name__}: {message}"
    else:
        return None
    return kind, f"SSH{' to ' + target if target else ''}: {what}", target


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and call.excinfo is not None:
        problem = ssh_problem(call.excinfo.value)
        if problem is not None:
            kind, reason, target = problem
            extra = [(P_SSH, reason), (P_SSH_KIND, kind)]
            if target:
                extra.append((P_SSH_TARGET, target))
            report.user_properties = [*report.user_properties, *extra]
            report.longrepr = f"{reason}  [{call.excinfo.exconly().splitlines()[0]}]"
    return report


# --- the controller: record results, build and render the matrix ---------------------------


@dataclass(frozen=True)
class Result:
    check: str
    node: str  # hostname, or CLUSTER
    peer: str | None
    outcome: str  # OK, FAIL, SKIP
    message: str = ""
    ssh: str | None = None
    ssh_kind: str | None = None
    ssh_target: str | None = None
    phase: str = "call"  # "setup": a fixture failed and the check itself never ran
    not_asked: tuple[str, ...] = ()  # nodes a cluster-wide check left out (P_NOT_ASKED)
    hint: tuple[str, ...] | None = None  # (symptom, action) from P_HINT
    not_probed: str | None = None  # a skip with P_NOT_PROBED: why the check could not look


def _props(report) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for pair in report.user_properties:  # tuples in-process, lists after xdist's transport
        name, value = pair
        found.setdefault(name, []).append(str(value))
    return found


def _first(props: dict[str, list[str]], name: str) -> str | None:
    """The first value recorded under `name`, or None when none was."""
    values = props.get(name)
    return values[0] if values else None


_LITERAL = r"""b?(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
# testinfra's check_output / file.content_string failures print the whole CommandResult repr.
_COMMAND_RESULT = re.compile(
    rf"CommandResult\(backend=.*?, exit_status=(?P<rc>-?\d+), command=(?P<cmd>{_LITERAL}), "
    rf"_stdout=(?P<out>{_LITERAL}), _stderr=(?P<err>{_LITERAL})\)"
)


def _literal(text: str) -> str:
    value = ast.literal_eval(text)
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _command_failure(text: str) -> str | None:
    """'CMD -> exit RC: last stderr line' from a testinfra CommandResult repr, if there is one."""
    found = _COMMAND_RESULT.search(text)
    if found is None:
        return None
    err = [line for line in _literal(found["err"]).splitlines() if line.strip()]
    out = [line for line in _literal(found["out"]).splitlines() if line.strip()]
    detail = err[-1] if err else (out[0] if out else "no output")
    return f"{_literal(found['cmd'])} -> exit {found['rc']}: {detail.strip()}"


def report_message(report) -> str:
    """One line saying what went wrong (or why it was skipped)."""
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # skip: (path, lineno, message)
        text = str(longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(longrepr)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = (_command_failure(text) or (lines[0] if lines else "")).removeprefix("AssertionError: ")
    if first.startswith("assert "):
        # `assert a and b` says only "assert (False)": the first "where" line names the culprit.
        where = next((line.lstrip("+ ") for line in lines[1:] if line.lstrip("+ ").startswith("where")), None)
        first += f" ({where})" if where else ""
    return first if len(first) <= 200 else first[:197] + "..."


def check_from_nodeid(nodeid: str) -> str:
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).name}::{rest.rsplit('::', 1)[-1].split('[', 1)[0]}"


def nvlink_lines(values: list[str]) -> list[str]:
    """deploy.topology.summary_lines of the P_NVLINK properties of a run, in any order.

    Every node named is an agent node a check was about to read; it counts as read once any
    check reports its domains (an empty tuple and a detail when nvidia-smi gave no matrix)."""
    agents: set[str] = set()
    observed: dict[str, Observed] = {}
    for value in values:
        entry = json.loads(value)
        agents.add(entry["node"])
        if "domains" in entry:
            found = tuple(tuple(d) for d in entry["domains"])
            observed[entry["node"]] = Observed(entry["layout"], found, entry.get("detail"))
    return summary_lines(observed, sorted(agents))


def seen_lines(values: list[str], order: dict[str, int] | None = None) -> list[str]:
    """One line per kind of P_SEEN value: `--> IPoIB interface: master ib0 ..., gpu3 ibp65s0 ...`,
    nodes in cluster.yaml order (then by name)."""
    by_what: dict[str, dict[str, str]] = {}
    for value in values:
        entry = json.loads(value)
        by_what.setdefault(entry["what"], {})[entry["node"]] = entry["value"]
    rank = order or {}
    lines = []
    for what, nodes in by_what.items():
        shown = sorted(nodes, key=lambda n: (rank.get(n, len(rank)), _natural(n)))
        lines.append(f"--> {what}: " + ", ".join(f"{n} {nodes[n]}" for n in shown))
    return lines


def _natural(name: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


@dataclass
class Cell:
    results: list[Result] = field(default_factory=list)

    @property
    def status(self) -> str:
        outcomes = [r.outcome for r in self.results]
        if any(r.outcome == FAIL and not r.ssh for r in self.results):
            return FAIL
        if FAIL in outcomes:
            return SSH
        if any(r.not_probed for r in self.results):
            return NP
        if OK in outcomes:
            return OK
        return SKIP if outcomes else NA

    def not_probed(self) -> list[str]:
        """Why the check could not look (n/p), each reason once."""
        return list(dict.fromkeys(r.not_probed for r in self.results if r.not_probed))

    def evidence(self) -> list[str]:
        seen = []
        for r in self.results:
            if r.outcome == FAIL and not r.ssh:
                line = (f"peer {r.peer}: " if r.peer else "") + (r.message or "failed")
                if line not in seen:
                    seen.append(line)
        return seen

    def hint(self, check: str, nodes: str) -> Hint:
        hint = hint_for(check, nodes)
        failed = [r for r in self.results if r.outcome == FAIL and not r.ssh]
        own = next((r.hint for r in failed if r.hint), None)
        if own:
            hint = Hint(*own).format(nodes or "the node")
        if failed and all(r.phase == "setup" for r in failed):
            # The check's own symptom was never tested: what broke is what its fixture needed.
            return Hint(
                "setup failed, the check did not run",
                f"fix what the setup error says first; then: {hint.action}",
            )
        return hint


@dataclass
class Matrix:
    checks: list[str]
    nodes: list[str]
    cells: dict[tuple[str, str], Cell]
    unreachable: dict[str, tuple[str, str]]  # node -> (reason, kind)
    not_asked: dict[str, list[str]] = field(default_factory=dict)  # check -> nodes left out
    # node -> what the nodes that answered saw of it (verify's first step, reach.peers_view)
    seen_by_peers: dict[str, str] = field(default_factory=dict)
    reach_line: str = ""  # how long the first step took, how many answered

    def status(self, check: str, node: str) -> str:
        cell = self.cells.get((check, node))
        return cell.status if cell else NA

    def red_cells(self) -> list[tuple[str, str, Cell]]:
        return self.cells_with(FAIL)

    def cells_with(self, status: str) -> list[tuple[str, str, Cell]]:
        return [
            (c, n, self.cells[c, n]) for c in self.checks for n in self.nodes if self.status(c, n) == status
        ]

    def counts(self, node: str) -> Counter:
        return Counter(self.status(c, node) for c in self.checks)


def build_matrix(
    results: list[Result],
    addresses: dict[str, str] | None = None,
    order: dict[str, int] | None = None,
    check_order: dict[str, tuple] | None = None,
) -> Matrix:
    addresses, order, check_order = addresses or {}, order or {}, check_order or {}
    cells: dict[tuple[str, str], Cell] = {}
    reasons: dict[str, Counter] = {}
    for r in results:
        cells.setdefault((r.check, r.node), Cell()).results.append(r)
        if r.ssh:
            address = (r.ssh_target or "").rsplit(":", 1)[0]
            who = addresses.get(address) or (r.node if r.node != CLUSTER else None) or r.ssh_target or CLUSTER
            reasons.setdefault(who, Counter())[(r.ssh, r.ssh_kind or "other")] += 1
    hosts = {r.node for r in results if r.node != CLUSTER} | (set(reasons) - {CLUSTER})
    nodes = sorted(hosts, key=lambda h: (h not in order, order.get(h, 0), _natural(h)))
    if any(r.node == CLUSTER for r in results):
        nodes.append(CLUSTER)
    checks = sorted({r.check for r in results}, key=lambda c: (check_order.get(c, ("~",)), c))
    unreachable = {
        who: reasons[who].most_common(1)[0][0]
        for who in [*nodes, *sorted(set(reasons) - set(nodes))]
        if who in reasons
    }
    not_asked: dict[str, list[str]] = {}
    for r in results:
        for host in r.not_asked:
            if host not in not_asked.setdefault(r.check, []):
                not_asked[r.check].append(host)
    return Matrix(checks, nodes, cells, unreachable, not_asked)


def dead_first(m: Matrix) -> str:
    """The summary line's head: each unreachable node, why, and the first thing to look at."""
    parts = []
    for node, (reason, kind) in m.unreachable.items():
        parts.append(f"UNREACHABLE {node} ({reason}): first: {SSH_HINTS.get(kind, SSH_HINTS['other'])}")
    return " | ".join(parts)


def not_asked_lines(m: Matrix) -> list[str]:
    return [
        f"{check.rsplit('::', 1)[-1]} ran without {', '.join(nodes)}: not asked (unreachable)"
        for check, nodes in m.not_asked.items()
    ]


def _duration(seconds: float) -> str:
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes)}m {secs:04.1f}s" if minutes else f"{secs:.1f}s"


def _hint_nodes(nodes: list[str]) -> str:
    return ", ".join(nodes) if len(nodes) <= 3 else "each of these nodes"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_code(text: str) -> str:
    """Evidence as a code span, so that reprs like `<file /etc/x>` are not read as HTML."""
    if not text:
        return ""
    if "`" in text:
        return _md(text).replace("<", "&lt;")
    return f"`{_md(text)}`"


def render_markdown(
    m: Matrix,
    *,
    cluster: str | None,
    wall: float,
    exitstatus: int,
    finished: str,
    collect_errors: list[str],
    nvlink: list[str] | None = None,
    host_keys: str | None = None,
    seen: list[str] | None = None,
) -> str:
    # Long: the report's sections in the order they are printed
    red, unprobed = m.red_cells(), m.cells_with(NP)
    verdict = "ok" if exitstatus == 0 else NP if exitstatus == EXIT_NOT_PROBED else "FAIL"
    out = ["# Verify matrix", ""]
    if cluster:
        out.append(f"- cluster: `{cluster}`")
    if host_keys:
        out.append(f"- {_md(host_keys)}")
    hosts = len([n for n in m.nodes if n != CLUSTER])
    if m.unreachable:
        out.append(f"- **{_md(dead_first(m))}**")
    if m.reach_line:
        out.append(f"- {_md(m.reach_line)}")
    out += [
        f"- finished: {finished}, wall time {_duration(wall)}",
        (
            f"- result: **{verdict}** (pytest exit status {exitstatus}): {len(m.checks)} checks "
            f"on {hosts} nodes, {len(red)} red cells, {len(unprobed)} {NP} cells, "
            f"{len(m.unreachable)} unreachable nodes"
        ),
        "",
    ]
    if collect_errors:
        out += ["## Collection errors (no check ran from these)", ""]
        out += [f"- `{_md(e)}`" for e in collect_errors] + [""]
    out += [
        "## Nodes",
        "",
        f"| node | status | {OK} | {FAIL} | {SSH} | {NP} | {SKIP} | why |",
        "|---" * 8 + "|",
    ]
    for node in m.nodes:
        counts = m.counts(node)
        failed = [c.rsplit("::", 1)[-1] for c in m.checks if m.status(c, node) == FAIL]
        not_probed = [c.rsplit("::", 1)[-1] for c in m.checks if m.status(c, node) == NP]
        if node in m.unreachable:
            reason, kind = m.unreachable[node]
            status, why = "**UNREACHABLE**", f"{reason}: {SSH_HINTS.get(kind, SSH_HINTS['other'])}"
            if node in m.seen_by_peers:
                why += f" ({m.seen_by_peers[node]})"
        elif failed:
            status, why = "**FAIL**", _list(failed, 5)
        elif not_probed:
            status, why = f"**{NP}**", f"not probed: {_list(not_probed, 5)}"
        else:
            status, why = "ok", ""
        out.append(
            f"| {node} | {status} | {counts[OK]} | {counts[FAIL]} | {counts[SSH]} "
            f"| {counts[NP]} | {counts[SKIP]} | {_md(why)} |"
        )
    out += [
        "",
        "## Checks x nodes",
        "",
        LEGEND,
        "",
        "| check | " + " | ".join(m.nodes) + " |",
        "|---" * (len(m.nodes) + 1) + "|",
    ]
    for check in m.checks:
        cells = [m.status(check, n) for n in m.nodes]
        cells = [f"**{s}**" if s in (FAIL, SSH, NP) else s for s in cells]
        out.append(f"| `{check}` | " + " | ".join(cells) + " |")
    out += ["", "## Red cells: symptom and first thing to do", ""]
    if not red and not m.unreachable:
        out.append("None.")
    else:
        out += ["| check | node | symptom | first thing to do | seen |", "|---|---|---|---|---|"]
        for node, (reason, kind) in m.unreachable.items():
            peers = f"; {m.seen_by_peers[node]}" if node in m.seen_by_peers else ""
            out.append(
                f"| (every check over SSH) | {node} | {_md(reason + peers)} | "
                f"{_md(SSH_HINTS.get(kind, SSH_HINTS['other']))} | |"
            )
        for check, node, cell in red:
            hint = cell.hint(check, node if node != CLUSTER else "")
            out.append(
                f"| `{check}` | {node} | {_md(hint.symptom)} | {_md(hint.action)} | "
                f"{'; '.join(_md_code(e) for e in cell.evidence())} |"
            )
    if unprobed:
        out += [
            "",
            "## Not probed: the node answered, the check could not look",
            "",
            "| check | node | why | first thing to do |",
            "|---|---|---|---|",
        ]
        for check, node, cell in unprobed:
            out.append(
                f"| `{check}` | {node} | {'; '.join(_md_code(w) for w in cell.not_probed())} | "
                f"{_md(NOT_PROBED.format(node).action)} |"
            )
    if m.not_asked:
        out += ["", "## Cluster-wide checks that left nodes out", ""]
        out += [f"- {_md(line)}" for line in not_asked_lines(m)]
    if seen:
        out += ["", "## Seen per node", "", "```", *seen, "```"]
    if nvlink:
        out += ["", "## NVLink domains", "", "```", *nvlink, "```"]
    return "\n".join(out) + "\n"


def _short_names(nodes: list[str]) -> tuple[dict[str, str], str]:
    """Column titles: hostnames without their common prefix (cut at a separator), when that
    prefix is there, so that more node columns fit in a terminal."""
    hosts = [n for n in nodes if n != CLUSTER]
    prefix = os.path.commonprefix(hosts) if len(hosts) > 1 else ""
    prefix = prefix[: max((prefix.rfind(c) for c in "-._"), default=-1) + 1]
    names = {n: n.removeprefix(prefix) or n for n in hosts}
    names[CLUSTER] = "cluster"
    return names, prefix


def _list(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def render_terminal(m: Matrix, width: int) -> list[list[tuple[str, dict]]]:
    """Lines of (text, markup) segments: the matrix (rows checks, columns nodes, in blocks of
    columns when wider than the terminal; long check names cut), then unreachable nodes and
    the red cells grouped by check, with their hints."""
    # Long: the terminal matrix's sections in the order they are printed
    lines: list[list[tuple[str, dict]]] = []
    titles, prefix = _short_names(m.nodes)
    col_w = max([len(titles[n]) for n in m.nodes] + [len(FAIL)]) + 1
    names = {c: c.rsplit("::", 1)[-1].removeprefix("test_") for c in m.checks}
    wanted = max([len(n) + 2 for n in names.values()] + [len(c.split("::")[0]) for c in m.checks])
    label_w = max(min(wanted + 1, width - 1 - col_w * len(m.nodes)), 25)
    per_block = max(1, (width - 1 - label_w) // col_w)
    if prefix:
        lines.append([(f"columns: node names without '{prefix}'", {"light": True})])
    for start in range(0, len(m.nodes), per_block):
        block = m.nodes[start : start + per_block]
        lines.append(
            [(" " * label_w + "".join(titles[n].ljust(col_w) for n in block).rstrip(), {"bold": True})]
        )
        module = None
        for check in m.checks:
            mod = check.split("::", 1)[0] if "::" in check else ""
            if mod != module:
                module = mod
                lines.append([(mod, {"bold": True})])
            label = f"  {names[check]}"
            if len(label) >= label_w:
                label = label[: label_w - 2] + "~"
            row: list[tuple[str, dict]] = [(label.ljust(label_w), {})]
            for node in block:
                status = m.status(check, node)
                row.append((status.ljust(col_w) if node != block[-1] else status, MARKUP[status]))
            lines.append(row)
    lines.append([(LEGEND, {"light": True})])
    for node, (reason, kind) in m.unreachable.items():
        lines.append([("UNREACHABLE ", MARKUP[SSH]), (f"{node}: {reason}", {"bold": True})])
        lines.append([(f"    first: {SSH_HINTS.get(kind, SSH_HINTS['other'])}", {})])
        if node in m.seen_by_peers:
            lines.append([(f"    its peers: {m.seen_by_peers[node]}", {"light": True})])
    for line in not_asked_lines(m):
        lines.append([("PARTIAL ", MARKUP[SKIP]), (line, {})])
    not_probed: dict[str, list[tuple[str, Cell]]] = {}
    for check, node, cell in m.cells_with(NP):
        not_probed.setdefault(check, []).append((node, cell))
    for check, cells in not_probed.items():
        nodes = [n for n, _ in cells]
        hint = NOT_PROBED.format(_hint_nodes(nodes))
        lines.append(
            [
                ("NOT PROBED ", MARKUP[NP]),
                (f"{check.rsplit('::', 1)[-1]} on {_list(nodes)}: ", {"bold": True}),
                (hint.symptom, {}),
            ]
        )
        lines.append([(f"    first: {hint.action}", {})])
        for node, cell in cells[:3]:
            for why in cell.not_probed():
                lines.append([(f"    on {node}: {why}", {"light": True})])
        if len(cells) > 3:
            lines.append([(f"    ... {len(cells) - 3} more in the Markdown report", {"light": True})])
    by_check: dict[str, list[tuple[str, Cell]]] = {}
    for check, node, cell in m.red_cells():
        by_check.setdefault(check, []).append((node, cell))
    for check, cells in by_check.items():
        nodes = [n for n, _ in cells]
        hint = cells[0][1].hint(check, _hint_nodes([n for n in nodes if n != CLUSTER]))
        lines.append(
            [
                ("FAIL ", MARKUP[FAIL]),
                (f"{check.rsplit('::', 1)[-1]} on {_list(nodes)}: ", {"bold": True}),
                (hint.symptom, {}),
            ]
        )
        lines.append([(f"    first: {hint.action}", {})])
        seen: dict[str, list[str]] = {}  # the same evidence on many nodes is shown once
        for node, cell in cells:
            for line in cell.evidence():
                seen.setdefault(line, []).append(node)
        for line, where in list(seen.items())[:3]:
            lines.append([(f"    seen on {_list(where, 3)}: {line}", {"light": True})])
        if len(seen) > 3:
            lines.append([(f"    ... {len(seen) - 3} more in the Markdown report", {"light": True})])
    return lines


class Recorder:
    """Registered in the controller only: collects results, writes and prints the matrix."""

    def __init__(self, config):
        self.config = config
        self.started = time.monotonic()
        self.results: list[Result] = []
        self.addresses: dict[str, str] = {}
        self.order: dict[str, int] = {}
        self.check_order: dict[str, tuple] = {}
        self.collect_errors: list[str] = []
        self.nvlink: list[str] = []  # P_NVLINK values, from every worker
        self.seen: list[str] = []  # P_SEEN values, from every worker
        self.matrix: Matrix | None = None
        self.path: Path | None = None
        self.wall = 0.0

    def pytest_collectreport(self, report):
        if report.failed:
            # A collection error's text is a traceback whose last "E   " line says what broke.
            text = str(report.longrepr)
            errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
            message = errors[-1] if errors else report_message(report)
            self.collect_errors.append(f"{report.nodeid or '(session)'}: {message}")

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            # A non-strict xpass counts as passed, an xfail as skipped.
            outcome = OK if report.passed else SKIP if report.skipped else FAIL
        elif report.failed:
            outcome = FAIL  # setup (fixture) or teardown error
        elif report.skipped:
            outcome = SKIP
        else:
            return
        props = _props(report)
        self.nvlink += props.get(P_NVLINK, [])
        self.seen += props.get(P_SEEN, [])
        check = (props.get(P_CHECK) or [check_from_nodeid(report.nodeid)])[0]
        for pair in props.get(P_ADDRESS, []):
            host, address = pair.split(" ", 1)
            self.addresses[address] = host
        if P_ORDER in props and P_NODE in props:
            self.order[props[P_NODE][0]] = int(props[P_ORDER][0])
        self.check_order.setdefault(check, (str(report.location[0]), report.location[1] or 0))
        self.results.append(
            Result(
                check=check,
                node=(props.get(P_NODE) or [CLUSTER])[0],
                peer=_first(props, P_PEER),
                outcome=outcome,
                message=report_message(report) if outcome != OK else "",
                ssh=_first(props, P_SSH) if outcome == FAIL else None,
                ssh_kind=_first(props, P_SSH_KIND),
                ssh_target=_first(props, P_SSH_TARGET),
                phase=report.when,
                not_asked=tuple(h for v in props.get(P_NOT_ASKED, []) for h in json.loads(v)),
                hint=tuple(json.loads(props[P_HINT][0])) if P_HINT in props and outcome == FAIL else None,
                not_probed=_first(props, P_NOT_PROBED) if outcome == SKIP else None,
            )
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.wall = time.monotonic() - self.started
        self.matrix = build_matrix(self.results, self.addresses, self.order, self.check_order)
        self._add_reach(self.matrix)
        if exitstatus == pytest.ExitCode.OK and self.matrix.cells_with(NP):
            # pytest saw only passes and skips; an n/p cell is a check that did not look.
            # pytest returns session.exitstatus as set once sessionfinish is done.
            exitstatus = session.exitstatus = EXIT_NOT_PROBED
        option = self.config.getoption("--verify-matrix")
        self.path = Path(option) if option else self.config.rootpath / "reports" / "verify-matrix.md"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        finished = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        cluster = self.config.getoption("cluster", default=None)
        self.path.write_text(
            render_markdown(
                self.matrix,
                cluster=cluster,
                wall=self.wall,
                exitstatus=int(exitstatus),
                finished=finished,
                collect_errors=self.collect_errors,
                nvlink=nvlink_lines(self.nvlink),
                seen=seen_lines(self.seen, self.order),
                host_keys=getattr(self.config, "verify_host_keys", None),
            )
        )

    def _add_reach(self, m: Matrix) -> None:
        """What verify's first step saw (tests/verify/conftest.py writes it; absent when this
        plugin runs without that conftest)."""
        path = getattr(self.config, "verify_reach_path", None)
        if path is None or not Path(path).exists():
            return
        reach = Reach.from_json(Path(path).read_text())
        m.seen_by_peers = {n: reach.peers_view(n) for n in m.unreachable if n in reach.dead}
        total = len({h for names in reach.names.values() for h in names})
        m.reach_line = (
            f"first step: {total - len(reach.dead)} of {total} nodes answered over SSH in "
            f"{reach.seconds:.1f}s (--reach-timeout {reach.timeout:g}s)"
            + (f"; the probe broke: {reach.error}" if reach.error else "")
            + (
                f"; answered but not probed ({NP}): {_list(sorted(reach.probe_errors))}"
                if reach.probe_errors
                else ""
            )
        )

    # Outermost wrapper: prints after pytest's short test summary, right before its final line.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter):
        result = yield
        m = self.matrix
        if m is None:
            return result
        tr = terminalreporter
        real = [n for n in m.nodes if n != CLUSTER]
        tr.write_sep("=", f"verify matrix: {len(m.checks)} checks x {len(real)} nodes")
        host_keys = getattr(self.config, "verify_host_keys", None)
        if host_keys:
            tr.write_line(host_keys, bold=True)
        for error in self.collect_errors:
            tr.write_line(f"collection error: {error}", red=True)
        if not m.checks:
            tr.write_line("no check ran", red=True)
        for segments in render_terminal(m, tr._tw.fullwidth) if m.checks else []:
            for text, markup in segments:
                tr.write(text, **markup)
            tr.line("")
        for line in seen_lines(self.seen, self.order) + nvlink_lines(self.nvlink):
            tr.write_line(line)
        red = len(m.red_cells())
        counts = Counter(m.status(c, n) for c in m.checks for n in m.nodes)
        tr.write_line(f"matrix: {self.path}")
        if m.reach_line:
            tr.write_line(m.reach_line)
        broken = bool(red or m.unreachable)
        tr.write_line(
            (f"{dead_first(m)} -- " if m.unreachable else "")
            + f"wall time {_duration(self.wall)}: {counts[OK]} ok, {red} FAIL, {counts[NP]} {NP}, "
            f"{counts[SKIP]} skip, {len(m.unreachable)} unreachable nodes",
            bold=True,
            red=broken,
            purple=not broken and bool(counts[NP]),
            green=not (broken or counts[NP]),
        )
        return result
