"""verify's first step: which nodes answer, which peers each node reaches, and whose fault a
path that fails is.

Run once per verify run by the process that drives it (pytest-xdist's controller, or the lone
pytest process), while the workers start (tests/verify/conftest.py), for every node at once:
1. an SSH connection made as the checks make theirs (same user, key, host key rules), each
   stage bounded by --reach-timeout (TCP connect, SSH banner, authentication): a node that
   does not answer costs that bound once, in parallel with every other node;
2. over that connection, one command (PROBE) that connects to the SSH port of every node's
   management and IPoIB name at once, each connect bounded the same way.
The results go to the workers as JSON files (`Published` reads them): each node's verdict as
soon as its login succeeded or failed, so that the checks of the nodes that answer start while
a dead one is still being waited for; the whole result once every probe is done. A node found
dead here is never connected to again (each of its checks reports SSH at setup, and `host_of`
refuses it at once), and the cross-node checks (run last on each worker) assert on `blame()` of
everyone's views instead of probing again.

Blame (docs/verify.md "Who is to blame"): a path A -> B that fails is B's problem when most
of the nodes that tried B failed too, A's problem when A fails towards most of the peers the
other nodes reach, and A's (naming B) when neither: a majority decides, so one dead node or
one node with its link down turns one cell red, not every node's.

A node that answered SSH but whose probe did not run (the channel did not open, no python3, the
first step itself broke) has no view: it is "not probed" (`not_probed`, the matrix's `n/p`),
neither a broken path nor a dead node, and blame() does not count it against its peers. Its
peers' views of it still count: a node nobody reaches is red whether or not it probed.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import paramiko

DEFAULT_TIMEOUT = 5.0  # seconds: --reach-timeout
MANAGEMENT, IPOIB = "management", "IPoIB"
NETWORKS = (MANAGEMENT, IPOIB)
MAX_PARALLEL = 64  # SSH handshakes in flight from this machine at once


def probe_bound(timeout: float) -> float:
    """How long one attempt to open the probe's session, and then its run, may take.

    Each of the probe's connects waits at most `timeout`, refused ones are tried 3 times. The
    session's opening gets the same bound: on a node under load sshd took more than 30 s to open
    one with the node up (64-node bench, 2 cores), because sshd opens the PAM session
    (pam_systemd waits for root's user manager, user@0.service) before it serves any channel
    request: the node answers TCP and authenticates, then the channel times out."""
    return 4 * timeout + 40


def worst_case(timeout: float) -> float:
    """The prober's longest wait for one node: three login stages (TCP, banner, auth), two
    attempts to open the session (one retry, run_probe) and the probe's run."""
    return 3 * timeout + 3 * probe_bound(timeout)


# No ping on a minimal node; a TCP connect to sshd by name proves /etc/hosts and the path.
# Every name at once (threads, at most 64 connects in flight), each connect bounded by the
# timeout. A refused or reset connect is tried again (sshd's MaxStartups drops excess
# unauthenticated connections); a timeout, no route or unknown name is not: a second wait
# would only double what a dead peer costs.
PROBE = """
import json, socket, sys, threading, time
timeout, port, names = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
result, slots = {}, threading.BoundedSemaphore(64)
def probe(name):
    with slots:
        for attempt in range(3):
            try:
                socket.create_connection((name, port), timeout).close()
                result[name] = ""
                return
            except ConnectionError as e:
                result[name] = str(e)
                time.sleep(0.3 * (attempt + 1))
            except OSError as e:
                result[name] = str(e) or type(e).__name__
                return
threads = [threading.Thread(target=probe, args=(n,)) for n in dict.fromkeys(names)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(result))
"""


# This process's view of the results (tests/verify/conftest.py sets it): for code that gets no
# fixture, such as the master's REST API helpers (tests/verify/master_api.py).
CURRENT: Published | None = None


def raise_if_dead(node) -> None:
    """NodeUnreachable when this run's first step found `node` dead; else nothing."""
    if CURRENT is not None:
        CURRENT.raise_if_dead(node)


class NodeUnreachable(Exception):
    """A node the reachability probe found dead: what needs it reports SSH without trying
    again. kind / reason / target as tests/verify/matrix.py ssh_problem gives them."""

    def __init__(self, hostname: str, kind: str, reason: str, target: str):
        super().__init__(reason)
        self.hostname, self.kind, self.reason, self.target = hostname, kind, reason, target


@dataclass
class Reach:
    timeout: float
    seconds: float = 0.0  # wall time of the probe
    dead: dict[str, list[str]] = field(default_factory=dict)  # hostname -> [kind, reason, target]
    views: dict[str, dict[str, str]] = field(default_factory=dict)  # prober -> {name: error or ""}
    probe_errors: dict[str, str] = field(default_factory=dict)  # answered SSH, probe failed
    names: dict[str, dict[str, str]] = field(default_factory=dict)  # network -> {hostname: name}
    error: str = ""  # the probe itself broke: no node is taken for dead, cross-node cells are n/p

    def __post_init__(self):
        self._blame: dict[str, dict[str, list[str]]] = {}  # per network, decided once (O(N^2))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Reach:
        return cls(**json.loads(text))

    def raise_if_dead(self, node) -> None:
        if node.hostname in self.dead:
            kind, reason, target = self.dead[node.hostname]
            raise NodeUnreachable(node.hostname, kind, reason, target)

    def blame_of(self, hostname: str, network: str) -> list[str]:
        """What of `network`'s failures is this node's to fix (empty: no path found broken;
        see not_probed for whether its own view was there to look at)."""
        if network not in self._blame:
            self._blame[network] = blame(self.names.get(network, {}), self.views)
        return self._blame[network].get(hostname, [])

    def not_probed(self, hostname: str) -> str:
        """Why this node's paths to its peers were not tested ("" when its probe ran). Not a
        broken path nor a dead node: the cross-node cells say n/p (tests/verify/matrix.py)."""
        if self.error:  # no node's view exists: nothing was tested anywhere
            return f"the reachability probe failed: {self.error}"
        if hostname in self.probe_errors:
            return f"could not probe its peers: {self.probe_errors[hostname]}"
        return ""

    def peers_view(self, hostname: str) -> str:
        """For a node this machine cannot reach: whether the nodes that answered reach it."""
        tried = [p for p in self.views if p != hostname]
        if not tried:
            return "no other node answered to ask"
        parts = []
        for network in NETWORKS:
            name = self.names.get(network, {}).get(hostname)
            if name is None:  # not on this network (names from network_names): nothing to say
                continue
            failed = [p for p in tried if self.views[p].get(name)]
            if failed and len(failed) == len(tried):
                parts.append(f"none of the {len(tried)} nodes that answered reaches it on {network}")
            elif failed:
                parts.append(f"{len(tried) - len(failed)} of {len(tried)} nodes reach it on {network}")
            else:
                parts.append(f"every node that answered reaches it on {network}")
        if all(p.startswith("none") for p in parts):
            return "; ".join(parts) + ": the node is down or cut off"
        return "; ".join(parts) + ": this machine's own path or login to it is what fails"


def network_names(cluster) -> dict[str, dict[str, str]]:
    return {
        MANAGEMENT: {n.hostname: n.hostname for n in cluster.nodes},
        IPOIB: {n.hostname: n.ipoib_name for n in cluster.nodes},
    }


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run(
    cluster,
    connect: Callable,
    classify: Callable,
    timeout: float = DEFAULT_TIMEOUT,
    on_answer: Callable[[str, list[str] | None], None] = lambda hostname, dead: None,
) -> Reach:
    """Ask every node at once. `connect(node, timeout)` returns a connected paramiko
    SSHClient; `classify(exception)` is matrix.ssh_problem: (kind, reason, target) or None;
    `on_answer(hostname, dead)` hears each node's verdict as soon as it is known (dead: None
    when the login succeeded, else [kind, reason, target])."""
    started = time.monotonic()
    names = network_names(cluster)
    every = [name for network in NETWORKS for name in names[network].values()]
    port = cluster.ssh.port
    command = " ".join(
        ["python3", "-c", shlex.quote(PROBE), str(timeout), str(port), *map(shlex.quote, every)]
    )
    reach = Reach(timeout=timeout, names=names)

    def ask(node):
        target = f"{node.address}:{port}"
        try:
            client = connect(node, timeout)
        except Exception as e:
            # Everything connect() raises is about reaching the node, from paramiko or not.
            timed_out = isinstance(e, TimeoutError) or "timed out" in str(e)
            kind, reason, _ = classify(e) or (
                ("timeout", f"SSH to {target}: connection timed out", None)
                if timed_out
                else ("other", f"SSH to {target}: {type(e).__name__}: {e}", None)
            )
            if kind == "timeout":
                reason += f" (within {timeout:g}s, --reach-timeout)"
            reach.dead[node.hostname] = [kind, reason, target]
            on_answer(node.hostname, reach.dead[node.hostname])
            return
        on_answer(node.hostname, None)
        try:
            stdout, stderr = run_probe(client, command, probe_bound(timeout))
            out, err = stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
            status = stdout.channel.recv_exit_status()
            if status != 0:
                last = (err.strip().splitlines() or ["no output"])[-1]
                reach.probe_errors[node.hostname] = _short(f"python3 -c PROBE -> exit {status}: {last}")
            else:
                reach.views[node.hostname] = json.loads(out)
        except Exception as e:
            reach.probe_errors[node.hostname] = _short(f"python3 -c PROBE: {type(e).__name__}: {e}")
        finally:
            client.close()

    nodes = list(cluster.nodes)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(nodes)))) as pool:
        list(pool.map(ask, nodes))
    reach.seconds = time.monotonic() - started
    return reach


