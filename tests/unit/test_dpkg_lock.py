"""Waiting for dpkg's lock where apt-get's DPkg::Lock::Timeout does not reach: `apt-mark hold`
(files/shared/apt-mark-hold.sh) and mlnxofedinstall (files/fabric/install.sh); and the
driver's reboot remembered before its install (roles/apt/cuda_repo.py pinned's before_install).

A freshly booted Debian or Ubuntu node runs apt-daily.service or unattended-upgrades, which
hold dpkg's lock for minutes; the 32-node bench met it: `apt-mark hold` failed with "dpkg
frontend lock was locked by another process", and that run never rebooted into the driver it
had installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from pyinfra.context import ctx_host
from pyinfra.facts.deb import DebPackages

from deploy.pins import container_toolkit_pins, driver_pins
from roles.apt import cuda_repo as apt_pins
from roles.fabric import mofed
from roles.shared.ops import DPKG_LOCK_TIMEOUT
from roles.shared.scripts import script

LOCKED = (
    "dpkg: error: dpkg frontend lock was locked by another process with pid 4183\n"
    "E: Sub-process dpkg --set-selections returned an error code (2)\n"
    "E: Executing dpkg failed. Are you root?"
)


def fake_apt_mark(tmp_path: Path, failures: int, message: str) -> dict:
    """PATH with an apt-mark that fails `failures` times with `message`, then holds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "count"
    (bin_dir / "apt-mark").write_text(
        "#!/bin/sh\n"
        f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n"
        f'if [ "$n" -lt {failures} ]; then printf "%s\\n" "{message}" >&2; exit 100; fi\n'
        'for p in "$@"; do [ "$p" = hold ] || echo "$p set on hold."; done\n'
    )
    (bin_dir / "apt-mark").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def hold(env: dict, timeout: int, *packages: str) -> subprocess.CompletedProcess:
    command = script("shared/apt-mark-hold.sh", timeout, *packages)
    return subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, env=env, check=False
    )


def test_apt_mark_hold_waits_for_the_lock(tmp_path):
    env = fake_apt_mark(tmp_path, 1, LOCKED)
    start = time.monotonic()
    proc = hold(env, 600, "linux-image-amd64", "nvidia-driver-515")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["linux-image-amd64 set on hold.", "nvidia-driver-515 set on hold."]
    assert (tmp_path / "count").read_text().strip() == "2"
    assert proc.stderr == "apt-mark hold: dpkg's lock is held by another process: waiting up to 600s\n"
    assert time.monotonic() - start >= 5  # it waited before trying again


def test_apt_mark_hold_gives_up_after_the_timeout(tmp_path):
    proc = hold(fake_apt_mark(tmp_path, 99, LOCKED), 0, "nvidia-driver-515")
    assert proc.returncode == 1
    assert "frontend lock was locked by another process" in proc.stderr
    assert proc.stderr.strip().endswith(
        "apt-mark hold: dpkg's lock was still held by another process after 0s"
    )


def test_apt_mark_hold_reports_other_failures_at_once(tmp_path):
    proc = hold(fake_apt_mark(tmp_path, 99, "E: Can't select installed nor candidate version"), 600, "x")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "E: Can't select installed nor candidate version"
    assert (tmp_path / "count").read_text().strip() == "1"


def ofed_tarball(tmp_path: Path) -> Path:
    """A tarball whose TOP/mlnxofedinstall writes tmp_path/ran."""
    top = tmp_path / "src" / "top"
    top.mkdir(parents=True)
    (top / "mlnxofedinstall").write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\n")
    (top / "mlnxofedinstall").chmod(0o755)
    tarball = tmp_path / "ofed.tgz"
    subprocess.run(["tar", "-czf", str(tarball), "-C", str(tmp_path / "src"), "top"], check=True)
    return tarball


def install(tmp_path: Path, lock_timeout: int, dpkg: Path | None = None) -> subprocess.CompletedProcess:
    """Run install.sh in a PID namespace of its own (with `dpkg` running beside it): the
    script looks at every process it can see, and this machine's may be installing."""
    command = script(
        "fabric/install.sh", ofed_tarball(tmp_path), tmp_path / "work", "top", "R", "x", lock_timeout
    )
    line = (f"{dpkg} 30 & " if dpkg else "") + command.get_raw_value()
    return subprocess.run(
        ["unshare", "-rpf", "--mount-proc", "sh", "-c", line], capture_output=True, text=True, check=False
    )


