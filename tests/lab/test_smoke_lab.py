"""verify's smoke experiment on the lab: its four rows green, then each breakage turns exactly
its row red with the hint that fits it, and is repaired before the next (try/finally).

1. MinIO's site region changed on the storage node only: the save row says
   AuthorizationHeaderMalformed ("the region is wrong; expecting ...") -> the region hint; the
   restore row is skipped (no checkpoint), the allreduce stays green.
2. ib0 down on one agent (its node's IPoIB port, as `ip link set ib0 down` leaves it), with a
   third agent disabled so that the two-agent trial must use it: the allreduce row -> the
   fabric hint ('AllReduce timeout'); then the same node's /etc/hosts without the deploy's
   block: its agent loses the master under the trial, and the row names the node and the name
   its journal could not resolve -> the agent-resolve hint.
3. A wrong secret key in the master's checkpoint storage (master.yaml, master restarted): the
   save row says SignatureDoesNotMatch -> the keys hint; a deploy repairs it.
4. master.yaml's task defaults: the IPoIB port named for every trial (the single-agent row,
   NCCL's error), then a CUDA 12.4 default image (every row, the CUDA runtime's words).
5. Every slot busy: every row "not run: busy", no red cell; a deploy that would restart
   Docker for a new daemon.json (determined.memlock_bytes) stops every agent first, naming
   its trials, which keep running; so does one that would restart a per_node agent, and a
   rebuild of a training node. `python -m deploy upgrade` then rolls the memlock change
   through, one node at a time (polled: never two out), pausing and activating the experiments.

Only the smoke part of verify runs (`-k test_smoke`), on the lab every lab test shares. The
checkpoint objects under verify-smoke/ are gone after every run (verify's cleanup).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest
from minio.deleteobjects import DeleteObject

from deploy import s3
from deploy.cluster.determined import SMOKE_USER
from deploy.cluster.images import site_ref
from tests.verify import smoke_client as sc
from tests.verify.master_api import _http, _master_url, admin_token

from .busy import every_slot_held
from .conftest import LAB_CLUSTER, _inventory_for, run_deploy, run_verify
from .paths import REPO
from .test_day_two_lab import wait_registered
from .test_trials_lab import Api

SAVE, RESTORE, ALLREDUCE, SINGLE = (
    "test_smoke_trial_saves_a_checkpoint",
    "test_smoke_trial_restores_it",
    "test_smoke_two_agent_allreduce",
    "test_smoke_single_agent_allreduce",
)
MASTER_YAML = "/etc/determined/master.yaml"
HOSTS_BACKUP = "/root/hosts.smoke-test"
MINIO_ENV = "/etc/default/minio"
OTHER_REGION = "lab-north-9"
CUDA_124_IMAGE = "determinedai/pytorch-ngc:0.38.0"  # the lab registry's stand-in, CUDA 12.4


def run_smoke(tmp_path, name: str) -> tuple[dict[str, str], str, str, float]:
    """verify's smoke rows: ({check: ok|fail|skip}, the matrix in Markdown, pytest's output, seconds)."""
    junit, matrix = tmp_path / f"{name}.xml", tmp_path / f"{name}.md"
    started = time.monotonic()
    result = run_verify(
        "-k", "test_smoke", "-p", "tests.verify.matrix", f"--junitxml={junit}", f"--verify-matrix={matrix}",
        smoke=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    rows, said = {}, []
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        status = "fail" if failed else "skip" if case.find("skipped") is not None else "ok"
        rows[case.get("name", "").split("@")[0]] = status
        said += [e.get("message", "") for e in case if e.tag in ("failure", "error", "skipped")]
    return rows, matrix.read_text(), "\n".join([result.stdout, *said]), seconds


def leftovers(lab) -> list[str]:
    client = s3.client(lab)
    return [
        o.object_name for o in client.list_objects(lab.storage.bucket, prefix="verify-smoke/", recursive=True)
    ]


def test_smoke_rows_green(deployed, lab, tmp_path):
    rows, matrix, out, seconds = run_smoke(tmp_path, "green")
    assert rows == {SAVE: "ok", RESTORE: "ok", ALLREDUCE: "ok", SINGLE: "ok"}, out[-4000:]
    assert "--> smoke: allreduce ok in" in out and "archived" in out, out[-2000:]
    assert leftovers(lab) == []
    # Submitted as the non-admin smoke user: each trial's DET_USER_TOKEN is a session of its
    # experiment's owner (master/pkg/tasks/task.go; the stand-in's lab_trials.py likewise).
    status, listed = _http(
        f"{_master_url(lab)}/api/v1/experiments?name=verify-smoke-&limit=100", token=admin_token(lab)
    )
    owners = {e["username"] for e in listed["experiments"]} if status == 200 else {f"HTTP {status}"}
    assert owners == {SMOKE_USER}, owners
    print(f"smoke on the lab: {seconds:.1f}s for `verify -k test_smoke` (rows: {out.count(' ok in ')} ok)")


def test_region_changed_on_minio_only(deployed, lab, lab_ssh, tmp_path):
    storage = lab.storage_node.hostname
    original = lab_ssh(storage, f"grep '^MINIO_SITE_REGION=' {MINIO_ENV}").stdout.strip()
    try:
        lab_ssh(
            storage,
            f"sed -i 's/^MINIO_SITE_REGION=.*/MINIO_SITE_REGION=\"{OTHER_REGION}\"/' {MINIO_ENV} "
            "&& systemctl restart minio",
        )
        rows, matrix, out, _ = run_smoke(tmp_path, "region")
        assert rows == {SAVE: "fail", RESTORE: "skip", ALLREDUCE: "ok", SINGLE: "ok"}, out[-4000:]
        assert "AuthorizationHeaderMalformed" in out and f"expecting '{OTHER_REGION}'" in out, out[-4000:]
        assert sc.REGION.symptom[:60] in matrix.replace("\\|", "|"), matrix
        assert "not run: no checkpoint from the save trial" in out
        assert "signed for MinIO's region" in out  # the cleanup found MinIO's region
    finally:
        lab_ssh(
            storage, f"sed -i 's/^MINIO_SITE_REGION=.*/{original}/' {MINIO_ENV} && systemctl restart minio"
        )
    assert leftovers(lab) == []


def _agents(lab) -> list[dict]:
    status, body = _http(f"{_master_url(lab)}/api/v1/agents", token=admin_token(lab))
    assert status == 200, status
    return body["agents"]


def _set_enabled(lab, agent_id: str, enabled: bool) -> None:
    """Enable or disable an agent; an agent that is reconnecting (404 "not connected; reconnect")
    keeps the operator's choice across the reconnect, so it is asked again until it is back."""
    action = "enable" if enabled else "disable"
    body = {} if enabled else {"drain": False}
    deadline = time.monotonic() + 60
    while True:
        status, _ = _http(
            f"{_master_url(lab)}/api/v1/agents/{agent_id}/{action}", body, token=admin_token(lab)
        )
        if status == 200 or status != 404 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert status == 200, f"{action} {agent_id} -> {status}"


