"""verify's first step (tests/verify/reach.py): the probe script, the parallel bounded run, and
blame by majority. No root, no lab: the probe runs against loopback ports."""

import json
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import paramiko
import pytest

from tests.verify import reach
from tests.verify.matrix import ssh_problem

NODES = ["m", "g1", "g2", "g3"]
NAMES = {h: f"{h}-ib0" for h in NODES}


def views(failing: set[tuple[str, str]], probers=NODES) -> dict[str, dict[str, str]]:
    """Every prober's view of every node's name; (a, b) in `failing`: a cannot reach b."""
    return {a: {NAMES[b]: ("timed out" if (a, b) in failing else "") for b in NODES} for a in probers}


def test_all_reach_all():
    assert reach.blame(NAMES, views(set())) == {h: [] for h in NODES}


def test_a_dead_node_is_blamed_alone():
    # g2 did not answer SSH (no view of its own); nobody reaches it.
    found = reach.blame(NAMES, views({(a, "g2") for a in NODES}, probers=["m", "g1", "g3"]))
    assert [h for h, lines in found.items() if lines] == ["g2"]
    assert found["g2"][0].startswith("majority: the fault is at this end: none of its 3 peers reach g2-ib0 (")


def test_a_node_cut_off_is_red_on_its_own_cell_only():
    # g1's link is down: it reaches nobody, nobody reaches it; the others reach each other.
    failing = {("g1", b) for b in NODES} | {(a, "g1") for a in NODES}
    found = reach.blame(NAMES, views(failing))
    assert [h for h, lines in found.items() if lines] == ["g1"]
    cut_off, own = found["g1"]
    assert cut_off.startswith("cut off (majority: the fault is at this end: its link, route or /etc/hosts): ")
    assert "none of its 3 peers reach g1-ib0 (m: timed out; g2: timed out)" in cut_off
    assert (
        "it reaches none of the 3 peers the others reach (-> m-ib0: timed out; -> g2-ib0: timed out)"
        in cut_off
    )
    assert own == "cannot reach its own name g1-ib0: timed out"


def test_a_node_that_reaches_nobody_but_is_reached():
    # g3's outgoing path fails (e.g. its /etc/hosts lacks the names): its cell, not theirs.
    found = reach.blame(NAMES, views({("g3", b) for b in NODES if b != "g3"}))
    assert [h for h, lines in found.items() if lines] == ["g3"]
    assert found["g3"][0].startswith("majority: the fault is at this end (its link, route or /etc/hosts): ")
    assert "it reaches none of the 3 peers the others reach" in found["g3"][0]


def test_a_firewall_between_two_names_both_ends_and_blames_no_one_else():
    found = reach.blame(NAMES, views({("g1", "g2"), ("g2", "g1")}))
    assert found["g1"] == ["-> g2-ib0: timed out (the others reach it)"]
    assert found["g2"] == ["-> g1-ib0: timed out (the others reach it)"]
    assert found["m"] == found["g3"] == []


def test_two_dead_nodes_do_not_make_the_rest_look_isolated():
    found = reach.blame(NAMES, views({(a, b) for a in NODES for b in ("g2", "g3")}, probers=["m", "g1"]))
    assert found["m"] == found["g1"] == []
    assert found["g2"] and found["g3"]


def make_reach(dead=(), failing=frozenset(), probers=NODES):
    names = {reach.MANAGEMENT: {h: h for h in NODES}, reach.IPOIB: dict(NAMES)}
    seen = {
        a: {n: ("timed out" if (a, h) in failing else "") for h in NODES for n in (h, NAMES[h])}
        for a in probers
    }
    return reach.Reach(
        timeout=2,
        dead={
            h: ["unreachable", f"SSH to 10.0.0.{i}:22: no route to host", f"10.0.0.{i}:22"]
            for i, h in enumerate(dead)
        },
        views=seen,
        names=names,
    )


def test_peers_view_tells_a_dead_node_from_this_machines_path():
    dead = make_reach(dead=["g2"], failing={(a, "g2") for a in NODES}, probers=["m", "g1", "g3"])
    assert dead.peers_view("g2").endswith("the node is down or cut off")
    assert dead.blame_of("m", reach.MANAGEMENT) == []
    # Only this machine cannot log in: its peers reach it.
    login = make_reach(dead=["g2"], probers=["m", "g1", "g3"])
    assert login.peers_view("g2").endswith("this machine's own path or login to it is what fails")


def test_dead_node_raises_node_unreachable_the_matrix_reads_as_ssh():
    r = make_reach(dead=["g2"], probers=["m", "g1", "g3"])
    with pytest.raises(reach.NodeUnreachable) as caught:
        r.raise_if_dead(SimpleNamespace(hostname="g2"))
    assert ssh_problem(caught.value) == ("unreachable", "SSH to 10.0.0.0:22: no route to host", "10.0.0.0:22")
    r.raise_if_dead(SimpleNamespace(hostname="g1"))  # alive: nothing
    assert reach.Reach.from_json(r.to_json()) == r


