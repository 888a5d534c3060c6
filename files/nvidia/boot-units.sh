#!/bin/sh
# boot-units.sh SECONDS UNIT..., from roles/nvidia/driver.py after its reboot.
# After the driver's reboot: the units a node needs from boot are active. A unit that failed
# during that boot (a module load that raced, a cgroup the kernel refused under load: systemd's
# status 219/CGROUP) is started once more; one that fails again fails this host, named, rather than
# leaving a node whose fabric or GPUs are down for verify to find.
# SECONDS: how long to wait for the boot to finish; absent units are skipped.
set -u
wait_seconds=$1
shift
# Non-zero when the system is "degraded", which is what this looks into: not an error here.
timeout "$wait_seconds" systemctl is-system-running --wait >/dev/null 2>&1
still=""
for unit in "$@"; do
    # True only for a unit in the failed state (an absent or inactive unit is not).
    systemctl is-failed --quiet "$unit" || continue
    echo "$unit failed during the boot: starting it once more" >&2
    systemctl reset-failed "$unit"
    # start, not restart: a failed unit is not running, and restart (stop, then start) is
    # refused by a unit with RefuseManualStop=true, as MLNX_OFED's openibd.service is ("Operation
    # refused, unit openibd.service may be requested by dependency only").
    systemctl start "$unit" || still="$still $unit"
done
if [ -n "$still" ]; then
    echo "failed again when started once more:$still (journalctl -b -u <unit>)" >&2
    exit 1
fi
