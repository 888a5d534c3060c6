"""Verify's smoke experiment, driven through the Determined master's REST API.

The configurations and the trial come from deploy/experiment/smoke.py. What this module does,
with the calls and JSON field names of Determined 0.38.0's REST API (grpc-gateway camelCase, as
harness/determined/common/api/bindings.py sends and reads them):

  GET  /api/v1/agents                       -> {"agents": [{"id", "enabled", "draining",
                                               "slots": {id: {"enabled", "container"}}}]}
  GET  /api/v1/tasks                        -> {"allocationIdToSummary": {id: {"taskId",
                                               "name", "resources": [{"containerId"}]}}}
  POST /api/v1/experiments {"config": <YAML>, "modelDefinition": [v1File], "activate": true}
  GET  /api/v1/experiments/{id}             -> {"experiment": {"state", "name", "username"}}
  GET  /api/v1/experiments/{id}/trials      -> {"trials": [{"id", "state"}]}
  GET  /api/v1/trials/{id}/logs             -> newline-delimited {"result": {"message",
                                               "agentId", "containerId", "source", ...}}
  POST /api/v1/experiments/{id}/kill, POST /api/v1/experiments/{id}/archive

Before each row is submitted, the agents' slots say whether the slots it needs are free
(`availability`); when other users' work holds them the row is "not run: busy", naming the
experiments that hold them (a slot's container -> the allocation holding it -> its trial's
experiment, as `det slot list` joins GetAgents and GetTasks: harness/determined/cli/agent.py
list_slots), and nothing is submitted. The save and the two-agent allreduce run at once; the
restore follows the save, the single-agent allreduce the two-agent one (both want whole agents).
Each row's verdict is the trial's own SMOKE-OK / SMOKE-FAIL line; a trial whose container died
before it said anything is judged by the first error line of the container's own log
(`container_cause`). A failure gets the hint that fits its message (failure_hint). The cleanup
(kill, archive, remove the objects under the run's prefix) always runs.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from deploy import master_http
from deploy.experiment import smoke
from deploy.experiment.target import Target
from tests.verify.hints import REDEPLOY, Hint

TERMINAL = {"STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR", "STATE_DELETED"}
DEADLINE = 150  # seconds from an experiment's submission to its end: queued, pulled, run
POLL = 1.0
KILL_WAIT = 20  # seconds for a killed experiment to end before it is archived anyway
OK, FAIL, SKIP = "ok", "fail", "skip"


class SmokeError(Exception):
    """A REST call failed: one line."""


@dataclass
class Row:
    kind: str
    status: str = SKIP  # OK, FAIL, SKIP
    line: str = ""  # what the trial (or the master) said
    hint: Hint | None = None  # for FAIL: the hint that fits this failure
    seconds: float = 0.0  # submission to verdict
    experiment: int | None = None
    logs: list[str] = field(default_factory=list)  # the trial's last log lines, on failure


# --- REST ---------------------------------------------------------------------------------


def _message(raw: bytes) -> str:
    """The error message of a grpc-gateway error body ({"code", "message"}; older shapes
    {"error": {"error": ...}}), or the body's start."""
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        return raw[:200].decode(errors="replace").strip()
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            error = error.get("error") or error.get("message")
        return str(body.get("message") or error or body)[:300]
    return str(body)[:300]