def test_mofed_install_waits_while_dpkg_runs(tmp_path):
    # A process named dpkg: a copy of sleep (the kernel names a process after its file).
    dpkg = tmp_path / "dpkg"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", dpkg)
    proc = install(tmp_path, 0, dpkg)
    assert proc.returncode == 1, proc.stderr
    assert (
        proc.stderr.strip() == "R: apt or dpkg still runs after 0s (dpkg): let it finish, then deploy again"
    )
    assert not (tmp_path / "ran").exists()


def test_mofed_install_runs_when_no_apt_job_does(tmp_path):
    proc = install(tmp_path, 0)
    assert (tmp_path / "ran").exists(), proc.stderr


def test_mofed_waits_as_long_as_apt_get():
    fake = SimpleNamespace(get_fact=lambda cls, **kw: None, noop=print)
    with ctx_host.use(fake):
        [command] = list(mofed.install._inner("/var/cache/mlnx-ofed/x.tgz", "MLNX_OFED_LINUX-5.8-3.0.7.0"))
    assert command.get_raw_value().endswith(f" {DPKG_LOCK_TIMEOUT}")


def test_reboot_is_remembered_just_before_an_install(monkeypatch):
    calls: list[str] = []
    for name in ("update_if_stale", "available", "hold"):
        monkeypatch.setattr(apt_pins, name, lambda *a, _n=name, **k: calls.append(_n))
    monkeypatch.setattr(apt_pins.files, "put", lambda **k: calls.append("preferences"))
    monkeypatch.setattr(apt_pins.apt, "packages", lambda **k: calls.append("install"))
    pinset = driver_pins("515.65.01")
    repo = apt_pins.Repo(url="http://mirror/cuda/", sources=SimpleNamespace(did_change=lambda: False))

    def plan(installed: dict) -> list[str]:
        calls.clear()
        fake = SimpleNamespace(get_fact=lambda cls, **kw: {DebPackages: installed}[cls], noop=print)
        with ctx_host.use(fake):
            apt_pins.pinned.__wrapped__(pinset, repo, before_install=lambda: calls.append("remember"))
        return list(calls)

    order = ["update_if_stale", "available", "preferences", "remember", "install", "hold"]
    assert plan({}) == order
    one_off = {p: {v} for p, v in pinset.as_dict().items()} | {"nvidia-dkms-515": {"510.47.03-0ubuntu1"}}
    assert plan(one_off) == order
    at_pin = {p: {v} for p, v in pinset.as_dict().items()}
    assert plan(at_pin) == ["update_if_stale", "available", "preferences", "install", "hold"]


def test_the_driver_installs_without_recommends_other_pin_sets_with(monkeypatch):
    # nvidia-driver-515 Recommends nvidia-settings, unversioned: apt would take the repo's
    # newest build (deploy/pins.py); other pin sets keep apt's default.
    seen: dict[str, bool] = {}
    for name in ("update_if_stale", "available", "hold"):
        monkeypatch.setattr(apt_pins, name, lambda *a, **k: None)
    monkeypatch.setattr(apt_pins.files, "put", lambda **k: None)
    monkeypatch.setattr(
        apt_pins.apt, "packages", lambda **k: seen.__setitem__(k["packages"][0], k["no_recommends"])
    )
    repo = apt_pins.Repo(url="http://mirror/cuda/", sources=SimpleNamespace(did_change=lambda: False))
    fake = SimpleNamespace(get_fact=lambda cls, **kw: {DebPackages: {}}[cls], noop=print)
    with ctx_host.use(fake):
        for pinset in (driver_pins("515.65.01"), container_toolkit_pins()):
            apt_pins.pinned.__wrapped__(pinset, repo)
    assert seen == {"cuda-drivers-515=515.65.01-1": True, "libnvidia-container1=1.13.5-1": False}
