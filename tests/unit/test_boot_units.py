"""After the driver's reboot, files/nvidia/boot-units.sh starts once more a unit that
failed during the boot, and fails the host when it fails again (roles/nvidia/driver.py).

The 32-node bench (2026-12-01, disk) met it: openibd exited 219/CGROUP at boot on 3 of 32
agents, the deploy reported them green and verify found /dev/infiniband missing. The next
32-node bench showed `systemctl restart` refused for openibd (RefuseManualStop=true). systemctl here is a
fake on PATH that keeps each unit's state in a file, with systemctl's exit statuses."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from roles.nvidia.driver import BOOT_UNITS, BOOT_WAIT_SECONDS
from roles.shared.scripts import script

FAKE_SYSTEMCTL = """#!/bin/sh
# is-failed: 0 only for a failed unit; start: the unit's .restart file says how it goes;
# restart is refused as systemd refuses it for openibd.service (RefuseManualStop=true in
# MLNX_OFED's unit; met on the 32-node bench of 2026-12-01).
states={states}
[ "$1" = is-system-running ] && {{ echo degraded; exit 1; }}
echo "$*" >> {states}/calls
case "$1" in
    is-failed) unit=$3; [ "$(cat "$states/$unit" 2>/dev/null)" = failed ];;
    reset-failed) unit=$2; [ -f "$states/$unit" ] && echo inactive > "$states/$unit"; exit 0;;
    start) unit=$2; cat "$states/$unit.restart" > "$states/$unit"
           [ "$(cat "$states/$unit")" = active ];;
    restart|stop) echo "Failed to $1 $2: Operation refused, unit $2 may be requested by dependency only" >&2
                  exit 1;;
    *) exit 1;;
esac
"""


def run_boot_units(tmp_path: Path, units: dict[str, tuple[str, str]]) -> subprocess.CompletedProcess:
    """units: name -> (state at boot, state after a restart)."""
    states = tmp_path / "states"
    states.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL.format(states=states))
    (bin_dir / "systemctl").chmod(0o755)
    for name, (boot, restart) in units.items():
        (states / name).write_text(boot + "\n")
        (states / f"{name}.restart").write_text(restart + "\n")
    command = script("nvidia/boot-units.sh", 5, *BOOT_UNITS)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, env=env, check=False
    )


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "states" / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_a_unit_that_failed_at_boot_is_started_once_more(tmp_path):
    proc = run_boot_units(
        tmp_path,
        {"openibd.service": ("failed", "active"), "nvidia-persistenced.service": ("active", "active")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "openibd.service failed during the boot: starting it once more" in proc.stderr
    assert [c for c in calls(tmp_path) if c.startswith(("start", "restart"))] == ["start openibd.service"]


def test_a_unit_that_fails_again_fails_the_host_naming_it(tmp_path):
    proc = run_boot_units(tmp_path, {"openibd.service": ("failed", "failed")})
    assert proc.returncode == 1
    assert "failed again when started once more: openibd.service" in proc.stderr


def test_active_and_absent_units_are_left_alone(tmp_path):
    # nvidia-persistenced.service is absent (not installed yet): is-failed is false for it.
    proc = run_boot_units(tmp_path, {"openibd.service": ("active", "failed")})
    assert proc.returncode == 0, proc.stderr
    assert not [c for c in calls(tmp_path) if c.startswith(("start", "restart", "reset-failed"))]
    assert BOOT_WAIT_SECONDS >= 60  # a real boot with DKMS-built modules takes minutes


def test_the_fabric_manager_is_not_restarted_at_the_old_version():
    # After a driver change it refuses the new driver until roles/nvidia/gpu_services.py moves it.
    assert "nvidia-fabricmanager.service" not in BOOT_UNITS