class Api:
    def __init__(self, base: str, token: str, timeout: float = 15):
        self.base, self.token, self.timeout = base.rstrip("/"), token, timeout

    def raw(self, method: str, path: str, body: dict | None = None) -> bytes:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with master_http.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as e:
            raise SmokeError(f"{method} {path} -> {e.code}: {_message(e.read())}") from None
        except OSError as e:
            raise SmokeError(f"{method} {path}: {e}") from None

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        raw = self.raw(method, path, body)
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise SmokeError(f"{method} {path}: not JSON: {raw[:100]!r}") from None

    def create(self, config_yaml: str) -> int:
        body = {"config": config_yaml, "modelDefinition": smoke.model_definition(), "activate": True}
        return int(self.call("POST", "/api/v1/experiments", body)["experiment"]["id"])

    def state(self, experiment: int) -> str:
        return self.call("GET", f"/api/v1/experiments/{experiment}")["experiment"]["state"]

    def trials(self, experiment: int) -> list[dict]:
        return self.call("GET", f"/api/v1/experiments/{experiment}/trials").get("trials") or []

    def logs(self, trial: int) -> list[dict]:
        """The trial's log entries (v1TrialLogsResponse: message, agentId, containerId, rankId,
        source, stdtype, level), the message without its newline."""
        entries = []
        for raw in self.raw("GET", f"/api/v1/trials/{trial}/logs").splitlines():
            try:
                entry = json.loads(raw).get("result") or {}
            except (ValueError, AttributeError):
                continue
            message = str(entry.get("message") or entry.get("log") or "").rstrip("\n")
            entries.append({**entry, "message": message})
        return entries

    def agents(self) -> list[dict]:
        return self.call("GET", "/api/v1/agents").get("agents") or []

    def tasks(self) -> dict:
        """GET /api/v1/tasks: {allocation id: AllocationSummary} of the running allocations."""
        return self.call("GET", "/api/v1/tasks").get("allocationIdToSummary") or {}

    def experiment(self, experiment: int) -> dict:
        return self.call("GET", f"/api/v1/experiments/{experiment}").get("experiment") or {}

    def end(self, experiment: int) -> str:
        """Kill it if it still runs (the real master refuses to archive an active one), wait a
        little for it to end, archive it; what happened, in a few words."""
        state = self.state(experiment)
        if state not in TERMINAL:
            self.call("POST", f"/api/v1/experiments/{experiment}/kill")
            deadline = time.monotonic() + KILL_WAIT
            while state not in TERMINAL and time.monotonic() < deadline:
                time.sleep(0.5)
                state = self.state(experiment)
        self.call("POST", f"/api/v1/experiments/{experiment}/archive")
        return state


# --- which failure, which hint --------------------------------------------------------------