def _size(agent: dict) -> int:
    return len(agent.get("slots") or {})


def test_ib0_down_then_hosts_lost_on_one_agent(deployed, lab, lab_ssh, tmp_path):
    """The two-agent trial made to use one node (other nodes' agents of its size disabled), broken
    two ways in turn: its IPoIB port down (the fabric hint), then its /etc/hosts without the
    deploy's block (the agent's own resolver error, and the hint for it)."""
    broken = lab.agents[-1].hostname
    iface = lab.agents[-1].ipoib_interface
    node_of = sc.node_of_agent({a.hostname for a in lab.agents})
    agents = [a for a in _agents(lab) if a.get("enabled", True)]
    size = max(_size(a) for a in agents if node_of(a["id"]) == broken)
    # The two-agent trial fits onto two agents of one size (smoke_client.allreduce_slots): it must
    # take the broken node, so only one other node keeps agents of that size enabled.
    others = sorted({node_of(a["id"]) for a in agents if _size(a) == size} - {broken})
    assert others, f"no other node has an agent of {size} slots"
    disabled = [a["id"] for a in agents if _size(a) == size and node_of(a["id"]) in others[1:]]
    try:
        for agent_id in disabled:
            _set_enabled(lab, agent_id, False)
        lab_ssh(broken, f"ip link set {iface} down")
        rows, matrix, out, _ = run_smoke(tmp_path, "ib0")
        # The single-agent row runs on Docker's bridge network inside one node: no IPoIB.
        assert rows == {SAVE: "ok", RESTORE: "ok", ALLREDUCE: "fail", SINGLE: "ok"}, out[-4000:]
        assert re.search(rf"AllReduce would time out: container \d on {broken}: {iface} down", out), out[
            -4000:
        ]
        assert sc.FABRIC.symptom[:60] in matrix.replace("\\|", "|"), matrix
        lab_ssh(broken, f"ip link set {iface} up")

        # The same node's /etc/hosts without the deploy's block, its agents still connected:
        # the first time an agent dials the master again (a report, a reconnect) it cannot
        # resolve master_host, and the master loses it under the trial. The row names the
        # node and the name from the agent's own journal.
        lab_ssh(
            broken,
            f"cp -p /etc/hosts {HOSTS_BACKUP} && sed -i '/BEGIN gpu-cluster/,/END gpu-cluster/d' /etc/hosts",
        )
        rows, matrix, out, _ = run_smoke(tmp_path, "hosts")
        assert rows[ALLREDUCE] == "fail", out[-4000:]
        shown = matrix.replace("\\|", "|")
        assert f"the agent on {broken}" in out and f"lookup {lab.master_host}" in out, out[-4000:]
        assert sc.AGENT_RESOLVE.symptom[:60] in shown, shown
        # A row whose trial landed on another node is green; one on the broken node fails the same way.
        assert out.count("lost its connection to the master") >= sum(r == "fail" for r in rows.values())
    finally:
        lab_ssh(
            broken,
            f"ip link set {iface} up && if [ -f {HOSTS_BACKUP} ]; then mv {HOSTS_BACKUP} /etc/hosts; fi",
        )
        for agent_id in disabled:
            _set_enabled(lab, agent_id, True)
        wait_registered(lab, lab.agents[-1], timeout=120)
    assert leftovers(lab) == []


