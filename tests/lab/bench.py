"""python -m tests.lab.bench [--sizes 4,16,32,64] [--out FILE]: measure deploy, re-deploy,
verify and rebuild.

For each size it boots a lab of that many nodes (one master, the rest GPU agents, overlay
root filesystems, on 10.77.<40+i>.0/24: a lab of its own, beside any other lab, sharing the
controller's mirror, apt proxy, registry and cores with it), then measures: a cold deploy, a
no-op re-deploy, the same through `python -m deploy.shards` (os.cpu_count() shards), verify
(VERIFY_RUNS runs: their spread is printed below the table, and one more with every slot
held by a long experiment), and the rebuild of one agent (blank root filesystem, then
`deploy.py --limit` it); then it takes that lab down. Per step:
wall seconds, SSH commands per host (from pyinfra's debug log), bytes each node fetched from
the lab mirror and the apt proxy, the peak memory of the controller's largest process, CPU seconds of the
controller (the command and its children: pyinfra, deploy.shards' processes, pytest and its
workers) in total, per node and per operation and host, CPU seconds of the rest of the
machine, and the upstream bytes: what the lab's stand-ins for the vendors' servers (the
mirror, the registry, and Debian's archive behind apt-cacher-ng) served, split into what went
to a caching point and what went to the nodes directly (upstream_bytes). Prints one table and
writes it with the machine's description to --out (default docs/benchmarks.md). Before
booting anything it checks that the largest size fits the machine's memory and disk
(fit_problems). It is a command, not a test.
"""

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

from deploy.cluster import load_cluster

from . import busy, lifecycle, nodes, registry, services
from .paths import APT_PROXY_PORT, DEFAULT_CLUSTER, LOGS, MIRROR_PORT, NODES, REPO, STATE
from .shell import LabError, run

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
ACNG_LOG = Path("/var/log/apt-cacher-ng/apt-cacher.log")
MIRROR_LOG = STATE / "mirror-access.log"
# The registry's access lines (Distribution 2.8 logs one combined-format line per request,
# beside its "response completed" lines): client, request, status, bytes written.
REGISTRY_LOG = LOGS / "registry.log"
# ... and its pull-through cache's, in the same format: what the nodes pulled through it.
REGISTRY_CACHE_LOG = LOGS / "registry-cache.log"
# What one lab node costs the machine, measured on the 4-node lab after a deploy (2026-11-30):
# an agent's overlay upper directory 1.2 GB (Debian packages, /var/cache/apt) and its Docker
# disk 0.3 GB; the processes of one node (systemd, dockerd, containerd, the agent) ~210 MB RSS.
NODE_DISK_GB = 1.6
NODE_MEMORY_GB = 0.25
# The same on a zstd-compressed btrfs (node_storage): 1.56 GB of one deployed agent copied there
# took 0.9 GB (the .deb files in /var/cache/apt do not compress).
NODE_DISK_GB_COMPRESSED = 1.0
DISK_RESERVE_GB = 8.0  # for the mirror, the caches, logs and the registry's storage meanwhile
BTRFS_IMAGE = STATE / "bench-nodes.btrfs"