REGION = Hint(
    "the region trials sign checkpoint requests with (AWS_DEFAULT_REGION, from master.yaml's "
    "task_container_defaults) differs from MinIO's site region: every checkpoint upload fails "
    "(AuthorizationHeaderMalformed: the region is wrong)",
    "MINIO_SITE_REGION in /etc/default/minio on the storage node and storage.region must be the "
    "same (never a `region:` key in checkpoint_storage: Determined rejects it); then " + REDEPLOY,
)
KEYS = Hint(
    "checkpoint upload refused ('Permission denied'): the keys master.yaml hands trials "
    "(checkpoint_storage.access_key / secret_key) are wrong, or the bucket policy denies them",
    "try an S3 client against the endpoint with master.yaml's checkpoint_storage keys; compare "
    "them with storage.access_key / secret_key and the MinIO user's policy; then "
    + REDEPLOY
    + " (it rewrites master.yaml and restarts the master)",
)
BUCKET = Hint(
    "the checkpoint bucket master.yaml names does not exist on MinIO",
    REDEPLOY + " (it creates storage.bucket); checkpoint_storage.bucket in master.yaml",
)
ENDPOINT = Hint(
    "a trial container cannot reach the checkpoint endpoint master.yaml gives trials",
    "bridge-network containers do not read the node's /etc/hosts: checkpoint_storage.endpoint_url "
    "must be an address; `curl ENDPOINT/minio/health/ready` from the agent node; MinIO running?",
)
GONE = Hint(
    "the checkpoint the save trial wrote is gone or different when read back",
    "a bucket lifecycle rule or another writer under the prefix? `mc ls` the prefix named in the "
    "detail; MinIO's disk (storage.data_dir) healthy?",
)
FABRIC = Hint(
    "'AllReduce timeout': the ranks of a two-agent trial cannot reach each other over the "
    "inter-node (IPoIB) interface",
    "`ibstat` / `iblinkinfo` and `ip link show IFACE` on both agents named in the detail (port "
    "Down: cable, subnet manager; interface down: `ip link set IFACE up` or " + REDEPLOY + "); a "
    "firewall dropping ports 12350 (sshd) or MPI's TCP ports (`iptables-save`)",
)
SSH = Hint(
    "rank 0 cannot log in to the other container over ssh (port 12350) with the trial's key",
    "the trial's /run/determined/ssh (id_rsa, authorized_keys, mode 0700/0600) and sshd's "
    "messages in the other container's log lines; the image's openssh-server",
)
IMAGE = Hint(
    "the task image lacks what a trial needs (boto3, openssh-server, Open MPI with mpi4py or torch)",
    "determined.task_image in cluster.yaml: an image with them (Determined's own images have "
    "them); `docker run --rm IMAGE python3 -c 'import boto3'` on an agent",
)
PLACEMENT = Hint(
    "the two-container trial did not get two agents on two nodes",
    "`det slot list`: two agents of one size must be enabled and idle; agent_layout per_domain puts "
    "several agents on one node",
)
REFUSED = Hint(
    "the master refused the smoke experiment",
    "the message in the detail; `python -m deploy experiment lint --cluster FILE` on what "
    "`python -m deploy experiment new` prints; the master's version (determined.version)",
)
STUCK = Hint(
    "the smoke trial did not finish in time: queued without free slots, or its image pull or "
    "container start hangs",
    "`det slot list` / `det task list` (other jobs, disabled agents); `journalctl -u "
    "determined-agent` on the agent; `docker pull IMAGE` there",
)
CRASHED = Hint(
    "the smoke trial's container failed before the trial could say why",
    "its log lines in the detail; `journalctl -u determined-agent` on its agent (image pull, "
    "devices, Docker)",
)
PULL = Hint(
    "the agent could not pull or start the task image master.yaml gives trials "
    "(task_container_defaults.image: the smoke names no image of its own)",
    "`docker pull IMAGE` on the agent named in the detail; task_container_defaults.image in "
    "/etc/determined/master.yaml against determined.task_image in cluster.yaml "
    "(sources.registry, registry_ca); then " + REDEPLOY,
)
RESOLVE = Hint(
    "a host name the trial uses does not resolve inside its container",
    "bridge-network containers do not read the node's /etc/hosts: addresses, not names, in "
    "master.yaml (checkpoint_storage.endpoint_url, master_host); `docker run --rm IMAGE getent "
    "hosts NAME` on the agent named in the detail",
)
IFNAME = Hint(
    "the collective's socket interface (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) is not in the "
    "trial's container: a trial on one agent runs on Docker's bridge network, which has eth0 and "
    "lo only, and NCCL and Gloo fail instead of picking another interface",
    "the variables in task_container_defaults.environment_variables of "
    "/etc/determined/master.yaml must reach multi-agent (host network) trials only, or name an "
    "interface bridge containers have; then " + REDEPLOY,
)
COLLECTIVE = Hint(
    "the ranks of a single-agent trial could not allreduce inside their one container",
    "the mpirun or Gloo error in the detail; the task image's Open MPI / torch; the container's "
    "loopback and eth0 (`docker run --rm IMAGE ip addr` on the agent named in the detail)",
)
LOST_DURING = "lost its connection to the master during the trial"  # lost_line's words
AGENT_RESOLVE = Hint(
    "an agent cannot resolve the master's name (master_host in its agent.yaml): it lost the "
    "master under the trial and cannot reconnect",
    "/etc/hosts on the node named in the detail: the deploy's managed block names every node "
    "(`getent hosts MASTER_HOST` there); then " + REDEPLOY,
)
AGENT_LOST = Hint(
    "an agent lost its connection to the master while the trial ran on it",
    "`journalctl -u 'determined-agent*'` on the node named in the detail; the master's port "
    "from that node (`curl http://MASTER:PORT/info`)",
)
CUDA = Hint(
    "CUDA does not start in the trial's container: the task image's CUDA needs a newer driver "
    "than the agents run, or the driver is not ready (fabric manager, module and library differ)",
    "task_container_defaults.image in /etc/determined/master.yaml against determined.task_image "
    "in cluster.yaml: an image whose CUDA major is the driver's (`nvidia-smi` prints the CUDA the "
    "driver runs) or older; for 802 `systemctl status nvidia-fabricmanager` on the agent named "
    "in the detail",
)
SINGLE_PLACEMENT = Hint(
    "the single-agent trial did not get one container with all the slots of one agent",
    "`det slot list`: an enabled agent with at least two slots, none of them held",
)