def test_wrong_secret_key_in_master_yaml(deployed, lab, lab_ssh, deploy, tmp_path):
    master = lab.master_node.hostname
    backup = f"{MASTER_YAML}.smoke-test"
    lab_ssh(master, f"cp -p {MASTER_YAML} {backup}")
    repaired = None
    try:
        # checkpoint_storage's is master.yaml's only `secret_key:` at two spaces' indent.
        lab_ssh(
            master,
            f"sed -i 's/^  secret_key: .*/  secret_key: \"not-the-minio-secret-0\"/' {MASTER_YAML} "
            "&& systemctl restart determined-master",
        )
        rows, matrix, out, _ = run_smoke(tmp_path, "secret")
        assert rows == {SAVE: "fail", RESTORE: "skip", ALLREDUCE: "ok", SINGLE: "ok"}, out[-4000:]
        assert "S3 SignatureDoesNotMatch" in out, out[-4000:]
        assert sc.KEYS.symptom[:60] in matrix.replace("\\|", "|"), matrix
        assert "not-the-minio-secret-0" not in out + matrix  # a key never reaches the output
    finally:
        repaired = deploy()  # the repair: master.yaml written again, the master restarted
        if repaired.returncode != 0:  # leave the shared lab working whatever happened
            lab_ssh(master, f"cp -p {backup} {MASTER_YAML} && systemctl restart determined-master")
        lab_ssh(master, f"rm -f {backup}")
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    rows, _, out, _ = run_smoke(tmp_path, "repaired")
    assert rows == {SAVE: "ok", RESTORE: "ok", ALLREDUCE: "ok", SINGLE: "ok"}, out[-4000:]
    assert leftovers(lab) == []