def cluster_yaml(size: int, octet: int) -> str:
    """The lab cluster.yaml with `size` nodes on 10.77.<octet>.0/24, set up as docs/site-setup.md
    sets up a site: every vendor download through the controller's apt-cacher-ng (the lab mirror
    under /labmirror/, tests/lab/services.py) and the task images through the pull-through
    registry (tests/lab/registry.py's CACHE_PORT). The sha256 pins stay the mirror's."""
    text = DEFAULT_CLUSTER.read_text()
    head, _, rest = text.partition("nodes:\n")
    tail = rest[rest.index("\nsources:") :]
    nodes = [
        f"  - hostname: b{size}-master\n    address: 10.77.{octet}.10\n"
        f"    ipoib_address: 10.78.{octet}.10\n    roles: [master, storage]\n"
    ]
    for i in range(1, size):
        nodes.append(
            f"  - hostname: b{size}-gpu{i}\n    address: 10.77.{octet}.{10 + i}\n"
            f"    ipoib_address: 10.78.{octet}.{10 + i}\n    roles: [agent]\n    slots: 8\n"
        )
    text = head + "nodes:\n" + "".join(nodes) + tail
    text = text.replace("master_host: lab-master", f"master_host: b{size}-master")
    text = text.replace("subnet_manager: lab-master", f"subnet_manager: b{size}-master")
    text = text.replace(f"http://10.77.0.1:{MIRROR_PORT}/", f"http://10.77.0.1:{APT_PROXY_PORT}/labmirror/")
    text = text.replace(f"registry: 10.77.0.1:{registry.PORT}", f"registry: 10.77.0.1:{registry.CACHE_PORT}")
    return text.replace("10.77.0.", f"10.77.{octet}.").replace("10.78.0.", f"10.78.{octet}.")


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _bytes_by_client(path: Path, offset: int, pattern: re.Pattern) -> Counter:
    counts: Counter = Counter()
    if not path.exists():
        return counts
    with open(path, "rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            m = pattern.search(line)
            if m:
                counts[m.group("ip")] += int(m.group("bytes"))
    return counts


MIRROR_LINE = re.compile(r'^(?P<ip>\S+) .*" \d{3} (?P<bytes>\d+)$')
REGISTRY_LINE = re.compile(r'^(?P<ip>[\d.]+) - \S+ \[[^\]]*\] "[^"]*" \d{3} (?P<bytes>\d+) ')
# apt-cacher-ng: time|O|bytes|client|path  (O = delivered to a client)
ACNG_LINE = re.compile(r"^\d+\|O\|(?P<bytes>\d+)\|(?P<ip>[\d.]+)\|")
# ... and time|I|bytes|client|path: fetched from upstream for that client's request. Only Debian's
# archive counts here: what it fetched from the lab mirror (labmirror/...) the mirror's log counts.
ACNG_UPSTREAM_LINE = re.compile(r"^\d+\|I\|(?P<bytes>\d+)\|(?P<ip>[\d.]+)\|(?!labmirror/)")


def log_offsets() -> dict[Path, int]:
    return {path: _log_size(path) for path in (MIRROR_LOG, ACNG_LOG, REGISTRY_LOG, REGISTRY_CACHE_LOG)}


def upstream_bytes(offsets: dict[Path, int], nodes: list[str], caches: set[str]) -> tuple[int, int]:
    """(via the caching point, direct to nodes): bytes the lab's vendor stand-ins served since
    `offsets`. The mirror (NVIDIA's repo, the MOFED, MinIO and Determined downloads) and the
    registry (the task images) stand in for the vendors' servers: what they served a node went
    over the site's uplink once per node; what they served a caching point (`caches`, the
    controller's addresses) once. apt-cacher-ng is a caching point itself: its "I" lines are what
    it fetched from Debian for the nodes. A site whose nodes fetch everything through one caching
    point has 0 direct bytes, and the same upstream bytes for 4 nodes as for 16."""
    served: Counter = Counter()
    for path, pattern in ((MIRROR_LOG, MIRROR_LINE), (REGISTRY_LOG, REGISTRY_LINE)):
        served.update(_bytes_by_client(path, offsets.get(path, 0), pattern))
    fetched = _bytes_by_client(ACNG_LOG, offsets.get(ACNG_LOG, 0), ACNG_UPSTREAM_LINE)
    direct = sum(served[ip] for ip in nodes)
    via_cache = sum(served[ip] for ip in caches) + sum(fetched[ip] for ip in nodes)
    return via_cache, direct


def pytest_items(output: str) -> int | None:
    """Items pytest ran (passed, failed, skipped, errors), from its closing summary line."""
    lines = re.findall(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s", output, re.MULTILINE)
    if not lines:
        return None
    return sum(int(n) for n, _ in re.findall(r"(\d+) (\w+)", lines[-1]))


def operations(debug_output: str) -> int:
    """Operations times hosts in a pyinfra --debug run (one debug line per operation and host)."""
    return len(re.findall(r"\] Starting operation \{.*\} on \S+\s*$", debug_output, re.MULTILINE))


def fit_problems(
    size: int, mem_available_gb: float, disk_free_gb: float, node_disk_gb: float = NODE_DISK_GB
) -> list[str]:
    """Why `size` nodes do not fit this machine (NODE_MEMORY_GB, `node_disk_gb`), if they do not."""
    problems = []
    if size * NODE_MEMORY_GB > mem_available_gb:
        problems.append(
            f"{size} nodes need ~{size * NODE_MEMORY_GB:.0f} GB of memory, "
            f"{mem_available_gb:.0f} GB available"
        )
    if size * node_disk_gb > disk_free_gb - DISK_RESERVE_GB:
        problems.append(
            f"{size} nodes need ~{size * node_disk_gb:.0f} GB of disk under {STATE}, "
            f"{disk_free_gb:.0f} GB free ({DISK_RESERVE_GB:.0f} GB kept for the rest)"
        )
    return problems


@contextlib.contextmanager
def node_storage(compressed: bool):
    """The nodes' root filesystems and Docker disks (tests/lab/paths.py NODES) as they are, or
    on a zstd-compressed btrfs mounted there for the run: a sparse image file on the lab's disk,
    removed afterwards. Needs NODES empty (no other lab up)."""
    if not compressed:
        yield "the lab's disk (ext4)"
        return
    if NODES.exists() and any(NODES.iterdir()):
        raise LabError(f"{NODES} holds another lab's nodes: bring it down first (python -m tests.lab down)")
    NODES.mkdir(parents=True, exist_ok=True)
    free = machine_room()[1]
    BTRFS_IMAGE.unlink(missing_ok=True)
    with open(BTRFS_IMAGE, "wb") as f:
        f.truncate(int((free - DISK_RESERVE_GB) * 1e9))
    try:
        run("mkfs.btrfs", "-q", BTRFS_IMAGE)
        # nobarrier: the nodes are thrown away after the run, and each fsync (dpkg makes
        # thousands) would otherwise flush the loop file's whole disk.
        run("mount", "-o", "loop,compress=zstd:1,nobarrier,user_subvol_rm_allowed", BTRFS_IMAGE, NODES)
        try:
            yield "btrfs, compress=zstd:1, nobarrier, on a loop file (Docker on the nodes: its btrfs driver)"
        finally:
            subprocess.run(["umount", str(NODES)], check=False)
    finally:
        BTRFS_IMAGE.unlink(missing_ok=True)


def machine_room() -> tuple[float, float]:
    """(GB of memory available, GB free on the disk holding the lab's state)."""
    meminfo = dict(
        line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line
    )
    available = int(meminfo["MemAvailable"].split()[0]) / 1e6
    stat = os.statvfs(STATE if STATE.exists() else "/")
    return available, stat.f_bavail * stat.f_frsize / 1e9


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine (controller and every lab node) has been busy."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


# Every measured command is started by this small launcher (started at the first timed()):
# Linux carries a process's peak RSS across fork and exec (exec_mmap records the old address
# space's high-water mark in signal->maxrss), so a command forked by the bench itself reports at
# least the bench's own size as its peak; one forked by the freshly exec'd launcher, the
# launcher's small size at most. Each command gets the bench's environment of the moment.
LAUNCHER = r"""
import json, os, subprocess, sys
for line in sys.stdin:
    req = json.loads(line)
    with open(req["out"], "w") as out:
        proc = subprocess.Popen(
            req["argv"], cwd=req["cwd"], env=req["env"], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(proc.pid, 0)
    done = {"status": status, "maxrss": usage.ru_maxrss, "cpu": usage.ru_utime + usage.ru_stime}
    print(json.dumps(done), flush=True)
"""


class Launcher:
    """The launcher process (LAUNCHER): one command at a time, over a pipe."""

    _proc: subprocess.Popen | None = None

    @classmethod
    def run(cls, argv: list[str], cwd: Path, out: str) -> dict:
        if cls._proc is None or cls._proc.poll() is not None:
            cls._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", LAUNCHER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert cls._proc.stdin and cls._proc.stdout
        cls._proc.stdin.write(
            json.dumps({"argv": argv, "cwd": str(cwd), "out": out, "env": dict(os.environ)}) + "\n"
        )
        cls._proc.stdin.flush()
        line = cls._proc.stdout.readline()
        if not line:
            raise LabError("the bench's launcher process ended")
        return json.loads(line)


def timed(argv: list[str], cwd=REPO) -> dict:
    """Run a command; wall seconds, peak RSS (MB) of its largest process (it or a child it
    waited for), output, and CPU seconds: the command's own (the controller) and the rest of
    the machine's (the nodes)."""
    busy0 = busy_cpu_seconds()
    t0 = time.monotonic()
    with tempfile.NamedTemporaryFile("r") as out:
        done = Launcher.run(argv, cwd, out.name)
        wall = time.monotonic() - t0
        text = out.read()
    controller = done["cpu"]
    nodes = max(0.0, busy_cpu_seconds() - busy0 - controller)
    return {
        "wall": wall,
        "rc": os.waitstatus_to_exitcode(done["status"]),
        "peak_mb": done["maxrss"] / 1024,
        "out": text,
        "cpu_controller": controller,
        "cpu_nodes": nodes,
    }


def ssh_commands(debug_output: str) -> Counter:
    return Counter(re.findall(r"Running command on (\S+?):", debug_output))


def measure(step: str, argv: list[str], addresses: list[str], caches: set[str] | None = None) -> dict:
    offsets = log_offsets()
    result = timed(argv)
    fetched = _bytes_by_client(MIRROR_LOG, offsets[MIRROR_LOG], MIRROR_LINE)
    fetched.update(_bytes_by_client(ACNG_LOG, offsets[ACNG_LOG], ACNG_LINE))
    fetched.update(_bytes_by_client(REGISTRY_CACHE_LOG, offsets[REGISTRY_CACHE_LOG], REGISTRY_LINE))
    per_node = [fetched.get(a, 0) for a in addresses]
    cmds = ssh_commands(result["out"])
    ops = operations(result["out"])
    via_cache, direct = upstream_bytes(offsets, addresses, caches or {"127.0.0.1"})
    cpu = result["cpu_controller"]
    items = pytest_items(result["out"])
    result.update(
        items_per_node=items / len(addresses) if items is not None and addresses else None,
        step=step,
        cmds_per_host=(sum(cmds.values()) / len(cmds)) if cmds else None,
        mb_per_node=(sum(per_node) / len(per_node) / 1e6) if per_node else 0,
        cpu_ms_per_node=cpu * 1000 / len(addresses) if addresses else None,
        cpu_ms_per_op=cpu * 1000 / ops if ops else None,
        upstream_cache_mb=via_cache / 1e6,
        upstream_direct_mb=direct / 1e6,
    )
    log = LOGS / f"bench-{len(addresses)}-{step.replace(' ', '-')}.log"
    log.write_text(result["out"])  # for profiling afterwards (pyinfra --debug output)
    if result["rc"] != 0:
        print(f"  {step}: exit {result['rc']}, output in {log}")
    return result


def fill_registry_cache(cluster_path: Path, addresses: list[str], caches: set[str]) -> dict:
    """The row of registry.fill_cache for the cluster's task images (determined.task_image.*)."""
    images = (yaml.safe_load(cluster_path.read_text()).get("determined") or {}).get("task_image") or {}
    offsets = log_offsets()
    t0 = time.monotonic()
    registry.fill_cache(sorted(set(images.values())))
    via_cache, direct = upstream_bytes(offsets, addresses, caches)
    return {
        **controller_step("fill the registry cache (controller)", time.monotonic() - t0),
        "upstream_cache_mb": via_cache / 1e6,
        "upstream_direct_mb": direct / 1e6,
    }


def controller_step(step: str, wall: float) -> dict:
    """A row for work the bench does itself (booting, filling a cache): wall time only."""
    return {
        "step": step,
        "wall": wall,
        "rc": 0,
        "peak_mb": None,
        "cmds_per_host": None,
        "mb_per_node": 0,
        "cpu_controller": None,
        "cpu_nodes": None,
    }


def bench_size(size: int, octet: int, workdir: Path) -> list[dict]:
    path = workdir / f"cluster-{size}.yaml"
    path.write_text(cluster_yaml(size, octet))
    inventory = workdir / f"inventory_{size}.py"
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(path)!r}))\n")
    rows = []
    t0 = time.monotonic()
    spec = lifecycle.up(path, log=lambda *_: None)
    rows.append(controller_step("lab up (boot)", time.monotonic() - t0))
    addresses = [str(n.address) for n in spec.nodes]
    caches = {"127.0.0.1", str(spec.controller_address)}
    deploy = [PYINFRA, "-y", "--debug", str(inventory), "deploy.py"]
    sharded = [sys.executable, "-m", "deploy.shards", str(inventory), "--debug"]
    try:
        # The caching point starts empty for each size's cold deploy, as a site's new one would,
        # and the registry cache is filled once before it (docs/site-setup.md, fill_cache).
        services.clear_apt_cache()
        registry.clear_cache()
        rows.append(fill_registry_cache(path, addresses, caches))
        rows.append(measure("cold deploy", deploy, addresses, caches))
        rows.append(measure("no-op re-deploy", deploy, addresses, caches))
        rows.append(measure(f"no-op re-deploy, {os.cpu_count()} shards", sharded, addresses, caches))
        verify = [sys.executable, "-m", "deploy", "verify", "--cluster", str(path)]
        rows.append(measure("verify", verify, addresses, caches))
        # Its spread over several runs of the healthy lab (verify_spread), and on a lab whose
        # every slot users hold (its smoke rows say busy: no red cell, not much slower).
        for _ in range(VERIFY_RUNS - 1):
            rows.append(measure("verify, again", verify, addresses, caches))
        with busy.every_slot_held(load_cluster(str(path))):
            rows.append(measure(BUSY_STEP, verify, addresses, caches))
        # One agent powered off: its column SSH after one bounded wait; exit 1 by design.
        dead = spec.nodes[-1]
        nodes.stop(dead)
        nodes.pull_cables(dead)
        try:
            rows.append({**measure("verify, 1 node dead", verify, addresses, caches), "expected_rc": 1})
        finally:
            nodes.pull_cables(dead, pulled=False)
            nodes.start(spec, dead)
            nodes.wait_ready(spec, dead)
        victim = spec.nodes[1]
        lifecycle.recreate(path, victim.hostname, log=lambda *_: None)
        rows.append(
            measure("one-node rebuild", deploy + ["--limit", victim.hostname], [str(victim.address)], caches)
        )
    finally:
        lifecycle.down(path, log=lambda *_: None)
    for row in rows:
        row["size"] = size
    return rows


