#!/usr/bin/python3
# Stands in for /usr/sbin/opensm of MLNX_OFED @OFED_VERSION@ (package opensm @OPENSM_VERSION@); lab only.
"""The subnet manager daemon, as opensmd.service runs it: in the foreground until SIGTERM.

What it stands in for (MLNX_OFED user manual, "OpenSM"; opensm(8)): opensm binds to the local
port, sweeps the fabric every 10 s (sweep_interval), and is master unless an SM of a higher
priority (or the same priority and a lower port GUID) is on the subnet; its priority is 0
unless `-p` / opensm.conf's sm_priority say otherwise (both left out here).

Lab model: the lab has no fabric state shared between nodes. The lab's switch runs an SM of its
own (priority 0, a GUID above every lab port's), so every node's port is Active without this
daemon; while it runs, this node's sminfo and ibstat name it (the lower GUID wins the election)
and the switch's SM is standby. Other nodes keep seeing the switch's SM: each node's view is its
own. The daemon only records itself in /run/ib-standin/opensm.json (pid, start time, priority),
which ib_diags.py (sminfo, ibstat) reads and checks against the live process.

Test-only environment override (never set on a node): DTLAB_STANDIN_RUN_DIR.
"""

import contextlib
import json
import os
import signal
import sys
import time

RUN_DIR = os.environ.get("DTLAB_STANDIN_RUN_DIR", "/run/ib-standin")
STATE = os.path.join(RUN_DIR, "opensm.json")
PRIORITY = 0  # opensm's default sm_priority


def stop(signum, frame):
    with contextlib.suppress(OSError):
        os.unlink(STATE)
    sys.exit(0)


def main():
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    os.makedirs(RUN_DIR, exist_ok=True)
    record = {"pid": os.getpid(), "started": time.time(), "priority": PRIORITY}
    tmp = STATE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, STATE)
    # opensm's banner on its console (opensm(8) logs to /var/log/opensm.log as well).
    print(
        "-------------------------------------------------\nOpenSM @OPENSM_VERSION@ (lab stand-in)",
        flush=True,
    )
    print("Entering MASTER state", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