def test_task_defaults_that_break_trials_turn_the_smoke_red(deployed, lab, lab_ssh, deploy, tmp_path):
    """Two of master.yaml's task_container_defaults, one after the other, each as the smoke sees
    it through the defaults (it names no image and no variable of its own); one deploy repairs.

    1. NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME naming the IPoIB port for every trial (what the
       deploy wrote before): a trial that fits on one agent runs on Docker's bridge network,
       where that port does not exist, and NCCL's bootstrap fails to find it; the two-agent
       trial (host network) still runs.
    2. The GPU image set to a CUDA 12.4 one (the lab registry's NGC stand-in, Determined 0.38's
       default image, which libnvidia-container starts on any driver: NVIDIA_REQUIRE_CUDA=
       cuda>=9.0): every row fails at CUDA's start with the runtime's own words."""
    master = lab.master_node.hostname
    iface = lab.network.ipoib.interface
    backup = f"{MASTER_YAML}.smoke-test"
    restore = f"cp -p {backup} {MASTER_YAML} && systemctl restart determined-master"
    lab_ssh(master, f"cp -p {MASTER_YAML} {backup}")
    repaired = None
    try:
        # Right after AWS_DEFAULT_REGION, task_container_defaults' first variable.
        added = f'\\    - "NCCL_SOCKET_IFNAME={iface}"\\n    - "GLOO_SOCKET_IFNAME={iface}"'
        lab_ssh(
            master,
            f"sed -i '/^    - \"AWS_DEFAULT_REGION=/a{added}' {MASTER_YAML} "
            f"&& grep -q GLOO_SOCKET_IFNAME {MASTER_YAML} && systemctl restart determined-master",
        )
        rows, matrix, out, _ = run_smoke(tmp_path, "ifname")
        assert rows == {SAVE: "ok", RESTORE: "ok", ALLREDUCE: "ok", SINGLE: "fail"}, out[-4000:]
        assert "Bootstrap : no socket interface found" in out, out[-4000:]

        ngc = site_ref(lab, CUDA_124_IMAGE)
        set_image = (
            f"sed -i 's|^    cuda: .*|    cuda: {ngc}|' {MASTER_YAML} && grep -qF 'cuda: {ngc}' {MASTER_YAML}"
        )
        # The saved file back (without phase 1's variables), the image set, one restart.
        lab_ssh(master, f"cp -p {backup} {MASTER_YAML} && {set_image} && systemctl restart determined-master")
        rows, matrix, out, _ = run_smoke(tmp_path, "cuda12")
        # The restore row has no checkpoint to read: skipped, not failed.
        assert rows[SAVE] == rows[ALLREDUCE] == rows[SINGLE] == "fail", out[-4000:]
        assert rows[RESTORE] in ("fail", "skip"), out[-4000:]
        assert "CUDA driver version is insufficient for CUDA runtime version" in out, out[-4000:]
        assert sc.CUDA.symptom in matrix, matrix[-3000:]
    finally:
        repaired = deploy()
        if repaired.returncode != 0:
            lab_ssh(master, restore)
        lab_ssh(master, f"rm -f {backup}")
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert leftovers(lab) == []


@pytest.fixture(autouse=True)
def _no_leftovers_before(lab):
    """Start from a bucket without smoke objects (a run interrupted by hand may leave some)."""
    client = s3.client(lab)
    names = [
        o.object_name for o in client.list_objects(lab.storage.bucket, prefix="verify-smoke/", recursive=True)
    ]
    list(client.remove_objects(lab.storage.bucket, [DeleteObject(n) for n in names]))