VERIFY_RUNS = 5
BUSY_STEP = "verify, every slot busy"


def verify_spread(rows: list[dict]) -> str:
    """One line per size: verify's wall time over the healthy runs (min / median / max) and the
    busy run against their median."""
    lines = []
    for size in sorted({r["size"] for r in rows}):
        healthy = [r["wall"] for r in rows if r["size"] == size and r["step"] in ("verify", "verify, again")]
        busy_runs = [r["wall"] for r in rows if r["size"] == size and r["step"] == BUSY_STEP]
        if not healthy:
            continue
        median = statistics.median(healthy)
        line = (
            f"- {size} nodes: verify over {len(healthy)} healthy runs: min {min(healthy):.1f} s, "
            f"median {median:.1f} s, max {max(healthy):.1f} s"
        )
        if busy_runs:
            line += f"; every slot busy: {busy_runs[0]:.1f} s ({busy_runs[0] / median:.2f}x the median)"
        lines.append(line)
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = [
        "| nodes | step | wall s | SSH cmds/host | MB fetched/node | controller peak MB "
        "| CPU s controller | CPU ms controller/node | CPU ms controller/op·host | CPU s nodes "
        "| upstream MB via cache | upstream MB direct | pytest items/node | exit |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for r in rows:
        lines.append(
            f"| {r['size']} | {r['step']} | {r['wall']:.1f} | {num(r['cmds_per_host'], '.0f')} | "
            f"{r['mb_per_node']:.1f} | {num(r['peak_mb'], '.0f')} | {num(r['cpu_controller'], '.1f')} | "
            f"{num(r.get('cpu_ms_per_node'), '.0f')} | {num(r.get('cpu_ms_per_op'), '.2f')} | "
            f"{num(r['cpu_nodes'], '.1f')} | {num(r.get('upstream_cache_mb'), '.1f')} | "
            f"{num(r.get('upstream_direct_mb'), '.1f')} | {num(r.get('items_per_node'), '.1f')} | {r['rc']} |"
        )
    return "\n".join(lines)


def machine() -> str:
    mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    import pyinfra

    return (
        f"{os.cpu_count()} cores, {int(mem) / 1e6:.1f} GB RAM, kernel {platform.release()}, "
        f"Python {platform.python_version()}, pyinfra {pyinfra.__version__}, "
        f"{time.strftime('%Y-%m-%d')}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab.bench", description=__doc__)
    parser.add_argument("--sizes", default="4,16,32,64")
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    parser.add_argument(
        "--storage",
        choices=("auto", "disk", "btrfs"),
        default="auto",
        help="where the nodes' disks live: the lab's disk, a compressed btrfs (node_storage), or "
        "the first unless the largest size does not fit there (default)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    # Each size is booted, measured and taken down before the next: the largest must fit, on
    # the lab's disk or else on compressed storage (then every size uses it, for one baseline).
    room = machine_room()
    compressed = args.storage == "btrfs" or (args.storage == "auto" and bool(fit_problems(max(sizes), *room)))
    problems = fit_problems(max(sizes), *room, NODE_DISK_GB_COMPRESSED if compressed else NODE_DISK_GB)
    if problems:
        for problem in problems:
            print(f"--sizes {args.sizes}: {problem}; nothing was booted", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp, node_storage(compressed) as storage:
        # The facts each host asks for are kept between runs (deploy/pyinfra_ext/factcache.py): start
        # without any, as an operator's first deploy does.
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        for i, size in enumerate(sizes):
            print(f"== {size} nodes", flush=True)
            rows += bench_size(size, 40 + i, Path(tmp))
            print(table([r for r in rows if r["size"] == size]), flush=True)
    report = (
        f"# Benchmarks\n\nMachine: {machine()}; the nodes' disks: {storage}\n\n"
        f"Command: `python -m tests.lab.bench --sizes {args.sizes}`\n\n{table(rows)}\n\n"
        f"{verify_spread(rows)}\n"
    )
    Path(args.out).write_text(report)
    print(report)
    return 0 if all(r["rc"] == r.get("expected_rc", 0) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
