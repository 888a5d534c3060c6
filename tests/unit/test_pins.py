"""The pinned GPU/fabric stack: version -> package strings, apt preferences, MOFED shell.

The preference tests run the real apt (`apt-cache policy`) against throw-away flat repos in
a temporary directory; the MOFED tests run the generated shell with a fake installer.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Sha256File

from deploy.facts.apt import AptRepoVersions, HeldPackages, parse_madison
from deploy.facts.fabric import OfedRelease, parse_ibstat, parse_ofed_info
from deploy.pins import (
    CONTAINER_TOOLKIT_VERSION,
    NVIDIA_REPO_ORIGIN,
    PinError,
    PinSet,
    all_pins,
    container_toolkit_pins,
    cuda_home,
    cuda_pins,
    driver_branch,
    driver_pins,
    nccl_library,
    nccl_pins,
    nccl_version_code,
    ofed_release,
)
from roles.apt import cuda_repo as apt_pins
from roles.apt import pinsets as apt_pinsets
from roles.fabric import mofed
from roles.nvidia import cuda
from roles.nvidia import driver as nvidia_driver
from roles.shared.ops import fetch_verified
from tests.lab.standins.nvidia import build as lab_nvidia
from tests.unit.optest import commands_of

# --------------------------------------------------------------------------------------------
# deploy/pins.py


def test_driver_pins_are_nvidias_exact_builds():
    pins = driver_pins("515.65.01")
    assert pins.install_args() == [
        "cuda-drivers-515=515.65.01-1",
        "nvidia-driver-515=515.65.01-0ubuntu1",
        "nvidia-dkms-515=515.65.01-0ubuntu1",
        "nvidia-kernel-common-515=515.65.01-0ubuntu1",
        "nvidia-kernel-source-515=515.65.01-0ubuntu1",
        "libnvidia-compute-515=515.65.01-0ubuntu1",
        "nvidia-compute-utils-515=515.65.01-0ubuntu1",
        "nvidia-utils-515=515.65.01-0ubuntu1",
        "libnvidia-gl-515=515.65.01-0ubuntu1",
        "libnvidia-common-515=515.65.01-0ubuntu1",
        "libnvidia-extra-515=515.65.01-0ubuntu1",
        "libnvidia-decode-515=515.65.01-0ubuntu1",
        "libnvidia-encode-515=515.65.01-0ubuntu1",
        "libnvidia-fbc1-515=515.65.01-0ubuntu1",
        "libnvidia-cfg1-515=515.65.01-0ubuntu1",
        "xserver-xorg-video-nvidia-515=515.65.01-0ubuntu1",
        "nvidia-modprobe=515.65.01-0ubuntu1",
    ]
    # That this is the driver's whole graph is tests/unit/test_driver_graph.py's to check.
    assert not pins.recommends  # nvidia-settings (unversioned) would come from outside the pin
    assert pins.origin == NVIDIA_REPO_ORIGIN
    assert driver_branch("520.61.05") == "520"
    assert driver_pins("520.61.05").as_dict()["cuda-drivers-520"] == "520.61.05-1"


def test_container_toolkit_pinned_at_one_build_with_its_libraries():
    pins = container_toolkit_pins()
    assert pins.install_args() == [
        "libnvidia-container1=1.13.5-1",
        "libnvidia-container-tools=1.13.5-1",
        "nvidia-container-toolkit-base=1.13.5-1",
        "nvidia-container-toolkit=1.13.5-1",
    ]
    assert pins.origin == NVIDIA_REPO_ORIGIN
    # Held like the GPU stack, so verify checks it with the rest (tests/verify/test_gpu_stack.py).
    versions = SimpleNamespace(nvidia_driver="515.65.01", cuda="11.7.1", nccl="2.14.3")
    assert pins in all_pins(versions)
    # The lab's stand-in serves this build (a drift here would fail the deploy's check).
    assert CONTAINER_TOOLKIT_VERSION == lab_nvidia.TOOLKIT_DEB_VERSION


def test_cuda_pins_toolkit_only():
    pins = cuda_pins("11.7.1")
    assert pins.install_args() == ["cuda-toolkit-11-7=11.7.1-1"]
    assert not any(p.startswith("cuda-11-7") for p in pins.as_dict())
    assert cuda_home("11.7.1") == "/usr/local/cuda-11.7"
    assert cuda_pins("12.0.0").install_args() == ["cuda-toolkit-12-0=12.0.0-1"]


def test_nccl_pins_carry_the_cuda_release():
    pins = nccl_pins("2.14.3", "11.7.1")
    assert pins.install_args() == [
        "libnccl2=2.14.3-1+cuda11.7",
        "libnccl-dev=2.14.3-1+cuda11.7",
    ]
    assert nccl_version_code("2.14.3") == 21403
    assert nccl_version_code("2.9.10") == 20910
    assert nccl_library("2.14.3") == "/usr/lib/x86_64-linux-gnu/libnccl.so.2.14.3"


def test_ofed_release_name():
    assert ofed_release("5.8-3.0.7.0") == "MLNX_OFED_LINUX-5.8-3.0.7.0"


@pytest.mark.parametrize(
    "call",
    [
        lambda: driver_pins("515"),
        lambda: driver_pins("latest"),
        lambda: cuda_pins("11.7"),
        lambda: nccl_pins("2.14", "11.7.1"),
        lambda: nccl_pins("2.14.3", "eleven"),
        lambda: ofed_release("5.8"),
    ],
)
def test_bad_versions_are_refused_with_the_version_named(call):
    with pytest.raises(PinError, match="version '"):
        call()


# --------------------------------------------------------------------------------------------
# facts parsing and decisions


def test_parse_madison_flat_and_suite_repos():
    lines = [
        "cuda-drivers-515 | 515.65.01-1 | http://10.77.0.1:8077/cuda/repos/debian12/x86_64  Packages",
        "cuda-drivers-515 | 515.48.07-1 | http://10.77.0.1:8077/cuda/repos/debian12/x86_64  Packages",
        (
            "nvidia-driver-515 | 515.65.01-0ubuntu0.20.04.1 | http://archive.ubuntu.com/ubuntu "
            "focal-updates/restricted amd64 Packages"
        ),
        "N: Unable to locate package nothing",
    ]
    found = parse_madison(lines)
    repo = "http://10.77.0.1:8077/cuda/repos/debian12/x86_64"
    assert found["cuda-drivers-515"] == {("515.65.01-1", repo), ("515.48.07-1", repo)}
    assert found["nvidia-driver-515"] == {("515.65.01-0ubuntu0.20.04.1", "http://archive.ubuntu.com/ubuntu")}
    assert apt_pinsets.missing_from_repo(
        {"cuda-drivers-515": "515.65.01-1", "nvidia-driver-515": "515.65.01-0ubuntu1"},
        found,
        repo + "/",
    ) == ["nvidia-driver-515=515.65.01-0ubuntu1"]


def test_not_at_pin():
    pins = {"libnccl2": "2.14.3-1+cuda11.7", "libnccl-dev": "2.14.3-1+cuda11.7"}
    installed = {"libnccl2": {"2.13.4-1+cuda11.7"}, "libnccl-dev": {"2.14.3-1+cuda11.7"}}
    assert apt_pinsets.not_at_pin(pins, installed) == {"libnccl2": "2.14.3-1+cuda11.7"}
    assert apt_pinsets.not_at_pin(pins, {}) == pins


REPO_URL = "http://mirror/cuda/repos/debian12/x86_64/"


def test_available_stops_the_host_naming_what_the_repo_lacks():
    pinset = nccl_pins("2.14.3", "11.7.1")
    offered = {"libnccl2": {("2.14.3-1+cuda11.7", REPO_URL.rstrip("/"))}}
    [command] = commands_of(apt_pins.available, {DebPackages: {}, AptRepoVersions: offered}, pinset, REPO_URL)
    proc = subprocess.run(["sh", "-c", str(command)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"nccl: the apt repository {REPO_URL} does not offer libnccl-dev=2.14.3-1+cuda11.7: "
        "add it to the mirror, or change versions in cluster.yaml"
    )
    installed = {p: {v} for p, v in pinset.packages}
    assert commands_of(apt_pins.available, {DebPackages: installed}, pinset, REPO_URL) == []


def test_update_and_hold_only_when_needed():
    pins = nccl_pins("2.14.3", "11.7.1").as_dict()
    installed = {p: {v} for p, v in pins.items()}
    assert commands_of(apt_pins.update_if_stale, {DebPackages: installed}, pins, REPO_URL) == []
    stale: dict = {DebPackages: {}, AptRepoVersions: {}}
    [update] = commands_of(apt_pins.update_if_stale, stale, pins, REPO_URL)
    assert "apt-update.sh" in str(update) and " 600 3 10 " in str(update)
    assert commands_of(apt_pins.hold, {HeldPackages: set(pins)}, list(pins)) == []
    [hold] = commands_of(apt_pins.hold, {HeldPackages: {"libnccl2"}}, list(pins))
    assert "apt-mark-hold.sh" in str(hold) and str(hold).endswith(" 600 libnccl-dev")


def test_parse_ofed_info():
    assert parse_ofed_info(["MLNX_OFED_LINUX-5.8-3.0.7.0:"]) == "MLNX_OFED_LINUX-5.8-3.0.7.0"
    assert parse_ofed_info([]) is None
    assert parse_ofed_info(["sh: 1: ofed_info: not found"]) is None


IBSTAT = """CA 'mlx5_0'
\tCA type: MT4123
\tNumber of ports: 1
\tFirmware version: 20.28.1002
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 200
\t\tLink layer: InfiniBand
CA 'mlx5_1'
\tCA type: MT4123
\tPort 1:
\t\tState: Initializing
\t\tPhysical state: LinkUp
\t\tRate: 200
\tNode GUID: 0x0
"""


def test_parse_ibstat():
    ports = parse_ibstat(IBSTAT.splitlines())
    assert set(ports) == {("mlx5_0", 1), ("mlx5_1", 1)}
    assert ports[("mlx5_0", 1)]["State"] == "Active"
    assert ports[("mlx5_0", 1)]["Physical state"] == "LinkUp"
    assert ports[("mlx5_0", 1)]["Link layer"] == "InfiniBand"
    assert ports[("mlx5_1", 1)]["State"] == "Initializing"
    assert "Node GUID" not in ports[("mlx5_1", 1)]  # a CA field, not the port's
    assert parse_ibstat([]) == {}


def test_os_release_and_repo_names():
    fact = {
        "name": "Ubuntu",
        "major": 20,
        "minor": 4,
        "release_meta": {"ID": "ubuntu", "VERSION_ID": "20.04"},
    }
    assert apt_pinsets.os_release(fact) == ("ubuntu", "20.04")
    assert apt_pinsets.sources_list_path("ubuntu", "20.04") == (
        "/etc/apt/sources.list.d/cuda-ubuntu2004-x86_64.list"
    )
    assert apt_pinsets.sources_list_path("debian", "12") == (
        "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"
    )
    line = apt_pinsets.sources_list("http://mirror/cuda/repos/ubuntu2004/x86_64/")
    assert (
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "http://mirror/cuda/repos/ubuntu2004/x86_64/ /\n"
    ) in line
    with pytest.raises(ValueError, match="cannot tell the distribution"):
        apt_pinsets.os_release({"name": None, "release_meta": {}})


def test_reboot_pending_only_for_driver_packages():
    driver = [p for p, _ in driver_pins("515.65.01").packages]
    assert nvidia_driver.reboot_pending({"linux-image-5.4.0-100-generic", "nvidia-dkms-515"}, driver)
    assert not nvidia_driver.reboot_pending({"linux-image-5.4.0-100-generic"}, driver)
    assert not nvidia_driver.reboot_pending(set(), driver)


def test_cuda_alternative_priority():
    assert cuda.alternative_priority("11.7.1") == 117
    assert cuda.alternative_priority("12.0.0") == 120


# --------------------------------------------------------------------------------------------
# apt preferences, checked by apt itself


def test_preferences_text_one_pin_line_per_stanza():
    text = apt_pinsets.render_preferences(nccl_pins("2.14.3", "11.7.1"))
    stanzas = [s for s in text.split("\n\n") if "Package:" in s]
    assert len(stanzas) == 6
    for stanza in stanzas:
        # apt keeps only the last Pin line of a stanza: two would silently drop one.
        assert sum(line.startswith("Pin:") for line in stanza.splitlines()) == 1
    assert stanzas[0].splitlines()[-3:] == [
        "Package: libnccl2",
        "Pin: version 2.14.3-1+cuda11.7",
        "Pin-Priority: 1001",
    ]
    assert "Pin: release o=NVIDIA" in stanzas[1]
    assert stanzas[2].splitlines()[-2:] == ["Pin: version *", "Pin-Priority: -1"]
    assert apt_pinsets.preferences_path(nccl_pins("2.14.3", "11.7.1")) == ("/etc/apt/preferences.d/nccl.pref")


def _deb(out: Path, package: str, version: str) -> None:
    src = out.parent / "src" / f"{package}_{version}"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: test <test@example.invalid>\nDescription: test package\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["dpkg-deb", "--build", "-Zgzip", str(src), str(out / f"{package}_{version}_all.deb")],
        check=True,
        capture_output=True,
    )


def _flat_repo(path: Path, origin: str, debs: list[tuple[str, str]]) -> None:
    for package, version in debs:
        _deb(path, package, version)
    index = subprocess.run(
        ["dpkg-scanpackages", "-m", "."], cwd=path, check=True, capture_output=True, text=True
    ).stdout
    (path / "Packages").write_text(index)
    (path / "Release").write_text(f"Origin: {origin}\nLabel: {origin}\nArchitectures: all\n")


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("apt-get", "dpkg-deb", "dpkg-scanpackages")),
    reason="needs apt and dpkg-dev",
)
def test_preferences_make_apt_choose_nvidias_pinned_build(tmp_path):
    nvidia = tmp_path / "nvidia"
    ubuntu = tmp_path / "ubuntu"
    _flat_repo(
        nvidia,
        "NVIDIA",
        [
            ("nvidia-utils-515", "515.48.07-0ubuntu1"),
            ("nvidia-utils-515", "515.65.01-0ubuntu1"),
            ("nvidia-utils-515", "515.86.01-0ubuntu1"),
        ],
    )
    # Ubuntu's archive: the same driver under other version strings, one of them "newer".
    _flat_repo(
        ubuntu,
        "Ubuntu",
        [
            ("nvidia-utils-515", "515.65.01-0ubuntu0.20.04.1"),
            ("nvidia-utils-515", "515.76+really.515.65.01-0ubuntu0.20.04.1"),
        ],
    )
    root = tmp_path / "root"
    for d in (
        "etc/apt/preferences.d",
        "etc/apt/sources.list.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg",
    ):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    (root / "etc/apt/sources.list").write_text(
        f"deb [trusted=yes] file:{ubuntu}/ /\ndeb [trusted=yes] file:{nvidia}/ /\n"
    )
    pinset = PinSet(name="nvidia-driver", packages=(("nvidia-utils-515", "515.65.01-0ubuntu1"),))
    (root / "etc/apt/preferences.d/nvidia-driver.pref").write_text(apt_pinsets.render_preferences(pinset))
    opts = [
        f"-o=Dir={root}",
        f"-o=Dir::State::status={root}/var/lib/dpkg/status",
        "-o=Debug::NoLocking=1",
        "-o=APT::Sandbox::User=" + os.environ.get("USER", "root"),
    ]
    env = {**os.environ, "LC_ALL": "C"}
    subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True, env=env)
    policy = subprocess.run(
        ["apt-cache", *opts, "policy", "nvidia-utils-515"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    priorities = {}
    for line in policy.splitlines():
        fields = line.replace("***", "").split()
        if len(fields) == 2 and fields[1].lstrip("-").isdigit() and "." in fields[0]:
            priorities[fields[0]] = int(fields[1])
    assert "Candidate: 515.65.01-0ubuntu1" in policy, policy
    assert priorities == {
        "515.65.01-0ubuntu1": 1001,
        "515.48.07-0ubuntu1": 100,
        "515.86.01-0ubuntu1": 100,
        "515.65.01-0ubuntu0.20.04.1": -1,
        "515.76+really.515.65.01-0ubuntu0.20.04.1": -1,
    }, policy


# --------------------------------------------------------------------------------------------
# MLNX_OFED: exit statuses, verified download, install shell


TARBALL = "MLNX_OFED_LINUX-5.8-3.0.7.0-debian12-x86_64.tgz"


def _sh(command) -> subprocess.CompletedProcess:
    """Run a command as pyinfra would hand it to the node's shell."""
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=False)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the test downloads with curl file://")
def test_download_keeps_only_a_verified_file(tmp_path):
    source = tmp_path / "mirror" / TARBALL
    source.parent.mkdir()
    source.write_bytes(b"not really a tarball")
    good = hashlib.sha256(source.read_bytes()).hexdigest()
    dest = tmp_path / "cache" / TARBALL

    def download(url, sha256):
        return _sh(fetch_verified(url, str(dest), artifact=mofed.tarball_name(url), sha256=sha256))

    proc = download(f"file://{source}", "0" * 64)
    assert proc.returncode == 1
    assert f"{TARBALL}: sha256 mismatch for file://{source}: expected {'0' * 64}, got {good}" in proc.stderr
    assert list(dest.parent.iterdir()) == []  # neither the file nor its partial download

    proc = download(f"file://{tmp_path}/nothing.tgz", good)
    assert proc.returncode == 1
    assert f"nothing.tgz: download failed from file://{tmp_path}/nothing.tgz" in proc.stderr
    assert list(dest.parent.iterdir()) == []

    proc = download(f"file://{source}", good.upper())
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in dest.parent.iterdir()] == [TARBALL]
    assert dest.read_bytes() == source.read_bytes()