TIMEOUT_OPENING = "python3 -c PROBE: SSHException: Timeout opening channel. (twice, 44s each)"


def test_a_node_whose_probe_did_not_run_is_not_probed_not_failed():
    # g1 answered SSH but its probe did not run: no view of its own (run() never records one).
    r = make_reach(probers=["m", "g2", "g3"])
    r.probe_errors["g1"] = TIMEOUT_OPENING
    for network in reach.NETWORKS:
        assert r.blame_of("g1", network) == []
        # Its peers are not blamed either: g1's missing view counts as no view, not a failed one.
        assert all(r.blame_of(h, network) == [] for h in NODES)
    assert r.not_probed("g1") == f"could not probe its peers: {TIMEOUT_OPENING}"
    assert [h for h in NODES if r.not_probed(h)] == ["g1"]
    assert reach.Reach.from_json(r.to_json()).not_probed("g1") == r.not_probed("g1")


def test_blame_does_not_count_a_node_without_a_view():
    # Two live probers: m fails towards g3, g2 reaches it. Were g1 (not probed) counted as a
    # prober failing towards everyone, g3 would look unreached by the majority and m isolated.
    found = reach.blame(NAMES, views({("m", "g3")}, probers=["m", "g2"]))
    assert found["g3"] == [] and found["g1"] == []
    assert found["m"] == ["-> g3-ib0: timed out (the others reach it)"]


def test_a_node_not_probed_that_nobody_reaches_is_still_red():
    r = make_reach(failing={(a, "g1") for a in NODES}, probers=["m", "g2", "g3"])
    r.probe_errors["g1"] = TIMEOUT_OPENING
    assert r.blame_of("g1", reach.IPOIB) == [
        "majority: the fault is at this end: none of its 3 peers reach g1-ib0 (m: timed out; g2: timed out)"
    ]
    assert r.not_probed("g1")  # both said on its cell (tests/verify/test_cross_node.py)


def test_a_broken_first_step_leaves_every_node_not_probed():
    broken = reach.Reach(timeout=1, error="boom")
    assert broken.blame_of("m", reach.MANAGEMENT) == []
    assert broken.not_probed("m") == "the reachability probe failed: boom"


def listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