# The areas of the rows: S3 for the checkpoint rows, MPI for the two-agent allreduce (host
# network, ssh between containers), COLL for the single-agent one (one bridge container).
S3, MPI, COLL = "s3", "mpi", "coll"
ANY = (S3, MPI, COLL)
AREAS = {smoke.SAVE: S3, smoke.RESTORE: S3, smoke.ALLREDUCE: MPI, smoke.SINGLE: COLL}
RESOLVING = (
    "Could not resolve host",
    "Name or service not known",
    "Temporary failure in name resolution",
    "nodename nor servname",
    "No address associated with hostname",
)
# NCCL's bootstrap.cc ("Bootstrap : no socket interface found"; "NET/Socket : No usable
# listening interface found" with NCCL_COMM_ID), its socket transport's "NET/Socket", Gloo's
# gloo/transport/tcp/device.cc ("Unable to find address for: <iface>").
NO_INTERFACE = (
    "no socket interface found",
    "No usable listening interface found",
    "NET/Socket",
    "Unable to find address for",
)
PULLING = (
    "pull access denied",
    "manifest unknown",
    "failed to pull",
    "Error response from daemon",
    "image not found",
    "No such image",
)
MISSING = ("not in the image", "No module named", "neither mpi4py nor torch", "python3: not found")

_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], Hint], ...] = (
    ((S3,), ("AuthorizationHeaderMalformed", "region is wrong", "IllegalLocationConstraint"), REGION),
    ((S3,), ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "Permission denied"), KEYS),
    ((S3,), ("S3 403", "Forbidden", "InvalidToken"), KEYS),
    ((S3,), ("NoSuchBucket",), BUCKET),
    ((S3,), ("NoSuchKey", "content differs", "S3 404"), GONE),
    ((S3,), RESOLVING, ENDPOINT),
    ((S3,), ("Could not connect", "EndpointConnectionError", "ConnectTimeout", "timed out"), ENDPOINT),
    ((S3,), ("Connection refused",), ENDPOINT),
    (ANY, ("CUDA driver version is insufficient", "cuInit returned"), CUDA),
    (ANY, PULLING, PULL),
    (ANY, MISSING, IMAGE),
    ((MPI, COLL), RESOLVING, RESOLVE),
    ((COLL,), NO_INTERFACE, IFNAME),
    ((MPI,), NO_INTERFACE, FABRIC),
    ((COLL,), ("did not fit on one agent", "no collective between ranks"), SINGLE_PLACEMENT),
    ((MPI,), ("did not span two agents", "on one node"), PLACEMENT),
    ((MPI,), ("Permission denied (publickey", "Host key verification", "sshd exited"), SSH),
    ((MPI,), ("AllReduce", "No route", "unreachable", "timed out", "refused"), FABRIC),
    ((MPI,), ("ORTE", "mpirun"), FABRIC),
    ((COLL,), ("AllReduce", "mpirun", "ORTE", "Gloo", "refused", "timed out"), COLLECTIVE),
)  # fmt: skip


def failure_hint(kind: str, line: str) -> Hint:
    """The hint that fits what a smoke row's failure says (its SMOKE-FAIL line, verify's own
    line when the trial said nothing, or the container's first error line)."""
    area = AREAS[kind]
    if LOST_DURING in line:  # first: the agent's journal error may read like the trial's own
        return AGENT_RESOLVE if "lookup " in line.partition(LOST_DURING)[2] else AGENT_LOST
    for areas, needles, hint in _RULES:
        if area in areas and any(n in line for n in needles):
            return hint
    if line.startswith("the master refused"):
        return REFUSED
    if line.startswith("did not finish"):
        return STUCK
    return CRASHED


# --- the container's own cause, when the trial said nothing -------------------------------

# Lines that say a container failed, in the order they are trusted: the known causes first
# (whatever their position: a resolver error printed before a long traceback is the cause),
# then generic error words. A traceback's cause is its last line (the exception).
_KNOWN = RESOLVING + NO_INTERFACE + PULLING + MISSING + ("Connection refused", "An error occurred (")
_GENERIC = re.compile(r"\b(error|Error|ERROR|FATAL|fatal|Exception|refused|denied)\b")
# The master's and agent's own bookkeeping: never the cause.
_BOOKKEEPING = re.compile(
    r"^(Scheduling Trial |trial \d+ ended|container \S+ exited with code |trial failed, restarting)"
)


def _entry(item) -> dict:
    return item if isinstance(item, dict) else {"message": str(item)}


def _exception_line(lines: list[str], start: int) -> str | None:
    """The exception line that ends the traceback starting at lines[start]."""
    for line in lines[start + 1 :]:
        if line and not line.startswith((" ", "\t", "Traceback")):
            return line
    return None


@dataclass(frozen=True)
class Cause:
    line: str  # the container's first error line
    agent: str | None  # the agent whose container printed it (None: the log does not say)


