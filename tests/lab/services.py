"""Controller-side services the nodes use: Debian's archive through apt-cacher-ng
(the way an air-gapped cluster reaches it) and the lab mirror of vendor stand-ins."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .paths import APT_PROXY_PORT, GPG_HOME, LOGS, MIRROR, MIRROR_PORT, REPO, RUN
from .shell import LabError

ACNG_BACKENDS = Path("/etc/apt-cacher-ng/backends_debian")
DEBIAN_BACKEND = "http://deb.debian.org/debian/\n"
ACNG_CACHE = Path("/var/cache/apt-cacher-ng")
# The lab mirror (the vendors' stand-in) behind apt-cacher-ng as well, the way docs/site-setup.md
# puts NVIDIA's, Mellanox's, MinIO's and Determined's servers behind a site's caching point:
# nodes that ask http://<controller>:3142/labmirror/... get the mirror's files through the
# cache (the bench's clusters do; the default lab's nodes go to the mirror directly). The lab's
# MOFED tarball (.tgz) and MinIO binary (no extension) are outside apt-cacher-ng's default file
# patterns: without PfilePatternEx it refuses them with 403.
ACNG_LAB_CONF = Path("/etc/apt-cacher-ng/zz-dtlab.conf")
ACNG_LAB_SETTINGS = (
    "# Written by the lab (tests/lab/services.py): the lab mirror behind apt-cacher-ng.\n"
    f"Remap-labmirror: /labmirror ; http://127.0.0.1:{MIRROR_PORT}\n"
    "PfilePatternEx: (\\.tgz|/minio(\\.RELEASE\\.[^/]+)?)$\n"
)


def _listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def _pid_alive(pidfile: Path, marker: str) -> int | None:
    try:
        pid = int(pidfile.read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if marker.encode() in cmd else None


def _daemon(
    name: str, argv: list[str], port: int, marker: str, host: str = "127.0.0.1", env: dict | None = None
) -> None:
    pidfile = RUN / f"{name}.pid"
    if _listening(port, host):
        return
    RUN.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = open(LOGS / f"{name}.log", "ab")  # noqa: SIM115 (the service keeps it)
    proc = subprocess.Popen(
        argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env
    )
    pidfile.write_text(f"{proc.pid}\n")
    for _ in range(100):
        if _listening(port, host):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise LabError(f"{name} did not start listening on port {port}; see {LOGS / (name + '.log')}")


def ensure_apt_proxy() -> None:
    if not Path("/usr/sbin/apt-cacher-ng").exists():
        raise LabError("apt-cacher-ng is missing: apt-get install -y apt-cacher-ng")
    # Without a backend every request fails with '503 Host not found'.
    current = ACNG_BACKENDS.read_text() if ACNG_BACKENDS.exists() else ""
    if current != DEBIAN_BACKEND:
        ACNG_BACKENDS.write_text(DEBIAN_BACKEND)
    if not ACNG_LAB_CONF.exists() or ACNG_LAB_CONF.read_text() != ACNG_LAB_SETTINGS:
        ACNG_LAB_CONF.write_text(ACNG_LAB_SETTINGS)
        stop_service("apt-cacher-ng", "apt-cacher-ng")  # it reads its configuration at start
    _daemon(
        "apt-cacher-ng",
        ["/usr/sbin/apt-cacher-ng", "-c", "/etc/apt-cacher-ng", "ForeGround=1", f"Port={APT_PROXY_PORT}"],
        APT_PROXY_PORT,
        "apt-cacher-ng",
    )


def ensure_mirror(base_url: str) -> None:
    from . import mirror

    mirror.build_mirror(MIRROR, base_url, GPG_HOME)
    _daemon(
        "mirror",
        [
            sys.executable,
            "-m",
            "tests.lab.mirror",
            "serve",
            "--dir",
            str(MIRROR),
            "--bind",
            "0.0.0.0",
            "--port",
            str(MIRROR_PORT),
        ],
        MIRROR_PORT,
        "tests.lab.mirror",
    )


def stop_service(name: str, marker: str, timeout: float = 10) -> None:
    pid = _pid_alive(RUN / f"{name}.pid", marker)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(RUN / f"{name}.pid", marker) and time.monotonic() < deadline:
            time.sleep(0.1)
    (RUN / f"{name}.pid").unlink(missing_ok=True)


def clear_apt_cache() -> None:
    """apt-cacher-ng without anything cached (Debian's packages, the mirror's files): what a
    site's new caching point holds before its first cold deploy (tests/lab/bench.py)."""
    stop_service("apt-cacher-ng", "apt-cacher-ng")
    for name in ("debrep", "labmirror", "_xstore"):
        shutil.rmtree(ACNG_CACHE / name, ignore_errors=True)
    ensure_apt_proxy()


def stop_services() -> None:
    services = (
        ("mirror", "tests.lab.mirror"),
        ("apt-cacher-ng", "apt-cacher-ng"),
        ("registry", "docker-registry"),
        ("registry-cache", "docker-registry"),
    )
    for name, marker in services:
        stop_service(name, marker)
