"""SSH sessions open at once on a busy node: what verify's probes and the deploy depend on.

sshd opens the PAM session before it serves a channel, and pam_systemd waits there for root's
user manager (user@0.service). By default logind stops that manager 10 s after root's last
session (UserStopDelaySec) and starts it again for the next one; in the lab's nested
cgroup setup the stop could hang on its control group while Docker's containers came and went,
and every session opened meanwhile timed out opening its channel (tests/lab/rootfs.py LOGIND_TUNING).
Here: 50 sessions in a row, with one pause longer than the stop delay in the middle, while
containers start and stop on the node; none may wait, and the manager must never have stopped.
"""

import time

SESSIONS = 50
MAX_SECONDS = 5.0  # one session's whole life here is well under a second on an idle lab
STOP_DELAY = 10  # logind's default UserStopDelaySec
CHURN = (
    "image=$(docker images -q | head -n 1); "
    'for i in $(seq 40); do docker run --rm --network none "$image" true >/dev/null 2>&1; done'
)


def _manager_since(lab_ssh, node: str) -> str:
    return lab_ssh(
        node, "systemctl show user@0.service -p ActiveEnterTimestampMonotonic --value"
    ).stdout.strip()


def test_sessions_do_not_wait_for_roots_user_manager(deployed, lab, lab_ssh):
    node = lab.agents[-1].hostname
    since = _manager_since(lab_ssh, node)
    assert since not in ("", "0"), "root's user manager is not running"
    lab_ssh(node, f"systemd-run --quiet --unit dtlab-churn --collect sh -c '{CHURN}'")
    waits = []
    try:
        for i in range(SESSIONS):
            if i == SESSIONS // 2:
                time.sleep(STOP_DELAY + 2)  # past logind's default stop delay
            t0 = time.monotonic()
            lab_ssh(node, "true", timeout=60)
            waits.append(time.monotonic() - t0)
    finally:
        lab_ssh(node, "systemctl stop dtlab-churn 2>/dev/null; true", check=False)
    slow = [f"session {i}: {w:.1f} s" for i, w in enumerate(waits) if w > MAX_SECONDS]
    assert not slow, slow
    assert _manager_since(lab_ssh, node) == since, "root's user manager was stopped and started again"