def test_busy_cluster_smoke_rows_say_busy_and_a_deploy_keeps_the_trials(deployed, lab, lab_ssh, tmp_path):
    """Every slot held by a user's long experiment: each smoke row is "not run: busy", naming the
    experiments, within seconds; nothing is red, and the slots are given back afterwards.
    Meanwhile the plain deploy of a setting that restarts Docker (determined.memlock_bytes, in
    daemon.json) stops every agent before the file is written, naming the trials on it
    (deploy/training.py): Docker keeps running and so do they."""
    changed = tmp_path / "memlock" / "cluster.yaml"
    changed.parent.mkdir()
    text = LAB_CLUSTER.read_text()
    assert text.count("memlock_bytes: 8388608\n") == 1
    # Lower, not higher: a lab machine (systemd-nspawn, no CAP_SYS_RESOURCE) cannot raise its
    # 8 MiB hard memlock limit, and runc then refuses every container ("error setting rlimit
    # type 8: operation not permitted"): the rollout's verify gate caught exactly that.
    changed.write_text(text.replace("memlock_bytes: 8388608\n", "memlock_bytes: 4194304\n"))
    docker_since = "systemctl show -p ActiveEnterTimestampMonotonic --value docker.service"
    with every_slot_held(lab) as held:
        rows, matrix, out, seconds = run_smoke(tmp_path, "busy")
        assert rows == {SAVE: "skip", RESTORE: "skip", ALLREDUCE: "skip", SINGLE: "skip"}, out[-4000:]
        assert out.count("not run: busy") >= 3 and "lab-busy-0" in out, out[-4000:]
        assert ", 0 red cells," in matrix and "**FAIL**" not in matrix, matrix
        print(f"smoke on the busy lab: {seconds:.1f}s")

        since = {a.hostname: lab_ssh(a.hostname, docker_since).stdout for a in lab.agents}
        run = run_deploy(inventory=_inventory_for(changed))
        assert run.returncode != 0, run.stderr[-3000:]
        for agent in lab.agents:
            refusal = (
                f"{agent.hostname}: restarting Docker for a new daemon.json would end what the "
                "master runs here: Trial "
            )
            assert refusal in run.stderr, run.stderr[-4000:]
            assert lab_ssh(agent.hostname, docker_since).stdout == since[agent.hostname]
            assert '"Soft": 8388608' in lab_ssh(agent.hostname, "cat /etc/docker/daemon.json").stdout
        # A change that restarts a per_node agent (agent.yaml's slot_type), deployed to that node
        # alone: refused before the file is written; the agent keeps running (#37 item 4).
        per_node = next(a.hostname for a in lab.agents if a.agent_layout == "per_node")
        slot_type = tmp_path / "slot-type" / "cluster.yaml"
        slot_type.parent.mkdir()
        assert text.count("\ndetermined:\n") == 1
        slot_type.write_text(text.replace("\ndetermined:\n", "\ndetermined:\n  slot_type: cpu\n"))
        agent_since = "systemctl show -p ActiveEnterTimestampMonotonic --value determined-agent.service"
        before = lab_ssh(per_node, agent_since).stdout
        run = run_deploy(inventory=_inventory_for(slot_type), limit=per_node)
        assert run.returncode != 0, run.stderr[-3000:]
        refusal = (
            f"{per_node}: restarting the agent for a changed /etc/determined/agent.yaml would end "
            "what the master runs here: Trial "
        )
        assert refusal in run.stderr, run.stderr[-4000:]
        assert lab_ssh(per_node, agent_since).stdout == before
        assert 'slot_type: "cuda"' in lab_ssh(per_node, "cat /etc/determined/agent.yaml").stdout

        # A rebuild of a healthy, training node is refused before anything is touched (#35 L9).
        victim = lab.agents[0].hostname
        rebuilt = subprocess.run(
            [sys.executable, "-m", "deploy", "rebuild", "--cluster", str(LAB_CLUSTER), victim],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert rebuilt.returncode == 5, rebuilt.stderr[-3000:]
        assert f"{victim} runs Trial " in rebuilt.stderr and "--force" in rebuilt.stderr, rebuilt.stderr
        assert "deploying" not in rebuilt.stderr
        api = Api(lab)
        assert {api.trial(exp_id)["state"] for exp_id in held} == {"STATE_RUNNING"}
        status, body = api.call("GET", "/api/v1/agents")
        assert status == 200 and all(a["enabled"] for a in json.loads(body)["agents"]), body

        # The rolling path applies the memlock change the plain deploy refused (#37 items 1, 4):
        # a canary node alone, then the other two as one batch (--max-unavailable 2), each
        # node's experiment paused past a short drain and activated again; the master's agent
        # list polled throughout: never more nodes out at once than the batch.
        canary, *rest = [a.hostname for a in lab.agents]
        upgrade = [
            sys.executable, "-m", "deploy", "upgrade", "--cluster", str(changed), "-y",
            "--pause-experiments", "--drain-timeout", "5", "--timeout", "120",
            "--canary", canary, "--max-unavailable", "2",
        ]  # fmt: skip
        most_out, stop = rolling_poller(lab, api)
        try:
            # First a change the canary cannot take: 16 MiB, above the lab machines' hard limit
            # (runc: "error setting rlimit type 8"), so its trial-container rows turn red. The
            # rollout stops at the canary's gate (exit 1): the canary stays disabled, the other
            # nodes keep their file and their agents, the paused experiments run again.
            changed.write_text(text.replace("memlock_bytes: 8388608\n", "memlock_bytes: 16777216\n"))
            failed = subprocess.run(
                upgrade, cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert failed.returncode == 1, failed.stderr[-5000:]
            assert f"{canary}: FAILED: its verify rows are red (above); it stays disabled" in failed.stderr
            assert f"resume with: python -m deploy {' '.join(upgrade[3:])}\n" in failed.stderr
            for other in rest:
                assert f"    {other}: unchanged" in failed.stderr, failed.stderr[-3000:]
                assert '"Soft": 8388608' in lab_ssh(other, "cat /etc/docker/daemon.json").stdout
            status, body = api.call("GET", "/api/v1/agents")
            out = sorted({n.hostname for n in lab.agents for a in json.loads(body)["agents"]
                          if n.owns_agent(a["id"]) and not a["enabled"]})  # fmt: skip
            assert out == [canary], out
            # The operator fixes the file and runs the same command: the held canary first.
            changed.write_text(text.replace("memlock_bytes: 8388608\n", "memlock_bytes: 4194304\n"))
            rolled = subprocess.run(
                upgrade, cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            stop()
        assert rolled.returncode == 0, rolled.stderr[-5000:]
        print(rolled.stderr[-2500:])
        assert f"step 1/2: {canary}\n" in rolled.stderr and f"step 2/2: {', '.join(rest)}\n" in rolled.stderr
        assert most_out == [len(rest)], most_out
        for agent in lab.agents:
            assert f"{agent.hostname}: upgraded: verify rows green, agents enabled" in rolled.stderr
            assert '"Soft": 4194304' in lab_ssh(agent.hostname, "cat /etc/docker/daemon.json").stdout
        assert "paused (it checkpoints and stops)" in rolled.stderr and "activated again" in rolled.stderr
        deadline = time.monotonic() + 180
        while {api.trial(exp_id)["state"] for exp_id in held} != {"STATE_RUNNING"}:
            assert time.monotonic() < deadline, [api.trial(e)["state"] for e in held]
            time.sleep(3)
        # A second run resumes nothing and changes nothing: every node already runs the file.
        again = subprocess.run(
            [sys.executable, "-m", "deploy", "upgrade", "--cluster", str(changed), "-y"],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert again.returncode == 0 and "nothing to change" in again.stderr, again.stderr[-3000:]
    # Back to the lab's own memlock, on the idle cluster, for the tests after this one.
    back = run_deploy()
    assert back.returncode == 0, back.stderr[-3000:]
    assert leftovers(lab) == []


def rolling_poller(lab, api):
    """Polls the master's agent list every half second; returns ([the most agent nodes seen
    disabled at once], stop())."""
    most = [0]
    done = threading.Event()

    def poll():
        while not done.is_set():
            status, body = api.call("GET", "/api/v1/agents")
            if status == 200:
                agents = json.loads(body)["agents"]
                out = {
                    n.hostname
                    for n in lab.agents
                    for a in agents
                    if n.owns_agent(a["id"]) and not a["enabled"]
                }
                most[0] = max(most[0], len(out))
            done.wait(0.5)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()

    def stop():
        done.set()
        thread.join(10)

    return most, stop
