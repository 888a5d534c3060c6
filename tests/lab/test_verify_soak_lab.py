"""verify again and again on the healthy lab: never a red cell on a node that is not broken.

Four runs in a row, then a reboot of the master node (Determined's master, PostgreSQL, MinIO
and the backup timer all come back on their own), then two runs more. Each run is verify's
checks without the smoke (its rows run in tests/lab/test_smoke_lab.py), in parallel as an
operator's CI would run it; a red cell in any run fails the soak, naming the run and the
cells. The wall times go to the lab's log directory (verify-soak.txt) and are printed.

Not more runs: the other lab tests run the whole of verify a dozen times more on a lab broken
only where they broke it (tests/lab/test_day_two_lab.py, test_gpu_services_lab.py,
test_health_lab.py, test_node_base_lab.py, test_tls_lab.py, test_trial_container_lab.py,
test_verify_breaks_lab.py, test_dead_node_lab.py), each failing on any other red cell; this
test adds runs in a row and the master's reboot, at 15 s a run.
"""

import json
import statistics
import time

from .conftest import failing_cells, run_verify
from .paths import LOGS
from .test_day_two_lab import wait_registered
from .test_gpu_stack_lab import reboot_and_wait

BEFORE, AFTER = 4, 2


def _verify(tmp_path, name: str) -> tuple[float, set[str], str]:
    junit = tmp_path / f"{name}.xml"
    started = time.monotonic()
    result = run_verify("-n", "4", f"--junitxml={junit}")
    seconds = time.monotonic() - started
    red = failing_cells(junit) if junit.exists() else {"(no report)"}
    return seconds, red, "" if result.returncode == 0 else result.stdout[-3000:]


def test_verify_soak_and_a_master_reboot(deployed, lab, lab_ssh, tmp_path):
    times, reds = [], {}
    for i in range(BEFORE):
        seconds, red, out = _verify(tmp_path, f"run{i}")
        times.append(seconds)
        if red or out:
            reds[f"run {i + 1}"] = (sorted(red), out)
    reboot_and_wait(lab_ssh, lab.master_node.hostname, timeout=240)
    for agent in lab.agents:
        wait_registered(lab, agent, timeout=180)
    for i in range(AFTER):
        seconds, red, out = _verify(tmp_path, f"after{i}")
        times.append(seconds)
        if red or out:
            reds[f"run {BEFORE + i + 1} (after the master's reboot)"] = (sorted(red), out)
    spread = {
        "runs": len(times),
        "min_s": round(min(times), 1),
        "median_s": round(statistics.median(times), 1),
        "max_s": round(max(times), 1),
        "all_s": [round(t, 1) for t in times],
    }
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / "verify-soak.txt").write_text(json.dumps(spread) + "\n")
    print(f"verify soak: {spread}")
    assert not reds, json.dumps(reds, indent=1)[-6000:]
