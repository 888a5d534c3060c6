"""tests/lab/rootfs.py: debootstrap is tried once more after a failure, and only once."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.lab import rootfs
from tests.lab.shell import LabError

# Fails the first `fails` runs the way debootstrap does on a partial package index, then
# builds a stand-in root (the file ensure_base looks for) in the target directory ($4).
FAKE = """#!/bin/sh
count_file={count}
n=$(cat "$count_file" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$count_file"
mkdir -p "$4"
: > "$4/leftover-from-run-$n"
if [ "$n" -le {fails} ]; then
    echo "E: Couldn't find these debs: systemd systemd-sysv dbus openssh-server" >&2
    exit 1
fi
mkdir -p "$4/usr/lib/systemd" && : > "$4/usr/lib/systemd/systemd"
"""


@pytest.fixture
def fake_debootstrap(tmp_path, monkeypatch):
    def install(fails: int) -> Path:
        bindir = tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        count = tmp_path / "runs"
        script = bindir / "debootstrap"
        script.write_text(FAKE.format(count=count, fails=fails))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        return count

    return install


def test_a_failed_debootstrap_is_retried_once(fake_debootstrap, tmp_path):
    runs = fake_debootstrap(fails=1)
    target = tmp_path / "base.tmp"
    logged: list[str] = []
    rootfs.debootstrap(target, log=logged.append)
    assert runs.read_text().strip() == "2"
    assert (target / "usr/lib/systemd/systemd").exists()
    # The half-built tree of the failed run is gone before the second one starts.
    assert not (target / "leftover-from-run-1").exists()
    assert len(logged) == 1 and "attempt 1 of 2" in logged[0]
    assert "Couldn't find these debs" in logged[0]


def test_a_second_failure_is_reported(fake_debootstrap, tmp_path):
    runs = fake_debootstrap(fails=2)
    with pytest.raises(LabError, match="Couldn't find these debs"):
        rootfs.debootstrap(tmp_path / "base.tmp", log=lambda _: None)
    assert runs.read_text().strip() == "2"


def test_success_runs_once(fake_debootstrap, tmp_path):
    runs = fake_debootstrap(fails=0)
    rootfs.debootstrap(tmp_path / "base.tmp", log=lambda _: None)
    assert runs.read_text().strip() == "1"


def test_package_tuning_is_what_dpkg_and_apt_read(tmp_path):
    """The node's dpkg skips fsync and documentation, its apt keeps no .deb: files in the
    directories dpkg (/etc/dpkg/dpkg.cfg.d) and apt (/etc/apt/apt.conf.d) read, in their
    syntax, readable by both."""
    rootfs.write_package_tuning(tmp_path)
    dpkg = tmp_path / "etc/dpkg/dpkg.cfg.d/dtlab-tuning"
    apt = tmp_path / "etc/apt/apt.conf.d/99dtlab-tuning"
    assert dpkg.read_text().splitlines() == [
        "force-unsafe-io",
        "path-exclude=/usr/share/man/*",
        "path-exclude=/usr/share/doc/*",
        "path-include=/usr/share/doc/*/copyright",
    ]
    # apt itself parses it (apt-config: the value apt-get would use).
    proc = subprocess.run(
        ["apt-config", "-c", str(apt), "shell", "KEEP", "APT::Keep-Downloaded-Packages/b"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "KEEP='false'"
    assert stat.S_IMODE(dpkg.stat().st_mode) == stat.S_IMODE(apt.stat().st_mode) == 0o644
