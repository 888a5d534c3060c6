"""python -m tests.lab [--cluster FILE] up|warm|down|status|recreate NODE|ssh NODE [CMD...]

`warm` is `up` and then the plain deploy (pyinfra -y INVENTORY deploy.py, its output in the
lab's log directory, warm-deploy.log): what the lab tests' first fixture does, started in the
background while the unit tests run (the README's test command), so that the lab tests find
the lab deployed and their own first deploy changes nothing.
"""

import argparse
import os
import sys
from pathlib import Path

from deploy.cluster import ClusterError

from . import lifecycle, nodes
from .paths import DEFAULT_CLUSTER
from .shell import LabError


def warm(cluster: Path) -> int:
    """up, then the plain deploy; its status (the lab tests deploy again and report a failure)."""
    import subprocess
    import time

    from .conftest import _inventory_for
    from .paths import LOGS, REPO

    started = time.monotonic()
    lifecycle.up(cluster)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / "warm-deploy.log"
    with log.open("w") as out:
        rc = subprocess.run(
            [str(Path(sys.executable).parent / "pyinfra"), "-y", str(_inventory_for(cluster)), "deploy.py"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    print(f"lab warm: up and deployed in {time.monotonic() - started:.0f}s (deploy exit status {rc}; {log})")
    return rc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    parser.add_argument(
        "--cluster",
        type=Path,
        default=DEFAULT_CLUSTER,
        help="cluster.yaml describing the nodes (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="build what is missing and boot every node (idempotent)")
    sub.add_parser("warm", help="up, then deploy the lab (what the lab tests start from)")
    sub.add_parser("down", help="stop and remove every node, namespace, bridge and mount")
    sub.add_parser("status", help="one line per node")
    rec = sub.add_parser("recreate", help="give one node a blank root filesystem")
    rec.add_argument("node")
    rec.add_argument(
        "--wipe-disks", action="store_true", help="also wipe the node's data disk (kept by default)"
    )
    ssh = sub.add_parser("ssh", help="run a command on a node over the lab's SSH key")
    ssh.add_argument("node")
    ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    console = sub.add_parser("exec", help="run a command in a node without SSH (nsenter)")
    console.add_argument("node")
    console.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if os.geteuid() != 0 and args.command != "status":
        print("the lab needs root (namespaces, bridges, mounts)", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            lifecycle.up(args.cluster)
        elif args.command == "warm":
            return warm(args.cluster)
        elif args.command == "down":
            lifecycle.down(args.cluster)
        elif args.command == "recreate":
            lifecycle.recreate(args.cluster, args.node, wipe_disks=args.wipe_disks)
        elif args.command == "status":
            rows = lifecycle.status(args.cluster)
            for r in rows:
                state = "running" if r["supervisor"] and r["nspawn"] else "stopped"
                print(
                    f"{r['node']:<16} {r['address']:<15} {state:<8} netns={'yes' if r['netns'] else 'no'}"
                    f" mounted={'yes' if r['mounted'] else 'no'} nspawn_pid={r['nspawn'] or '-'}"
                )
            return 0 if all(r["supervisor"] and r["nspawn"] for r in rows) else 1
        elif args.command == "ssh":
            spec = lifecycle.prepare(args.cluster)
            argv = nodes.ssh_argv(spec, spec.node(args.node), *args.cmd)
            os.execvp(argv[0], argv)
        elif args.command == "exec":
            spec = lifecycle.prepare(args.cluster)
            argv = nodes.console_argv(spec.node(args.node), *args.cmd)
            os.execvp(argv[0], argv)
    except ClusterError as e:
        print("\n".join(e.problems), file=sys.stderr)
        return 2
    except (LabError, KeyError) as e:
        print(f"lab: {e.args[0] if e.args else e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
