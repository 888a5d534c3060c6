"""Fabric manager, persistence mode and nvidia-peermem: NVSwitch detection, pin sets, the
role's files, and the lab's nvidia-persistenced / nv-fabricmanager stand-ins as packaged.

The stand-ins read test-only overrides for /run/nvidia-standin and /sys/bus/pci/devices;
nothing here writes outside tmp_path.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents

from deploy.facts.gpu import GpuPersistence, ModuleState, NvSwitches, nvswitch_command, parse_nvswitches
from deploy.pins import PinError, driver_pins, fabricmanager_pins
from roles.apt import pinsets as apt_pinsets
from roles.nvidia import gpu_services
from roles.shared.templates import files_path
from tests.lab import mirror
from tests.unit.optest import on_host, run_op, shown

# What /sys/bus/pci/devices/*/{vendor,class} read on an HGX A100 board (NVSwitch 10de:1af1,
# class 0x068000), next to its GPUs (0x030200), a ConnectX NIC and an Intel bridge that shares
# the NVSwitch's class: only NVIDIA's vendor id with that class is an NVSwitch.
HGX_LINES = [
    "0000:00:01.3 0x8086 0x068000",
    "0000:07:00.0 0x10de 0x030200",
    "0000:0c:00.0 0x15b3 0x020700",
    "0000:c5:00.0 0x10de 0x068000",
    "0000:c4:00.0 0x10de 0x068000",
    "garbage",
]


def test_nvswitches_are_nvidia_pci_devices_of_class_068000():
    assert parse_nvswitches(HGX_LINES) == ["0000:c4:00.0", "0000:c5:00.0"]
    assert parse_nvswitches(HGX_LINES[:3]) == []
    assert NvSwitches().process(HGX_LINES) == ["0000:c4:00.0", "0000:c5:00.0"]
    assert NvSwitches.default() == []


def fake_pci(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    for address, (vendor, pci_class) in devices.items():
        d = root / address
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(pci_class + "\n")
    return root


def test_nvswitch_command_reads_sysfs(tmp_path):
    pci = fake_pci(
        tmp_path / "pci",
        {"0000:07:00.0": ("0x10de", "0x030200"), "0000:c4:00.0": ("0x10de", "0x068000")},
    )
    out = subprocess.run(["sh", "-c", nvswitch_command(str(pci))], capture_output=True, text=True, check=True)
    assert parse_nvswitches(out.stdout.splitlines()) == ["0000:c4:00.0"]
    empty = subprocess.run(
        ["sh", "-c", nvswitch_command(str(tmp_path / "none"))], capture_output=True, text=True, check=True
    )
    assert parse_nvswitches(empty.stdout.splitlines()) == []


def test_persistence_fact_and_what_is_off():
    modes = GpuPersistence().process(["0, Enabled", "1, Disabled", "2, Enabled", "No devices were found"])
    assert modes == {0: "Enabled", 1: "Disabled", 2: "Enabled"}
    assert gpu_services.persistence_off(modes) == [1]
    assert gpu_services.persistence_off({}) == []


def test_fabric_manager_is_pinned_to_the_drivers_version():
    pins = fabricmanager_pins("515.65.01")
    assert pins.packages == (("nvidia-fabricmanager-515", "515.65.01-1"),)
    assert pins.origin == driver_pins("515.65.01").origin
    assert fabricmanager_pins("520.61.05").install_args() == ["nvidia-fabricmanager-520=520.61.05-1"]
    with pytest.raises(PinError):
        fabricmanager_pins("515")


def test_persistenced_moves_with_the_driver():
    # nvidia-driver-<branch> depends on the exact nvidia-compute-utils build: a pin of its
    # own would hold the old build while the driver moves, and apt could not upgrade.
    assert driver_pins("515.65.01").as_dict()["nvidia-compute-utils-515"] == "515.65.01-0ubuntu1"


def test_fabric_manager_preferences_like_the_drivers():
    pins = fabricmanager_pins("515.65.01")
    assert apt_pinsets.preferences_path(pins) == "/etc/apt/preferences.d/nvidia-fabricmanager.pref"
    text = apt_pinsets.render_preferences(pins)
    assert "Package: nvidia-fabricmanager-515\nPin: version 515.65.01-1\nPin-Priority: 1001" in text
    assert "Pin-Priority: -1" in text


def test_persistenced_drop_in_is_nvidias_override():
    text = files_path("nvidia/nvidia-persistenced.conf").read_text()
    execs = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    # The empty ExecStart= clears the packaged command before the new one.
    assert execs == ["ExecStart=", "ExecStart=/usr/bin/nvidia-persistenced --verbose"]
    assert "--no-persistence-mode" not in execs[1]
    peermem = files_path("nvidia/nvidia-peermem.conf").read_text().splitlines()
    assert [line for line in peermem if not line.startswith("#")] == ["nvidia-peermem"]


# ------------------------------------------------------------------ stand-ins as packaged

needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("gpg", "dpkg-deb", "gcc")),
    reason="needs gpg, dpkg-deb and gcc",
)


@pytest.fixture(scope="module")
def cuda(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-services-mirror")
    mirror.build_mirror(root / "mirror", "http://10.77.0.1:8077", root / "gpg", out=io.StringIO())
    return root / "mirror/cuda/repos/debian12/x86_64"


def unpacked(cuda: Path, tmp_path: Path, deb: str) -> Path:
    dest = tmp_path / deb
    subprocess.run(["dpkg-deb", "-x", str(cuda / deb), str(dest)], check=True)
    return dest


def run(exe: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, env={**os.environ, **env}, check=False, timeout=20
    )


def stop(pid_file: Path) -> None:
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


@needs_tools
def test_fabric_manager_standin_refuses_like_the_real_one(cuda, tmp_path):
    root = unpacked(cuda, tmp_path, "nvidia-fabricmanager-515_515.65.01-1_amd64.deb")
    exe = root / "usr/bin/nv-fabricmanager"
    unit = (root / "lib/systemd/system/nvidia-fabricmanager.service").read_text()
    assert "ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg" in unit
    run_dir, pid = tmp_path / "run", tmp_path / "fm/nv-fabricmanager.pid"
    run_dir.mkdir()
    env = {
        "DTLAB_STANDIN_RUN_DIR": str(run_dir),
        "DTLAB_STANDIN_PCI_DEVICES": str(tmp_path / "pci"),
        "DTLAB_STANDIN_FM_PID": str(pid),
    }
    (run_dir / "loaded-version").write_text("515.48.07\n")
    mismatch = run(exe, "-c", "/usr/share/nvidia/nvswitch/fabricmanager.cfg", env=env)
    assert mismatch.returncode == 1
    assert (
        "fabric manager NVIDIA GPU driver interface version 515.65.01 don't match with driver "
        "version 515.48.07. Please update with matching NVIDIA driver package." in mismatch.stderr
    )
    (run_dir / "loaded-version").write_text("515.65.01\n")
    fake_pci(tmp_path / "pci", {"0000:07:00.0": ("0x10de", "0x030200")})
    nothing = run(exe, env=env)
    assert nothing.returncode == 1
    assert "[NV_WARN_NOTHING_TO_DO]" in nothing.stderr
    fake_pci(tmp_path / "pci", {"0000:c4:00.0": ("0x10de", "0x068000")})
    started = run(exe, env=env)
    assert started.returncode == 0, started.stderr
    stop(pid)


@needs_tools
def test_persistenced_standin_sets_persistence_unless_told_not_to(cuda, tmp_path):
    root = unpacked(cuda, tmp_path, "nvidia-compute-utils-515_515.65.01-0ubuntu1_amd64.deb")
    exe = root / "usr/bin/nvidia-persistenced"
    unit = (root / "lib/systemd/system/nvidia-persistenced.service").read_text()
    assert "--no-persistence-mode" in unit and "StopWhenUnneeded=true" in unit
    assert "\n[Install]" not in unit
    run_dir, pid_dir = tmp_path / "run", tmp_path / "pd"
    run_dir.mkdir()
    env = {"DTLAB_STANDIN_RUN_DIR": str(run_dir), "DTLAB_STANDIN_PERSISTENCED_DIR": str(pid_dir)}
    no_driver = run(exe, "--verbose", env=env)
    assert no_driver.returncode == 1
    assert "nvidia-persistenced failed to initialize. Check syslog for more details." in no_driver.stderr
    (run_dir / "loaded-version").write_text("515.65.01\n")
    flag = run_dir / "persistence-mode"
    off = run(exe, "--no-persistence-mode", "--verbose", env=env)
    assert off.returncode == 0, off.stderr
    time.sleep(0.3)
    assert not flag.exists()
    stop(pid_dir / "nvidia-persistenced.pid")
    on = run(exe, "--verbose", env=env)
    assert on.returncode == 0, on.stderr
    for _ in range(30):
        if flag.exists():
            break
        time.sleep(0.1)
    assert flag.exists()
    stop(pid_dir / "nvidia-persistenced.pid")
    assert not flag.exists()


@needs_tools
def test_smi_reports_persistence_per_gpu_as_set(cuda, tmp_path):
    root = unpacked(cuda, tmp_path, "nvidia-utils-515_515.65.01-0ubuntu1_amd64.deb")
    run_dir, etc_dir = tmp_path / "run", tmp_path / "etc"
    run_dir.mkdir()
    etc_dir.mkdir()
    (run_dir / "loaded-version").write_text("515.65.01\n")
    env = {"DTLAB_STANDIN_RUN_DIR": str(run_dir), "DTLAB_STANDIN_ETC_DIR": str(etc_dir)}
    exe = root / "usr/bin/nvidia-smi"

    def modes() -> list[str]:
        out = run(exe, "--query-gpu=persistence_mode", "--format=csv,noheader", env=env)
        return out.stdout.split()

    assert modes() == ["Disabled"] * 8
    (run_dir / "persistence-mode").write_text("")  # what the daemon stand-in writes: every GPU
    assert modes() == ["Enabled"] * 8
    off = run(exe, "-i", "0", "-pm", "0", env=env)
    assert off.returncode == 0 and off.stdout == "Disabled persistence mode for GPU 00000000:07:00.0.\n"
    assert modes() == ["Disabled"] + ["Enabled"] * 7
    assert run(exe, "-pm", "1", env=env).returncode == 0
    assert modes() == ["Enabled"] * 8
    assert run(exe, "-pm", "0", env=env).returncode == 0
    assert modes() == ["Disabled"] * 8


# ------------------------------------------------------------------ the role's decisions


class FakeCluster:
    def __init__(self, reboot: str):
        self.reboot = reboot
        self.versions = type("V", (), {"nvidia_driver": "515.65.01"})()


def at_pin() -> dict[str, set[str]]:
    return {p: {v} for p, v in driver_pins("515.65.01").packages}


@pytest.mark.parametrize(
    ("reboot", "installed", "owed", "waits"),
    [
        ("auto", {}, None, False),  # the driver role reboots before these operations run
        ("never", at_pin(), None, False),
        ("never", {}, None, True),  # this run installs the driver: no daemon before the reboot
        ("never", at_pin(), ["nvidia-dkms-515"], True),  # an earlier run's reboot is owed
        ("never", at_pin(), ["linux-image-foo"], False),
    ],
)
def test_services_start_unless_the_driver_waits_for_a_reboot(reboot, installed, owed, waits):
    with on_host({DebPackages: installed, FileContents: owed}):
        assert gpu_services.driver_waits_for_reboot(FakeCluster(reboot)) is waits


def test_persistence_on_only_when_a_gpu_is_off():
    commands, noops = run_op(gpu_services.persistence_on, {GpuPersistence: {0: "Enabled", 1: "Enabled"}})
    assert commands == []
    assert noops
    commands, _ = run_op(gpu_services.persistence_on, {GpuPersistence: {0: "Enabled", 1: "Disabled"}})
    assert commands == ["nvidia-smi -pm 1"]
    # no driver: the daemon's start sets it
    commands, _ = run_op(gpu_services.persistence_on, {GpuPersistence: {}})
    assert commands == []


@pytest.mark.parametrize(
    ("state", "commands"),
    [
        ("live", []),
        (None, ["modprobe nvidia_peermem"]),  # not loaded (no entry in /sys/module)
        ("coming", ["modprobe nvidia_peermem"]),  # its init has not finished
    ],
)
def test_peermem_loaded_now_unless_live(state, commands):
    got, _ = run_op(gpu_services.module_loaded, {ModuleState: state}, module="nvidia_peermem")
    assert [shown(c) for c in got] == commands


def test_module_state_reads_the_kernels_entry():
    fact = ModuleState()
    command = fact.command(module="nvidia_peermem")
    assert command == "cat /sys/module/nvidia_peermem/initstate 2>/dev/null || true"
    assert fact.process(["live"]) == "live"
    assert fact.process([]) is None
