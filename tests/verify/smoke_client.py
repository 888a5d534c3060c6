"""Verify's smoke experiment, driven through the Determined master's REST API.

The configurations and the trial come from deploy/experiment/smoke.py. What this module does,
with the calls and JSON field names of Determined 0.38.0's REST API (grpc-gateway camelCase, as
harness/determined/common/api/bindings.py sends and reads them):

  POST /api/v1/experiments {"config": <YAML>, "modelDefinition": [v1File], "activate": true}
  GET  /api/v1/experiments/{id}             -> {"experiment": {"state": "STATE_..."}}
  GET  /api/v1/experiments/{id}/trials      -> {"trials": [{"id", "state"}]}
  GET  /api/v1/trials/{id}/logs             -> newline-delimited {"result": {"message", ...}}
  POST /api/v1/experiments/{id}/kill, POST /api/v1/experiments/{id}/archive

The save and the allreduce experiments run at once; the restore experiment is submitted when
the save trial has printed its checkpoint's uuid. Each row's verdict is the trial's own
SMOKE-OK / SMOKE-FAIL line; a failure gets the hint of the article's troubleshooting table that
fits its message (failure_hint). The cleanup (kill, archive, remove the objects under the run's
prefix) always runs.
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

    def logs(self, trial: int) -> list[str]:
        lines = []
        for raw in self.raw("GET", f"/api/v1/trials/{trial}/logs").splitlines():
            try:
                entry = json.loads(raw).get("result") or {}
            except (ValueError, AttributeError):
                continue
            lines.append(str(entry.get("message") or entry.get("log") or "").rstrip("\n"))
        return lines

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
    "the message in the detail; `python -m deploy.experiment lint --cluster CLUSTER_YAML` on what "
    "`python -m deploy.experiment new` prints; the master's version (determined.version)",
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

_RULES: tuple[tuple[str, tuple[str, ...], Hint], ...] = (
    ("s3", ("AuthorizationHeaderMalformed", "region is wrong", "IllegalLocationConstraint"), REGION),
    ("s3", ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "Permission denied"), KEYS),
    ("s3", ("S3 403", "Forbidden", "InvalidToken"), KEYS),
    ("s3", ("NoSuchBucket",), BUCKET),
    ("s3", ("NoSuchKey", "content differs", "S3 404"), GONE),
    ("s3", ("Could not connect", "EndpointConnectionError", "ConnectTimeout", "timed out"), ENDPOINT),
    ("s3", ("Name or service not known", "Temporary failure in name resolution"), ENDPOINT),
    ("any", ("not in the image", "No module named", "neither mpi4py nor torch"), IMAGE),
    ("mpi", ("did not span two agents", "on one node"), PLACEMENT),
    ("mpi", ("Permission denied (publickey", "Host key verification", "sshd exited"), SSH),
    ("mpi", ("AllReduce", "No route", "unreachable", "timed out", "refused"), FABRIC),
    ("mpi", ("ORTE", "mpirun"), FABRIC),
)  # fmt: skip


def failure_hint(kind: str, line: str) -> Hint:
    """The hint that fits what a smoke row's failure says (its SMOKE-FAIL line, or verify's own
    line when the trial said nothing)."""
    area = "mpi" if kind == smoke.ALLREDUCE else "s3"
    for where, needles, hint in _RULES:
        if where in (area, "any") and any(n in line for n in needles):
            return hint
    if line.startswith("the master refused"):
        return REFUSED
    if line.startswith("did not finish"):
        return STUCK
    return FABRIC if area == "mpi" and "AllReduce" in line else CRASHED


# --- one smoke run ------------------------------------------------------------------------


@dataclass
class Running:
    kind: str
    experiment: int
    started: float


def _tail(lines: list[str], n: int = 5) -> list[str]:
    return [line for line in lines if line.strip()][-n:]


class Smoke:
    """Submit, poll and judge the three smoke experiments; `run()` returns {kind: Row} and
    always ends every experiment it submitted and removes the checkpoint objects (`cleanup`)."""

    def __init__(self, api: Api, target: Target, run_id: str, allreduce_slots: int | None, remove_prefix):
        self.api, self.target, self.run_id = api, target, run_id
        self.allreduce_slots = allreduce_slots  # None: no two agents to run it on
        self.remove_prefix = remove_prefix  # callable(prefix) -> str: what the cleanup removed
        self.rows = {kind: Row(kind) for kind in smoke.KINDS}
        self.submitted: list[int] = []
        self.cleanup_notes: list[str] = []
        self.saved_uuid: str | None = None

    def submit(self, kind: str, **kwargs) -> Running | None:
        row = self.rows[kind]
        started = time.monotonic()
        try:
            experiment = self.api.create(smoke.config_yaml(self.target, kind, self.run_id, **kwargs))
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
        messages = [m for trial in trials for m in self.api.logs(int(trial["id"]))]
        said = smoke.outcome(running.kind, messages)
        if said is not None and said.ok and state == "STATE_COMPLETED":
            self.judge_line(row, said.line, running.started, ok=True)
            self.saved_uuid = said.uuid or self.saved_uuid
            return
        if said is not None and not said.ok:
            line = said.line
        elif state not in TERMINAL:
            trial_states = ", ".join(sorted({str(t.get("state")) for t in trials})) or "no trial yet"
            line = f"did not finish in {DEADLINE}s: experiment {state}, trial {trial_states}"
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
        active: list[Running] = []
        if self.allreduce_slots is None:
            self.rows[
                smoke.ALLREDUCE
            ].line = "not run: fewer than two enabled agents of one size on two nodes"
        else:
            started = self.submit(smoke.ALLREDUCE, slots=self.allreduce_slots)
            active += [started] if started else []
        save = self.submit(smoke.SAVE)
        active += [save] if save else []
        if save is None:
            self.rows[smoke.RESTORE].line = "not run: no checkpoint from the save trial"
        while active:
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
                        restore = self.submit(smoke.RESTORE, restore_uuid=self.saved_uuid)
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


# --- where the two-agent trial can run ----------------------------------------------------


def allreduce_slots(agents: list[dict], node_of) -> int | None:
    """slots_per_trial for a trial on two whole agents of one size on two different nodes:
    Determined fits a multi-agent trial onto agents of one size, each contributing all its slots
    (master/internal/rm/agentrm/fitting.go). The smallest such size; None when there is none.
    `node_of(agent id)` names the agent's node (None: unknown agent)."""
    nodes_by_size: dict[int, set[str]] = {}
    for agent in agents:
        node = node_of(str(agent.get("id")))
        slots = agent.get("slots")
        size = slots if isinstance(slots, int) else len(slots or ())
        if node is None or size < 1 or not agent.get("enabled", True):
            continue
        nodes_by_size.setdefault(size, set()).add(node)
    sizes = [size for size, nodes in sorted(nodes_by_size.items()) if len(nodes) >= 2]
    return 2 * sizes[0] if sizes else None


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