def run_probe(client, command: str, bound: float):
    """(stdout, stderr) of `command` over `client`, the session's opening tried twice.

    paramiko's exec_command opens a session channel, bounded by `bound` ("Timeout opening
    channel."), then sends the exec request; its SSHException means the probe did not start, so
    a second try is safe (the probe only connects). The retry goes over the same connection: its
    PAM session is what sshd was still opening (probe_bound), a new login would start it again.
    A failure after that (reading the output) is not retried: the probe ran, for up to `bound`."""
    try:
        _, stdout, stderr = client.exec_command(command, timeout=bound)
    except paramiko.SSHException as first:
        try:
            _, stdout, stderr = client.exec_command(command, timeout=bound)
        except paramiko.SSHException as second:
            both = (
                f"{second} (twice, {bound:g}s each)"
                if str(first) == str(second)
                else f"{first}; again: {second}"
            )
            raise paramiko.SSHException(both) from second
    return stdout, stderr


def blame(names: dict[str, str], views: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """{hostname: its share of one network's failures} by majority.

    `names` maps every node to its name on the network; `views` each node whose probe ran (a
    prober) to {name: error or ""}. A node most of whose probers fail to reach it ("nobody
    reaches it") takes those failures; a prober that fails towards most of the peers the others
    reach takes its own; what remains (a path between two nodes that otherwise work) goes to
    the prober, naming the peer, as a firewall between two nodes shows. A node whose probe did
    not run has no view: it is a peer the probers try, never a prober that failed."""
    probers = [h for h in names if h in views]

    def err(a: str, b: str) -> str | None:  # None: not probed
        return views[a].get(names[b])

    out: dict[str, list[str]] = {h: [] for h in names}
    unreached: dict[str, str] = {}  # node -> "none of its 3 peers reach NAME (...)"
    for b in names:
        tried = [a for a in probers if a != b and err(a, b) is not None]
        failed = [a for a in tried if err(a, b)]
        if tried and 2 * len(failed) > len(tried):
            who = "none" if len(failed) == len(tried) else f"only {len(tried) - len(failed)}"
            seen = "; ".join(f"{a}: {err(a, b)}" for a in failed[:2])
            unreached[b] = f"{who} of its {len(tried)} peers reach {names[b]} ({seen})"
    isolated: dict[str, str] = {}  # node -> "it reaches none of the 3 peers ... (...)"
    for a in probers:
        others = [b for b in names if b != a and b not in unreached and err(a, b) is not None]
        failed = [b for b in others if err(a, b)]
        if others and 2 * len(failed) > len(others):
            count = "none" if len(failed) == len(others) else f"only {len(others) - len(failed)}"
            seen = "; ".join(f"-> {names[b]}: {err(a, b)}" for b in failed[:2])
            isolated[a] = f"it reaches {count} of the {len(others)} peers the others reach ({seen})"
    majority = "majority: the fault is at this end"
    for h in names:
        if h in unreached and h in isolated:
            out[h].append(
                f"cut off ({majority}: its link, route or /etc/hosts): {unreached[h]}; {isolated[h]}"
            )
        elif h in unreached:
            out[h].append(f"{majority}: {unreached[h]}")
        elif h in isolated:
            out[h].append(f"{majority} (its link, route or /etc/hosts): {isolated[h]}")
    for a in probers:
        if err(a, a):
            out[a].append(f"cannot reach its own name {names[a]}: {err(a, a)}")
        if a in isolated:
            continue
        for b in names:
            if b != a and b not in unreached and err(a, b):
                out[a].append(f"-> {names[b]}: {err(a, b)} (the others reach it)")
    return out


# --- the files between the process that probes and the workers that check ------------------

RESULT = "reach.json"


def verdict_file(directory: Path, hostname: str) -> Path:
    return directory / f"node-{hostname}.json"  # hostnames are checked names: safe file names


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


class Published:
    """What a process checking nodes knows of the first step: a node's verdict as soon as the
    prober wrote it, the whole result (views, blame) once it is complete. Waits are bounded:
    the prober's own worst case (worst_case: the login stages, the session's opening with its
    retry, the probe command) and a minute more."""

    def __init__(self, directory: Path | None, timeout: float, why: str = ""):
        self.directory, self.timeout, self.why = directory, timeout, why
        self.deadline: float | None = None
        self._verdicts: dict[str, list[str] | None] = {}
        self._full: Reach | None = None

    def _read(self, path: Path, or_else: Path | None = None) -> str | None:
        """`path`'s text once it exists (or "" once `or_else` does), None past the deadline."""
        if self.deadline is None:
            self.deadline = time.monotonic() + worst_case(self.timeout) + 60
        while not path.exists():
            if or_else is not None and or_else.exists():
                return ""
            if time.monotonic() > self.deadline:
                return None
            time.sleep(0.02)
        return path.read_text()

    def full(self) -> Reach:
        if self._full is None:
            if self.directory is None:
                self._full = Reach(timeout=self.timeout, error=self.why or "verify's first step did not run")
            else:
                text = self._read(self.directory / RESULT)
                self._full = (
                    Reach.from_json(text)
                    if text is not None
                    else Reach(timeout=self.timeout, error=f"no result in {self.directory} in time")
                )
        return self._full

    def dead(self, hostname: str) -> list[str] | None:
        """[kind, reason, target] when the node did not answer, None when it did."""
        if self._full is not None or self.directory is None:
            return self.full().dead.get(hostname)
        if hostname not in self._verdicts:
            mine, whole = verdict_file(self.directory, hostname), self.directory / RESULT
            text = self._read(mine, whole)
            if text is None or not mine.exists():  # the whole result came first (or nothing did)
                return self.full().dead.get(hostname)
            self._verdicts[hostname] = json.loads(text)["dead"]
        return self._verdicts[hostname]

    def raise_if_dead(self, node) -> None:
        found = self.dead(node.hostname)
        if found:
            raise NodeUnreachable(node.hostname, *found)

    def blame_of(self, hostname: str, network: str) -> list[str]:
        return self.full().blame_of(hostname, network)

    def not_probed(self, hostname: str) -> str:
        return self.full().not_probed(hostname)