def container_cause(entries: list) -> Cause | None:
    """The first line of the trial's containers' log that says why one failed, and its agent;
    None when no line looks like an error. Pure: `entries` are log entries (dicts with
    "message", "agentId", "source", "level") or plain lines."""
    rows = [_entry(e) for e in entries]
    # Leading blanks kept: they tell a traceback's frames from its exception line.
    texts = [str(e.get("message") or "").rstrip() for e in rows]

    def usable(i: int) -> bool:
        text = texts[i].strip()
        return bool(text) and not _BOOKKEEPING.match(text) and not text.startswith("SMOKE-")

    for i, text in enumerate(texts):
        if usable(i) and any(k in text for k in _KNOWN):
            return Cause(text.strip(), rows[i].get("agentId"))
    for i, text in enumerate(texts):
        if not usable(i):
            continue
        if text.startswith("Traceback"):
            return Cause((_exception_line(texts, i) or text).strip(), rows[i].get("agentId"))
        if rows[i].get("level") in ("LOG_LEVEL_ERROR", "LOG_LEVEL_CRITICAL") or _GENERIC.search(text):
            return Cause(text.strip(), rows[i].get("agentId"))
    return None


# The master's line when an agent's connection ended under a running container (the lab's
# master: "container <id> lost with agent <agent id>"); the container's own log stops there,
# since its agent shipped it: the cause is in the agent's journal on its node.
_LOST = re.compile(r"\blost with agent (\S+)")
# The agent's own error lines (logrus, as the Go agent logs: `error="..."`).
# logrus colours its keys on a terminal and wherever log.color is on (Determined's default).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_AGENT_ERROR = re.compile(r'error="((?:[^"\\]|\\.)*)"')


def lost_agent(messages: list[str]) -> str | None:
    """The agent whose connection the master lost under the trial's container, if any."""
    for message in messages:
        m = _LOST.search(message)
        if m:
            return m.group(1)
    return None


def agent_error(journal: str) -> str | None:
    """The agent's last error in its journal lines (`error="..."`), None if none."""
    found = None
    for line in journal.splitlines():
        m = _AGENT_ERROR.search(_ANSI.sub("", line))
        if m:
            found = m.group(1).replace('\\"', '"')
    return found


def lost_line(agent: str, node: str | None, error: str | None) -> str:
    where = f"{node} (agent {agent})" if node and node != agent else agent
    said = f": its journal says {error}" if error else " (its journal names no error)"
    return f"the agent on {where} {LOST_DURING}{said}"


def crash_line(cause: Cause, node_of) -> str:
    """The row's line for a container that failed before the trial's verdict."""
    where = "an unknown agent"
    if cause.agent:
        node = node_of(cause.agent)
        where = f"{node} (agent {cause.agent})" if node and node != cause.agent else cause.agent
    return f"the trial's container on {where} failed before the trial said why: {cause.line[:300]}"


# --- slots: free, or held by whom -------------------------------------------------------------


@dataclass(frozen=True)
class AgentSlots:
    id: str
    node: str | None  # the agent's node (None: not this cluster's)
    total: int
    free: int  # enabled slots that no container holds
    usable: bool  # enabled and not draining: the master schedules onto it
    holders: tuple[str, ...]  # the ids of the containers holding its slots


def agent_slots(agents: list[dict], node_of) -> list[AgentSlots]:
    """GET /api/v1/agents as slots: a slot is free when enabled and its "container" is empty
    (agentv1.Slot.container: the container holding it, from its assignment on)."""
    out = []
    for agent in agents:
        slots = agent.get("slots") or {}
        slots = slots.values() if isinstance(slots, dict) else slots
        slots = [s for s in slots if isinstance(s, dict)]
        holders = sorted({str((s.get("container") or {}).get("id")) for s in slots if s.get("container")})
        free = sum(1 for s in slots if not s.get("container") and s.get("enabled", True))
        usable = bool(agent.get("enabled", True)) and not agent.get("draining", False)
        out.append(
            AgentSlots(
                str(agent.get("id")), node_of(str(agent.get("id"))), len(slots), free, usable, tuple(holders)
            )
        )
    return out


def _mine(agents: list[AgentSlots]) -> list[AgentSlots]:
    return [a for a in agents if a.node is not None and a.usable and a.total > 0]