def test_probe_script_connects_to_every_name_at_once_within_the_bound():
    server = listening()
    port = server.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", reach.PROBE, "2", str(port), "localhost", "127.0.0.1", "no-such-name.invalid"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    result = json.loads(out)
    assert result["localhost"] == result["127.0.0.1"] == ""
    assert result["no-such-name.invalid"]  # unknown name: its error, not retried
    refused = json.loads(
        subprocess.run(
            [sys.executable, "-c", reach.PROBE, "2", str(closed_port), "127.0.0.1"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    )
    assert "refused" in refused["127.0.0.1"]  # retried (sshd's MaxStartups), then reported
    assert time.monotonic() - started < 10
    server.close()


class FakeClient:
    def __init__(self, out: str, status: int = 0):
        self.out, self.status = out, status

    def exec_command(self, command, timeout):
        assert command.startswith("python3 -c ")
        channel = SimpleNamespace(recv_exit_status=lambda: self.status)
        stdout = SimpleNamespace(read=self.out.encode, channel=channel)
        return None, stdout, SimpleNamespace(read=lambda: b"python3: not found\n")

    def close(self):
        pass


def test_run_asks_every_node_in_parallel_and_bounds_the_dead_one():
    nodes = [
        SimpleNamespace(hostname=h, address=f"10.0.0.{i}", ipoib_interface="ib0", ipoib_name=f"{h}-ib0")
        for i, h in enumerate(NODES)
    ]
    cluster = SimpleNamespace(nodes=nodes, ssh=SimpleNamespace(port=22))
    all_ok = json.dumps({n: "" for h in NODES for n in (h, NAMES[h])})

    def connect(node, timeout):
        if node.hostname == "g2":
            time.sleep(1)  # the bound, paid once
            raise TimeoutError("timed out")
        if node.hostname == "g3":
            return FakeClient("", status=127)
        time.sleep(1)  # every node slow: in parallel, still ~1 s in all
        return FakeClient(all_ok)

    started = time.monotonic()
    found = reach.run(cluster, connect, ssh_problem, timeout=1)
    assert time.monotonic() - started < 1.9
    assert list(found.dead) == ["g2"]
    kind, why, target = found.dead["g2"]
    assert (kind, target) == ("timeout", "10.0.0.2:22") and "--reach-timeout" in why
    assert sorted(found.views) == ["g1", "m"]
    assert found.probe_errors["g3"] == "python3 -c PROBE -> exit 127: python3: not found"


class StuckChannel(FakeClient):
    """A node under load: its first `stuck` session openings time out (paramiko's message)."""

    def __init__(self, out: str, stuck: int, read_error: Exception | None = None):
        super().__init__(out)
        self.stuck, self.calls, self.read_error = stuck, 0, read_error

    def exec_command(self, command, timeout):
        self.calls += 1
        if self.calls <= self.stuck:
            raise paramiko.SSHException("Timeout opening channel.")
        _, stdout, stderr = super().exec_command(command, timeout)
        if self.read_error is not None:
            error = self.read_error

            def fail():
                raise error

            stdout.read = fail
        return None, stdout, stderr


def probe_one(client) -> reach.Reach:
    node = SimpleNamespace(hostname="m", address="10.0.0.1", ipoib_interface="ib0", ipoib_name="m-ib0")
    cluster = SimpleNamespace(nodes=[node], ssh=SimpleNamespace(port=22))
    return reach.run(cluster, lambda node, timeout: client, ssh_problem, timeout=1)


def test_opening_the_probe_session_is_tried_twice():
    ok = json.dumps({"m": "", "m-ib0": ""})
    once = StuckChannel(ok, stuck=1)
    assert probe_one(once).views == {"m": {"m": "", "m-ib0": ""}} and once.calls == 2
    twice = StuckChannel(ok, stuck=2)
    found = probe_one(twice)
    assert twice.calls == 2  # one retry, not more
    assert found.probe_errors == {"m": TIMEOUT_OPENING} and not found.views and not found.dead
    # The probe started, its output did not come: not retried (it ran for its bound already).
    slow = StuckChannel(ok, stuck=0, read_error=TimeoutError("timed out"))
    assert probe_one(slow).probe_errors == {"m": "python3 -c PROBE: TimeoutError: timed out"}
    assert slow.calls == 1
    # Workers wait for the whole result beyond the prober's worst case, retry included.
    assert reach.worst_case(1) == 3 * 1 + 3 * reach.probe_bound(1)


def test_published_gives_each_verdict_before_the_whole_result(tmp_path):
    seen = reach.Published(tmp_path, timeout=1)
    reach.write_atomically(reach.verdict_file(tmp_path, "m"), json.dumps({"dead": None}))
    reach.write_atomically(
        reach.verdict_file(tmp_path, "g2"),
        json.dumps({"dead": ["timeout", "SSH to x:22: timed out", "x:22"]}),
    )
    assert seen.dead("m") is None  # no reach.json yet: the verdict alone
    with pytest.raises(reach.NodeUnreachable):
        seen.raise_if_dead(SimpleNamespace(hostname="g2"))
    seen.deadline = time.monotonic() + 0.2  # the whole result never comes: bounded, then an error
    assert seen.blame_of("m", reach.MANAGEMENT) == []
    assert seen.not_probed("m") == f"the reachability probe failed: no result in {tmp_path} in time"
    assert reach.Published(None, 1).not_probed("m") == (
        "the reachability probe failed: verify's first step did not run"
    )


def test_run_tells_each_verdict_as_soon_as_known():
    nodes = [
        SimpleNamespace(hostname=h, address="10.0.0.1", ipoib_interface="ib0", ipoib_name=f"{h}-ib0")
        for h in ("a", "b")
    ]
    cluster = SimpleNamespace(nodes=nodes, ssh=SimpleNamespace(port=22))
    heard: list[tuple[str, object, bool]] = []
    slow = json.dumps({"a": ""})

    class SlowProbe(FakeClient):
        def exec_command(self, command, timeout):
            time.sleep(0.5)
            return super().exec_command(command, timeout)

    def connect(node, timeout):
        if node.hostname == "b":
            raise TimeoutError("timed out")
        return SlowProbe(slow)

    started = time.monotonic()
    reach.run(
        cluster,
        connect,
        ssh_problem,
        1,
        lambda h, dead: heard.append((h, dead, time.monotonic() - started < 0.4)),
    )
    assert sorted((h, bool(d), early) for h, d, early in heard) == [("a", False, True), ("b", True, True)]


def test_main_last_line_names_the_dead_first(tmp_path):
    from tests.verify.__main__ import unreachable_first

    report = tmp_path / "verify-matrix.md"
    report.write_text(
        "# Verify matrix\n\n- **UNREACHABLE g2 (SSH to 10.0.0.2:22: no route to host): first: is it on?**\n"
    )
    assert (
        unreachable_first(report) == "UNREACHABLE g2 (SSH to 10.0.0.2:22: no route to host): first: is it on?"
    )
    assert unreachable_first(report, since=time.time() + 60) == ""  # a report from an earlier run
    assert unreachable_first(tmp_path / "missing.md") == ""


def test_a_node_without_a_verdict_file_is_read_from_the_whole_result(tmp_path):
    whole = make_reach(dead=["g2"], probers=["m", "g1", "g3"])
    reach.write_atomically(tmp_path / reach.RESULT, whole.to_json())
    seen = reach.Published(tmp_path, timeout=1)
    started = time.monotonic()
    assert seen.dead("g2")[0] == "unreachable" and seen.dead("elsewhere") is None
    assert time.monotonic() - started < 1
