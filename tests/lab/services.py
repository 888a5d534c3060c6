"""Controller-side services the nodes use: Debian's archive through apt-cacher-ng
(the way an air-gapped cluster reaches it) and the lab mirror of vendor stand-ins."""

import os
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


def _daemon(name: str, argv: list[str], port: int, marker: str, host: str = "127.0.0.1") -> None:
    pidfile = RUN / f"{name}.pid"
    if _listening(port, host):
        return
    RUN.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = open(LOGS / f"{name}.log", "ab")  # noqa: SIM115 (the service keeps it)
    proc = subprocess.Popen(
        argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
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


def stop_services() -> None:
    services = (
        ("mirror", "tests.lab.mirror"),
        ("apt-cacher-ng", "apt-cacher-ng"),
        ("registry", "docker-registry"),
    )
    for name, marker in services:
        pid = _pid_alive(RUN / f"{name}.pid", marker)
        if pid:
            os.kill(pid, signal.SIGTERM)
        (RUN / f"{name}.pid").unlink(missing_ok=True)