def test_verified_tarball_skips_an_installed_release_or_a_present_tarball():
    release, dest = "MLNX_OFED_LINUX-5.8-3.0.7.0", f"/var/cache/mlnx-ofed/{TARBALL}"
    args = (f"http://mirror/{TARBALL}", "AB" * 32, dest, release)
    assert commands_of(mofed.verified_tarball, {OfedRelease: release}, *args) == []
    assert commands_of(mofed.verified_tarball, {OfedRelease: None, Sha256File: "ab" * 32}, *args) == []
    [command] = commands_of(mofed.verified_tarball, {OfedRelease: None, Sha256File: None}, *args)
    assert "fetch-verified.sh" in str(command) and dest in str(command)
    assert commands_of(mofed.install, {OfedRelease: release}, dest, release) == []


def _fake_ofed(tmp_path: Path, installer_status: int, reports: str) -> tuple[Path, Path, Path]:
    """A tarball whose mlnxofedinstall exits installer_status and makes ofed_info print reports."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "ofed_info.out"
    installer = (
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path}/installer.args\n'
        f"echo '{reports}' > {state}\n"
        f"exit {installer_status}\n"
    ).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"{TARBALL[:-4]}/mlnxofedinstall")
        info.size, info.mode = len(installer), 0o755
        tar.addfile(info, io.BytesIO(installer))
    tarball = tmp_path / TARBALL
    tarball.write_bytes(buf.getvalue())
    (bin_dir / "ofed_info").write_text(f"#!/bin/sh\ncat {state} 2>/dev/null\n")
    (bin_dir / "ofed_info").chmod(0o755)
    openibd = tmp_path / "openibd"
    openibd.write_text(f'#!/bin/sh\necho "$1" > {tmp_path}/openibd.called\n')
    openibd.chmod(0o755)
    return tarball, bin_dir, openibd


def _run_install(tmp_path, status, reports):
    tarball, bin_dir, openibd = _fake_ofed(tmp_path, status, reports)
    work = tmp_path / "work"
    [command] = commands_of(
        mofed.install,
        {OfedRelease: None},
        str(tarball),
        "MLNX_OFED_LINUX-5.8-3.0.7.0",
        work_dir=str(work),
        openibd=str(openibd),
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, env=env, check=False
    )
    return proc, tarball, work


def test_install_shell_success_cleans_up(tmp_path):
    proc, tarball, work = _run_install(tmp_path, 0, "MLNX_OFED_LINUX-5.8-3.0.7.0:")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "installer.args").read_text().split() == [
        "--without-fw-update",
        "--add-kernel-support",
        "--force",
    ]
    assert (tmp_path / "openibd.called").read_text().strip() == "restart"
    assert not tarball.exists()
    assert list(work.iterdir()) == []


def test_install_shell_stops_after_a_failed_installer(tmp_path):
    proc, tarball, _ = _run_install(tmp_path, 172, "")
    assert proc.returncode == 1
    assert "mlnxofedinstall exited 172: prerequisites are not met" in proc.stderr
    assert not (tmp_path / "openibd.called").exists()
    assert tarball.exists()  # verified, kept for the next attempt


@pytest.mark.parametrize(
    "status,ok,text",
    [
        (2, True, "exited 2: no firmware"),
        (1, False, "exited 1: the installation failed"),
        (22, False, "exited 22: invalid parameter"),
        (28, False, "exited 28: not enough free disk space"),
        (171, False, "exited 171: not applicable to this system"),
        (172, False, "exited 172: prerequisites are not met"),
        (173, False, "exited 173: the mst driver failed to start"),
        (99, False, "exited 99: unexpected exit status"),
    ],
)
def test_install_shell_explains_every_exit_status(tmp_path, status, ok, text):
    proc, _, _ = _run_install(tmp_path, status, "MLNX_OFED_LINUX-5.8-3.0.7.0:")
    assert (proc.returncode == 0) is ok, proc.stderr
    assert proc.stderr.startswith(f"MLNX_OFED_LINUX-5.8-3.0.7.0: mlnxofedinstall {text}")
    assert (tmp_path / "openibd.called").exists() is ok


def test_install_shell_checks_the_installed_release(tmp_path):
    proc, _, _ = _run_install(tmp_path, 0, "MLNX_OFED_LINUX-5.4-1.0.3.0:")
    assert proc.returncode == 1
    assert "ofed_info -s says 'MLNX_OFED_LINUX-5.4-1.0.3.0:'" in proc.stderr


def test_unpacked_dir_name():
    assert mofed.unpacked_dir(TARBALL) == "MLNX_OFED_LINUX-5.8-3.0.7.0-debian12-x86_64"
    with pytest.raises(ValueError, match="ends with .tgz"):
        mofed.unpacked_dir("MLNX_OFED_LINUX-5.8-3.0.7.0-debian12-x86_64.iso")


def test_driver_loaded_check_accepts_only_the_pin(tmp_path):
    import os
    import subprocess

    from roles.nvidia.driver import driver_loaded_check

    fake = tmp_path / "nvidia-smi"
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    fake.write_text("#!/bin/sh\nprintf '515.65.01\\n515.65.01\\n'\n")
    fake.chmod(0o755)
    assert (
        subprocess.run(
            ["sh", "-c", str(driver_loaded_check("515.65.01", 2))], env=env, check=False
        ).returncode
        == 0
    )
    fake.write_text('#!/bin/sh\necho "NVIDIA-SMI has failed"; exit 9\n')
    run = subprocess.run(
        ["sh", "-c", str(driver_loaded_check("515.65.01", 2))],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert (
        "driver 515.65.01 is not loaded after the reboot; nvidia-smi says: NVIDIA-SMI has failed"
        in run.stderr
    )


def test_cuda_profile_and_link_script(tmp_path):
    import os
    import subprocess

    profile = cuda.profile("11.7.1")
    assert "export CUDA_HOME=/usr/local/cuda-11.7" in profile and "{{" not in profile
    # The link script, with update-alternatives replaced by a stand-in that makes the link.
    home, link = tmp_path / "cuda-11.7", tmp_path / "cuda"
    fake = tmp_path / "bin" / "update-alternatives"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = --install ] && ln -sfn "$4" "$2"; exit 0\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")

    def run():
        command = str(cuda.script("nvidia/cuda-link.sh", home, 117, link))
        return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, check=False)

    missing = run()
    assert missing.returncode == 1 and "the toolkit is not installed" in missing.stderr
    home.mkdir()
    assert run().returncode == 0 and os.readlink(link) == str(home)