def allreduce_slots(agents: list[dict], node_of) -> int | None:
    """slots_per_trial for a trial on two whole agents of one size on two different nodes:
    Determined fits a multi-agent trial onto agents of one size, each contributing all its slots
    (master/internal/rm/agentrm/fitting.go). The smallest such size; None when there is none.
    `node_of(agent id)` names the agent's node (None: unknown agent)."""
    nodes_by_size: dict[int, set[str]] = {}
    for a in _mine(agent_slots(agents, node_of)):
        nodes_by_size.setdefault(a.total, set()).add(str(a.node))
    sizes = [size for size, nodes in sorted(nodes_by_size.items()) if len(nodes) >= 2]
    return 2 * sizes[0] if sizes else None


def single_slots(agents: list[dict], node_of) -> int | None:
    """slots_per_trial for the single-agent row: all the slots of the largest enabled agent of
    this cluster (a trial that fits on one agent gets one container there); None without an
    agent of two slots or more (one rank has no collective to try)."""
    size = max((a.total for a in _mine(agent_slots(agents, node_of))), default=0)
    return size if size >= 2 else None


def blocking(kind: str, slots: int, agents: list[AgentSlots]) -> tuple[str, ...] | None:
    """None when the slots `kind`'s trial needs are free now; else the containers holding the
    slots it could use (empty: none is held, the agents are too few or disabled)."""
    mine = _mine(agents)
    if kind == smoke.ALLREDUCE:
        size = slots // 2
        fitting = [a for a in mine if a.total == size]
        idle_nodes = {a.node for a in fitting if a.free == a.total}
        if len(idle_nodes) >= 2:
            return None
    elif kind == smoke.SINGLE:
        fitting = [a for a in mine if a.total >= slots]
        if any(a.free >= slots for a in fitting):
            return None
    else:
        fitting = mine
        if any(a.free >= slots for a in fitting):
            return None
    return tuple(sorted({h for a in fitting for h in a.holders}))


_EXPERIMENT_OF_TASK = re.compile(r"([0-9]+)\.")  # a trial's task id: <experiment id>.<uuid>
_EXPERIMENT_IN_NAME = re.compile(r"\(Experiment ([0-9]+)\)")  # "Trial 5 (Experiment 3)"


def holders_of(containers: tuple[str, ...], summaries: dict) -> dict[str, int | str]:
    """{container id: experiment id, or the allocation's name for other tasks (a notebook, a
    command), or the container id when no allocation claims it}, from GET /api/v1/tasks."""
    by_container: dict[str, dict] = {}
    for summary in summaries.values():
        for resources in summary.get("resources") or []:
            if resources.get("containerId"):
                by_container[str(resources["containerId"])] = summary
    out: dict[str, int | str] = {}
    for cid in containers:
        summary = by_container.get(cid)
        if summary is None:
            out[cid] = f"container {cid}"
            continue
        name = str(summary.get("name") or "")
        m = _EXPERIMENT_IN_NAME.search(name) or _EXPERIMENT_OF_TASK.match(str(summary.get("taskId") or ""))
        out[cid] = int(m.group(1)) if m else (name or f"task {summary.get('taskId')}")
    return out


def busy_line(kind: str, slots: int, named: list[str]) -> str:
    need = {
        smoke.ALLREDUCE: f"two whole agents of {slots // 2} slots on two nodes",
        smoke.SINGLE: f"all {slots} slots of one agent",
    }.get(kind, f"{slots} slot")
    if not named:
        return f"not run: busy: no {need} free (no container holds them: agents disabled or draining?)"
    return f"not run: busy: {need} wanted, held by {', '.join(named)}"


# --- one smoke run ------------------------------------------------------------------------


@dataclass
class Running:
    kind: str
    experiment: int
    started: float


def _tail(lines: list[str], n: int = 5) -> list[str]:
    return [line for line in lines if line.strip()][-n:]


FREE, OURS, BUSY = "free", "ours", "busy"


