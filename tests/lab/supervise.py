"""Keeps one lab node running: restarts systemd-nspawn when the node reboots.

`systemctl reboot` inside a node makes systemd-nspawn exit with 133 and nothing restarts
it; this loop does what systemd-nspawn@.service does with RestartForceExitStatus=133.
"""

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

REBOOT_STATUS = 133


def nspawn_argv(args) -> list[str]:
    argv = [
        "systemd-nspawn", "--quiet", "-D", args.root, "--boot",
        "--register=no", "--keep-unit", "-M", args.name,
        f"--network-namespace-path={args.netns}",
        "--capability=CAP_NET_ADMIN", "--console=read-only",
    ]
    argv += [f"--bind={b}" for b in args.bind]
    return argv


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--netns", required=True)
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--bind", action="append", default=[])
    args = parser.parse_args()

    stopping = False
    child: subprocess.Popen | None = None

    def stop(_signum, _frame):
        nonlocal stopping
        stopping = True
        if child and child.poll() is None:
            # nspawn turns SIGTERM into an orderly poweroff of the node.
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    boots = 0
    while not stopping:
        boots += 1
        print(f"supervise: boot {boots} of {args.name}", flush=True)
        child = subprocess.Popen(nspawn_argv(args), stdin=subprocess.DEVNULL)
        Path(args.pidfile).write_text(f"{child.pid}\n")
        while True:
            try:
                status = child.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        print(f"supervise: nspawn exited {status}", flush=True)
        if status != REBOOT_STATUS:
            break
        time.sleep(0.5)
    Path(args.pidfile).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