class Smoke:
    """Submit, poll and judge the smoke experiments; `run()` returns {kind: Row} and always
    ends every experiment it submitted and removes the checkpoint objects (`cleanup`)."""

    def __init__(self, api: Api, target: Target, run_id: str, remove_prefix, node_of, journal=None):
        self.api, self.target, self.run_id = api, target, run_id
        self.remove_prefix = remove_prefix  # callable(prefix) -> str: what the cleanup removed
        self.node_of = node_of  # agent id -> this cluster's node, or None
        # node -> its agents' recent journal lines, or None (could not read): where a lost
        # agent's cause is, since its container's log ended with the agent's connection.
        self.journal = journal
        self.rows = {kind: Row(kind) for kind in smoke.KINDS}
        self.slots: dict[str, int | None] = {}
        self.submitted: list[int] = []
        self.cleanup_notes: list[str] = []
        self.saved_uuid: str | None = None

    # -- slots
    def availability(self, kind: str) -> tuple[str, str]:
        """FREE, OURS (only this run's own trials hold the slots: wait) or BUSY with the row's
        "not run: busy" line naming the other experiments that hold them."""
        slots = self.slots[kind] or 1
        held = blocking(kind, slots, agent_slots(self.api.agents(), self.node_of))
        if held is None:
            return FREE, ""
        try:
            owners = holders_of(held, self.api.tasks()) if held else {}
        except SmokeError:  # a master without GetTasks: the containers still say it is busy
            owners = {cid: f"container {cid}" for cid in held}
        others = sorted({o for o in owners.values() if o not in self.submitted}, key=str)
        if held and not others:
            return OURS, ""
        return BUSY, busy_line(kind, slots, [self.describe(o) for o in others])

    def describe(self, owner: int | str) -> str:
        if isinstance(owner, str):
            return owner
        try:
            exp = self.api.experiment(owner)
        except SmokeError:
            return f"experiment {owner}"
        user = f" ({exp['username']})" if exp.get("username") else ""
        return f"experiment {owner} {json.dumps(str(exp.get('name') or ''))}{user}"

    def start(self, kind: str, **kwargs) -> Running | None:
        """Submit `kind` when its slots are free; a busy row is a skip with the holders named."""
        state, line = self.availability(kind)
        if state == BUSY:
            self.rows[kind].line = line
            return None
        return self.submit(kind, **kwargs)

    def submit(self, kind: str, **kwargs) -> Running | None:
        row = self.rows[kind]
        started = time.monotonic()
        slots = self.slots.get(kind) or 1
        try:
            config = smoke.config_yaml(self.target, kind, self.run_id, slots=slots, **kwargs)
            experiment = self.api.create(config)
        except SmokeError as e:
            self.judge_line(row, f"the master refused the experiment: {e}", started)
            return None
        self.submitted.append(experiment)
        row.experiment = experiment
        return Running(kind, experiment, started)

    def judge_line(self, row: Row, line: str, started: float, ok: bool = False) -> None:
        row.status, row.line = (OK if ok else FAIL), line
        row.seconds = time.monotonic() - started
        row.hint = None if ok else failure_hint(row.kind, line)

    def judge(self, running: Running, state: str) -> None:
        """The row of a finished (or timed-out) experiment, from its trials' log lines."""
        row = self.rows[running.kind]
        trials = self.api.trials(running.experiment)
        entries = [_entry(e) for trial in trials for e in self.api.logs(int(trial["id"]))]
        messages = [str(e.get("message") or "") for e in entries]
        said = smoke.outcome(running.kind, messages)
        if said is not None and said.ok and state == "STATE_COMPLETED":
            self.judge_line(row, said.line, running.started, ok=True)
            self.saved_uuid = said.uuid or self.saved_uuid
            return
        cause = container_cause(entries) if said is None else None
        # Also after a verdict of success: rank 0 may have finished before another container's
        # agent was lost, and the experiment then ended in error.
        lost = lost_agent(messages)
        if said is not None and not said.ok:
            line = said.line
        elif lost is not None:
            node = self.node_of(lost)
            text = self.journal(node) if self.journal is not None and node else None
            line = lost_line(lost, node, agent_error(text) if text else None)
        elif state not in TERMINAL:
            trial_states = {str(t.get("state")) for t in trials}
            if trial_states <= {"STATE_QUEUED"}:
                # Never scheduled: other users' work that took the slots after the check is
                # "busy", as before the submission; a trial that ran and hangs stays red.
                free, busy = self.availability(running.kind)
                if free == BUSY:
                    row.line, row.experiment = (
                        busy.replace("not run:", "queued, not run:", 1),
                        running.experiment,
                    )
                    row.seconds = time.monotonic() - running.started
                    return
            shown = ", ".join(sorted(trial_states)) or "no trial yet"
            line = f"did not finish in {DEADLINE}s: experiment {state}, trial {shown}"
        elif cause is not None:
            line = crash_line(cause, self.node_of)
        else:
            last = " | ".join(_tail(messages, 3)) or "no log lines"
            line = f"experiment {state} without a verdict from the trial: {last}"
        self.judge_line(row, line, running.started)
        row.logs = _tail(messages, 12)

    def run(self) -> dict[str, Row]:
        try:
            self._run()
        finally:
            self.cleanup()
        return self.rows

    def _run(self) -> None:
        # Long: the four rows' order in one place (which run together, which after which), as the
        # module docstring tells it
        agents = self.api.agents()
        self.slots = {
            smoke.SAVE: 1,
            smoke.RESTORE: 1,
            smoke.ALLREDUCE: allreduce_slots(agents, self.node_of),
            smoke.SINGLE: single_slots(agents, self.node_of),
        }
        unplaceable = {
            smoke.ALLREDUCE: "not run: fewer than two enabled agents of one size on two nodes",
            smoke.SINGLE: "not run: no enabled agent with two slots or more",
        }
        # Every row's slots checked before anything is submitted: other users' work makes a
        # row "busy" at once, never a trial queued until the deadline.
        todo = []
        for kind in (smoke.ALLREDUCE, smoke.SINGLE, smoke.SAVE):
            if self.slots[kind] is None:
                self.rows[kind].line = unplaceable[kind]
                continue
            state, line = self.availability(kind)
            if state == BUSY:
                self.rows[kind].line = line
            else:
                todo.append(kind)
        if smoke.SAVE not in todo:
            self.rows[smoke.RESTORE].line = self.rows[smoke.SAVE].line or "not run: no checkpoint"
        active: list[Running] = []
        for kind in (smoke.ALLREDUCE, smoke.SAVE):
            if kind in todo:
                running = self.submit(kind)
                if running:
                    active.append(running)
                elif kind == smoke.SAVE:
                    self.rows[smoke.RESTORE].line = "not run: no checkpoint from the save trial"
        # The single-agent row once the two-agent one is over (both want whole agents) and
        # this run's own trials have left it an agent.
        waiting = smoke.SINGLE in todo
        release_deadline: float | None = None
        while active or waiting:
            if waiting and not any(r.kind == smoke.ALLREDUCE for r in active):
                state, line = self.availability(smoke.SINGLE)
                if state == FREE:
                    waiting = False
                    single = self.submit(smoke.SINGLE)
                    active += [single] if single else []
                elif state == BUSY:
                    waiting = False
                    self.rows[smoke.SINGLE].line = line
                elif not active:  # OURS with nothing of ours running: the master is releasing
                    release_deadline = release_deadline or time.monotonic() + KILL_WAIT
                    if time.monotonic() > release_deadline:
                        waiting = False
                        self.rows[
                            smoke.SINGLE
                        ].line = (
                            f"not run: this run's own ended trials still held the slots after {KILL_WAIT}s"
                        )
            time.sleep(POLL)
            for running in list(active):
                state = self.api.state(running.experiment)
                late = time.monotonic() - running.started > DEADLINE
                if state not in TERMINAL and not late:
                    continue
                active.remove(running)
                self.judge(running, state)
                if running.kind == smoke.SAVE:
                    if self.rows[smoke.SAVE].status == OK and self.saved_uuid:
                        restore = self.start(smoke.RESTORE, restore_uuid=self.saved_uuid)
                        active += [restore] if restore else []
                    else:
                        self.rows[smoke.RESTORE].line = "not run: no checkpoint from the save trial"

    def cleanup(self) -> None:
        for experiment in self.submitted:
            try:
                state = self.api.end(experiment)
                self.cleanup_notes.append(f"experiment {experiment} ({state}) archived")
            except SmokeError as e:
                self.cleanup_notes.append(f"experiment {experiment}: not archived: {e}")
        try:
            self.cleanup_notes.append(self.remove_prefix(smoke.smoke_prefix(self.target, self.run_id)))
        except Exception as e:  # the storage may be what is broken: say so, never raise here
            self.cleanup_notes.append(f"checkpoint objects not removed: {type(e).__name__}: {e}")


_AGENT = re.compile(r"(?P<node>.+?)(-[0-9]+)?")


def node_of_agent(hostnames: set[str]):
    """agent id -> node hostname: the deploy names agents after their node (per_node) or
    <hostname>-<i> (per_domain)."""

    def node_of(agent_id: str) -> str | None:
        if agent_id in hostnames:
            return agent_id
        m = _AGENT.fullmatch(agent_id)
        return m["node"] if m and m["node"] in hostnames else None

    return node_of
