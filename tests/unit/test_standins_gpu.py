"""GPU/fabric stand-ins as built into the lab mirror: nvidia-smi, NVML/libcuda, nvcc, NCCL,
nvidia-ctk, cuda-keyring, and the MLNX_OFED tarball (mlnxofedinstall, ibstat, ofed_info).

Each test takes the artifact out of the built mirror (dpkg-deb -x / tar), so what is tested
is what a node installs. Stand-ins read test-only environment overrides for /etc/dtlab, /run
and /sys paths; nothing here writes outside tmp_path.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from deploy.facts.fabric import parse_sminfo
from roles.fabric import mofed
from tests.lab import mirror

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("gpg", "dpkg-deb", "gcc")) or not Path("/usr/bin/python3").exists(),
    reason="needs gpg, dpkg-deb, gcc and /usr/bin/python3",
)

OFED = "MLNX_OFED_LINUX-5.8-3.0.7.0"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-mirror")
    mirror.build_mirror(root / "mirror", "http://10.77.0.1:8077", root / "gpg", out=io.StringIO())
    return root / "mirror"


@pytest.fixture(scope="module")
def cuda(repo) -> Path:
    return repo / "cuda/repos/debian12/x86_64"


def extract(deb: Path, tmp_root: Path) -> Path:
    dest = tmp_root / deb.stem
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


@pytest.fixture(scope="module")
def unpack(cuda, tmp_path_factory):
    where = tmp_path_factory.mktemp("debs")

    def get(package: str, version: str, arch: str = "amd64") -> Path:
        return extract(cuda / f"{package}_{version}_{arch}.deb", where)

    return get


# ---------------------------------------------------------------- nvidia-smi


@pytest.fixture
def smi(unpack, tmp_path):
    """Run the packaged nvidia-smi of a driver version with tmp /run and /etc/dtlab."""
    run_dir, etc_dir = tmp_path / "run", tmp_path / "etc"
    run_dir.mkdir()
    etc_dir.mkdir()

    def run(*args: str, version: str = "515.65.01", loaded: str | None = "515.65.01"):
        if loaded is None:
            (run_dir / "loaded-version").unlink(missing_ok=True)
        else:
            (run_dir / "loaded-version").write_text(loaded + "\n")
        exe = unpack("nvidia-utils-515", f"{version}-0ubuntu1") / "usr/bin/nvidia-smi"
        env = {
            **os.environ,
            "DTLAB_STANDIN_RUN_DIR": str(run_dir),
            "DTLAB_STANDIN_ETC_DIR": str(etc_dir),
            "DTLAB_STANDIN_HOSTNAME": "lab-gpu1",
        }
        return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, check=False)

    run.etc = etc_dir
    run.run_dir = run_dir
    return run


def test_smi_first_two_lines_say_what_it_stands_in_for(unpack):
    exe = unpack("nvidia-utils-515", "515.65.01-0ubuntu1") / "usr/bin/nvidia-smi"
    first, second = exe.read_text().splitlines()[:2]
    assert first == "#!/usr/bin/python3"
    assert second.startswith("# Stands in for NVIDIA's nvidia-smi") and "515.65.01" in second
    assert os.access(exe, os.X_OK)


def test_smi_without_loaded_module_fails_like_the_real_one(smi):
    proc = smi(loaded=None)
    assert (proc.returncode, proc.stdout) == (9, NO_DRIVER)
    proc = smi("--query-gpu=driver_version", "--format=csv,noheader,nounits", loaded=None)
    assert (proc.returncode, proc.stdout) == (9, NO_DRIVER)


def test_smi_after_driver_change_without_reboot_reports_mismatch(smi):
    # 515.48.07 loaded at boot, 515.65.01 userspace installed since: mismatch until reboot.
    proc = smi("-L", loaded="515.48.07")
    assert (proc.returncode, proc.stdout) == (18, MISMATCH)
    # The old userspace against the new module mismatches too.
    proc = smi(version="515.48.07", loaded="515.65.01")
    assert (proc.returncode, proc.stdout) == (18, MISMATCH)
    assert smi(version="515.48.07", loaded="515.48.07").returncode == 0


def test_smi_table(smi):
    proc = smi()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[2] == "| NVIDIA-SMI 515.65.01    Driver Version: 515.65.01    CUDA Version: 11.7     |"
    assert all(len(line) == 79 for line in lines[1:] if line.startswith(("|", "+")))
    gpu_rows = [line for line in lines if line.startswith("|   ") and "NVIDIA A100-SXM..." in line]
    assert len(gpu_rows) == 8
    assert gpu_rows[0] == "|   0  NVIDIA A100-SXM...  Off  | 00000000:07:00.0 Off |                    0 |"
    assert any("0MiB / 81920MiB" in line for line in lines)
    assert "|  No running processes found" in proc.stdout
    one = smi("-i", "5").stdout
    assert "|   5  NVIDIA A100-SXM..." in one and "|   0  NVIDIA" not in one


def test_smi_list_gpus(smi):
    proc = smi("-L")
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 8
    for i, line in enumerate(lines):
        assert line.startswith(f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: GPU-") and line.endswith(")")
    assert len({line.split("UUID: ")[1] for line in lines}) == 8
    assert smi("-L").stdout == proc.stdout  # stable per node


def test_smi_query_gpu_forms(smi):
    fields = "index,name,uuid,driver_version,pci.bus_id,memory.total,count"
    proc = smi(f"--query-gpu={fields}", "--format=csv")
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0
    assert lines[0] == "index, name, uuid, driver_version, pci.bus_id, memory.total [MiB], count"
    assert len(lines) == 9
    idx, name, uuid, drv, bus, mem, count = lines[1].split(", ")
    assert (idx, name, drv, bus, mem, count) == (
        "0",
        "NVIDIA A100-SXM4-80GB",
        "515.65.01",
        "00000000:07:00.0",
        "81920 MiB",
        "8",
    )
    assert uuid.startswith("GPU-")

    proc = smi("--query-gpu=driver_version", "--format=csv,noheader,nounits")
    assert proc.stdout == "515.65.01\n" * 8
    proc = smi("--query-gpu=memory.total", "--format=csv,nounits", "-i", "3")
    assert proc.stdout == "memory.total [MiB]\n81920\n"
    proc = smi("--query-gpu", "count", "--format", "csv,noheader", "--id=0,7")
    assert proc.stdout == "8\n8\n"


def test_smi_rejects_bad_queries(smi):
    proc = smi("--query-gpu=bogus", "--format=csv")
    assert proc.returncode == 2 and proc.stdout.startswith('Field "bogus" is not a valid field to query.')
    assert smi("--query-gpu=name", "--format=xml").returncode == 2
    assert smi("--query-gpu=name").returncode == 2
    assert smi("--bogus").returncode == 2
    assert smi("--query-gpu=name", "--format=csv", "-i", "9").returncode == 2


def test_smi_topo_matrix_default(smi):
    proc = smi("topo", "-m")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    header = [f"GPU{i}" for i in range(8)] + ["mlx5_0", "CPU Affinity", "NUMA Affinity"]
    assert lines[0] == "\t" + "\t".join(header)
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in lines[1:10]}
    assert rows["GPU0"] == [" X ", "NV12", "NV12", "NV12", "SYS", "SYS", "SYS", "SYS", "PXB", "0-31", "0"]
    assert rows["GPU5"][4:] == ["NV12", " X ", "NV12", "NV12", "SYS", "32-63", "1"]
    assert rows["mlx5_0"][8] == " X "
    assert lines[10:13] == ["", "Legend:", ""]
    assert "  X    = Self" in lines
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in lines
    assert any(line.startswith("  SYS  = Connection traversing PCIe as well as the SMP") for line in lines)


def test_smi_follows_the_lab_topology_file(smi):
    (smi.etc / "gpu-topology.json").write_text(
        json.dumps(
            {
                "gpus": [
                    "NVIDIA A100-SXM4-40GB",
                    {
                        "name": "NVIDIA A100-SXM4-40GB",
                        "cpu_affinity": "0-15",
                        "numa_affinity": "0",
                        "bus_id": "00000000:81:00.0",
                        "uuid": "GPU-11111111-2222-3333-4444-555555555555",
                    },
                ],
                "matrix": [["X", "NV4"], ["NV4", "X"]],
            }
        )
    )
    topo = smi("topo", "-m").stdout.splitlines()
    assert topo[0] == "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity"
    assert topo[1] == "GPU0\t X \tNV4\tN/A\tN/A"
    assert topo[2] == "GPU1\tNV4\t X \t0-15\t0"
    q = smi("--query-gpu=index,uuid,pci.bus_id,memory.total", "--format=csv,noheader,nounits")
    assert q.stdout.splitlines()[1] == "1, GPU-11111111-2222-3333-4444-555555555555, 00000000:81:00.0, 40960"


@pytest.mark.parametrize(
    "topology, message",
    [
        ({"gpus": ["A", "B"], "matrix": [["X", "NV4"], ["SYS", "X"]]}, "not symmetric"),
        ({"gpus": ["A"], "matrix": [["NV4"]]}, "diagonal"),
        ({"gpus": ["A", "B"], "matrix": [["X", "FAST"], ["FAST", "X"]]}, "bad link label"),
        ({"gpus": ["A", "B"], "matrix": [["X", "SYS"]]}, "must have 2 rows"),
        ({"matrix": []}, "'gpus' list"),
    ],
)
def test_smi_rejects_a_bad_topology_file(smi, topology, message):
    (smi.etc / "gpu-topology.json").write_text(json.dumps(topology))
    proc = smi("-L")
    assert proc.returncode == 255 and message in proc.stderr


def test_smi_no_gpus(smi):
    (smi.etc / "gpu-topology.json").write_text('{"gpus": []}')
    proc = smi()
    assert (proc.returncode, proc.stdout) == (6, "No devices were found\n")


def test_smi_persistence_mode(smi):
    proc = smi("-pm", "1")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == "Enabled persistence mode for GPU 00000000:07:00.0."
    q = smi("--query-gpu=persistence_mode", "--format=csv,noheader", "-i", "0")
    assert q.stdout == "Enabled\n"
    assert "  On   |" in smi().stdout


# ---------------------------------------------------------------- driver packages


def test_driver_module_unit_and_version_file(unpack):
    dkms = unpack("nvidia-dkms-515", "515.65.01-0ubuntu1")
    assert (dkms / "usr/lib/nvidia-standin/module-version").read_text() == "515.65.01\n"
    unit = (dkms / "lib/systemd/system/nvidia-module-load.service").read_text()
    assert unit.splitlines()[0].startswith("# Stands in for")
    assert "Type=oneshot" in unit and "WantedBy=multi-user.target" in unit
    # The lab's modprobe (tests/lab/standins/kernel/kmod.py) runs load-module for nvidia.
    assert "ExecStart=/usr/local/sbin/modprobe nvidia" in unit
    loader = (dkms / "usr/lib/nvidia-standin/load-module").read_text()
    assert "/run/nvidia-standin/loaded-version" in loader
    loader_path = dkms / "usr/lib/nvidia-standin/load-module"
    assert subprocess.run(["sh", "-n", str(loader_path)], check=False).returncode == 0


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("systemctl") is None,
    reason="dpkg --root installs need root and systemctl",
)
def test_driver_postinst_enables_the_module_unit(cuda, tmp_path):
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    debs = [
        cuda / "nvidia-kernel-source-515_515.65.01-0ubuntu1_amd64.deb",
        # nvidia-dkms-515 Depends on it (NVIDIA's control.in), as on nvidia-kernel-source-515.
        cuda / "nvidia-kernel-common-515_515.65.01-0ubuntu1_amd64.deb",
        cuda / "nvidia-dkms-515_515.65.01-0ubuntu1_amd64.deb",
    ]
    env = {**os.environ, "SYSTEMCTL_SKIP_SYSV": "1"}
    proc = subprocess.run(
        ["dpkg", f"--root={root}", "--force-script-chrootless", "-i", *map(str, debs)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    link = root / "etc/systemd/system/multi-user.target.wants/nvidia-module-load.service"
    assert link.is_symlink()


def test_nvml_and_libcuda_are_real_libraries(unpack):
    lib = unpack("libnvidia-compute-515", "515.65.01-0ubuntu1") / "usr/lib/x86_64-linux-gnu"
    assert os.readlink(lib / "libnvidia-ml.so.1") == "libnvidia-ml.so.515.65.01"
    nvml = ctypes.CDLL(str(lib / "libnvidia-ml.so.1"))
    buf = ctypes.create_string_buffer(80)
    assert nvml.nvmlSystemGetDriverVersion(buf, 80) == 0 and buf.value == b"515.65.01"
    expected = 0 if Path("/run/nvidia-standin/loaded-version").exists() else 9
    if expected == 0:
        pytest.skip("this machine has a stand-in driver loaded")
    assert nvml.nvmlInit_v2() == 9  # NVML_ERROR_DRIVER_NOT_LOADED
    cuda = ctypes.CDLL(str(lib / "libcuda.so.1"))
    version = ctypes.c_int(0)
    assert cuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value == 11070


def test_cuda_keyring_contents(cuda, tmp_path):
    files = extract(cuda / "cuda-keyring_1.1-1_all.deb", tmp_path)
    assert (files / "usr/share/keyrings/cuda-archive-keyring.gpg").stat().st_size > 100
    conffiles = subprocess.run(
        ["dpkg-deb", "--info", str(cuda / "cuda-keyring_1.1-1_all.deb"), "conffiles"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "/etc/apt/sources.list.d/cuda-debian12-x86_64.list" in conffiles


# ---------------------------------------------------------------- CUDA toolkit


def test_nvcc_version_text(unpack):
    nvcc = unpack("cuda-nvcc-11-7", "11.7.99-1") / "usr/local/cuda-11.7/bin/nvcc"
    proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0
    assert proc.stdout == (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2022 NVIDIA Corporation\n"
        "Built on Wed_Jun__8_16:49:14_PDT_2022\n"
        "Cuda compilation tools, release 11.7, V11.7.99\n"
        "Build cuda_11.7.r11.7/compiler.31442593_0\n"
    )
    assert subprocess.run([str(nvcc)], capture_output=True, check=False).returncode == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="dpkg --root installs need root")
def test_toolkit_postinst_sets_cuda_alternatives(cuda, tmp_path):
    root = tmp_path / "root"
    for d in (
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
        "var/lib/dpkg/alternatives",
        "etc/alternatives",
        "usr/local",
    ):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    debs = [
        cuda / "cuda-nvcc-11-7_11.7.99-1_amd64.deb",
        cuda / "cuda-toolkit-11-7-config-common_11.7.99-1_all.deb",
        cuda / "cuda-toolkit-11-7_11.7.1-1_amd64.deb",
    ]
    proc = subprocess.run(
        ["dpkg", f"--root={root}", "--force-script-chrootless", "-i", *map(str, debs)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.readlink(root / "usr/local/cuda") == "/etc/alternatives/cuda"
    assert os.readlink(root / "etc/alternatives/cuda") == "/usr/local/cuda-11.7"
    version = json.loads((root / "usr/local/cuda-11.7/version.json").read_text())
    assert version["cuda"]["version"] == "11.7.1"


# ---------------------------------------------------------------- NCCL


@pytest.mark.parametrize("version, code", [("2.14.3", 21403), ("2.13.4", 21304)])
def test_nccl_library_reports_its_version(unpack, version, code):
    lib = unpack("libnccl2", f"{version}-1+cuda11.7") / "usr/lib/x86_64-linux-gnu"
    assert (lib / f"libnccl.so.{version}").is_file()
    assert os.readlink(lib / "libnccl.so.2") == f"libnccl.so.{version}"
    nccl = ctypes.CDLL(str(lib / "libnccl.so.2"))
    out = ctypes.c_int(0)
    assert nccl.ncclGetVersion(ctypes.byref(out)) == 0
    assert out.value == code
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    assert nccl.ncclGetErrorString(0) == b"no error"


@pytest.mark.parametrize(
    "ifname, result",
    [
        ("nosuch0", 3),  # a named interface that is not there: find or fail
        ("=lo", 0),  # '=': the exact name; lo has 127.0.0.1 on every machine
        ("lo", 0),  # a prefix
    ],
)
def test_nccl_bootstrap_finds_the_named_interface_or_fails(unpack, monkeypatch, ifname, result):
    lib = unpack("libnccl2", "2.14.3-1+cuda11.7") / "usr/lib/x86_64-linux-gnu"
    nccl = ctypes.CDLL(str(lib / "libnccl.so.2"))
    nccl.ncclGetLastError.restype = ctypes.c_char_p
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", ifname)
    got = nccl.ncclGetUniqueId(ctypes.create_string_buffer(128))
    assert got == result
    if got == 3:  # ncclInternalError, with NCCL's own text (src/bootstrap.cc)
        assert nccl.ncclGetLastError(None) == b"Bootstrap : no socket interface found"


def test_nccl_dev_header_links_against_the_library(unpack, tmp_path):
    dev = unpack("libnccl-dev", "2.14.3-1+cuda11.7")
    rt = unpack("libnccl2", "2.14.3-1+cuda11.7")
    libdir = tmp_path / "lib"
    shutil.copytree(rt / "usr/lib/x86_64-linux-gnu", libdir, symlinks=True)
    os.symlink("libnccl.so.2", libdir / "libnccl.so")
    assert os.readlink(dev / "usr/lib/x86_64-linux-gnu/libnccl.so") == "libnccl.so.2"
    (tmp_path / "v.c").write_text(
        "#include <stdio.h>\n#include <nccl.h>\n"
        "int main(void) { int v = 0; ncclGetVersion(&v);\n"
        '  printf("%d %d %d\\n", v, NCCL_VERSION_CODE, NCCL_VERSION(2, 14, 3)); return 0; }\n'
    )
    subprocess.run(
        [
            "gcc",
            "-o",
            str(tmp_path / "v"),
            str(tmp_path / "v.c"),
            f"-I{dev / 'usr/include'}",
            f"-L{libdir}",
            "-lnccl",
        ],
        check=True,
    )
    out = subprocess.run(
        [str(tmp_path / "v")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LD_LIBRARY_PATH": str(libdir)},
    ).stdout
    assert out == "21403 21403 21403\n"


# ---------------------------------------------------------------- Container Toolkit


@pytest.fixture
def ctk(unpack):
    exe = unpack("nvidia-container-toolkit-base", "1.13.5-1") / "usr/bin/nvidia-ctk"

    def run(*args: str):
        return subprocess.run([str(exe), *args], capture_output=True, text=True, check=False)

    return run


def test_ctk_version(ctk):
    proc = ctk("--version")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == "NVIDIA Container Toolkit CLI version 1.13.5"
    assert proc.stdout.splitlines()[1].startswith("commit: ")


def test_ctk_runtime_configure_docker_keeps_other_keys(ctk, tmp_path):
    cfg = tmp_path / "daemon.json"
    cfg.write_text('{"log-driver": "json-file", "runtimes": {"other": {"path": "/bin/other"}}}')
    proc = ctk("runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert proc.returncode == 0, proc.stderr
    assert f"Wrote updated config to {cfg}" in proc.stderr
    data = json.loads(cfg.read_text())
    assert data["log-driver"] == "json-file"
    assert data["runtimes"]["other"] == {"path": "/bin/other"}
    assert data["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    assert "default-runtime" not in data
    first = cfg.read_text()
    assert first.startswith('{\n    "log-driver"')  # Go's MarshalIndent layout
    assert ctk("runtime", "configure", "--runtime", "docker", "--config", str(cfg)).returncode == 0
    assert cfg.read_text() == first  # same content on a second run
    assert ctk("runtime", "configure", f"--config={cfg}", "--set-as-default").returncode == 0
    assert json.loads(cfg.read_text())["default-runtime"] == "nvidia"


def test_ctk_runtime_configure_creates_the_file_and_rejects_bad_input(ctk, tmp_path):
    cfg = tmp_path / "daemon.json"
    assert ctk("runtime", "configure", "--runtime=docker", f"--config={cfg}").returncode == 0
    assert json.loads(cfg.read_text()) == {
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}
    }
    cfg.write_text("{not json")
    proc = ctk("runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert proc.returncode == 1 and "unable to load config" in proc.stderr
    proc = ctk("runtime", "configure", "--runtime=docker", "--no-such-flag")
    assert proc.returncode == 1 and "flag provided but not defined: -no-such-flag" in proc.stderr
    missing_dir = tmp_path / "nodir" / "daemon.json"
    proc = ctk("runtime", "configure", f"--config={missing_dir}")
    assert proc.returncode == 1 and "unable to flush config" in proc.stderr


def test_container_toolkit_scripts_parse(unpack):
    for package, path in (
        ("nvidia-container-toolkit-base", "usr/bin/nvidia-container-runtime"),
        ("nvidia-container-toolkit", "usr/bin/nvidia-container-runtime-hook"),
        ("libnvidia-container-tools", "usr/bin/nvidia-container-cli"),
    ):
        script = unpack(package, "1.13.5-1") / path
        assert script.read_text().splitlines()[1].startswith("# Stands in for NVIDIA's")
        # The hook and the cli are Python (tests/unit/test_standins_container.py), the runtime sh.
        python = script.read_text().startswith("#!/usr/bin/python3")
        check = ["python3", "-m", "py_compile", str(script)] if python else ["sh", "-n", str(script)]
        assert subprocess.run(check, check=False, capture_output=True).returncode == 0, path
    cli = unpack("libnvidia-container-tools", "1.13.5-1") / "usr/bin/nvidia-container-cli"
    out = subprocess.run([str(cli), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("cli-version: 1.13.5\nlib-version: 1.13.5\n")


# ---------------------------------------------------------------- MLNX_OFED


@pytest.fixture(scope="module")
def ofed(repo, tmp_path_factory):
    """The debian12 tarball, unpacked."""
    dest = tmp_path_factory.mktemp("ofed")
    with tarfile.open(repo / "mofed" / f"{OFED}-debian12-x86_64.tgz") as tar:
        tar.extractall(dest, filter="tar")
    return dest / f"{OFED}-debian12-x86_64"


def test_ofed_tarball_layout(ofed, repo):
    for d in ("ubuntu20.04", "ubuntu22.04", "debian12"):
        with tarfile.open(repo / "mofed" / f"{OFED}-{d}-x86_64.tgz") as tar:
            names = tar.getnames()
        top = f"{OFED}-{d}-x86_64"
        assert all(n == top or n.startswith(top + "/") for n in names)
        for member in ("mlnxofedinstall", "uninstall.sh", "distro", "DEBS"):
            assert f"{top}/{member}" in names
    assert (ofed / "distro").read_text() == "debian12\n"
    assert os.access(ofed / "mlnxofedinstall", os.X_OK)
    debs = sorted(p.name.split("_")[0] for p in (ofed / "DEBS").glob("*.deb"))
    assert debs == [
        "infiniband-diags",
        "mlnx-ofed-kernel-dkms",
        "mlnx-ofed-kernel-utils",
        "ofed-scripts",
        "opensm",
    ]


# What a node has after roles/fabric/mofed.py installed the prerequisites: the packages, the tools
# mlnx_add_kernel_support.sh looks for on PATH, and the running kernel's build tree.
NODE_PACKAGES = tuple(mofed.PREREQUISITES) + (f"linux-headers-{os.uname().release}",)
NODE_TOOLS = ("lsb_release", "apt-ftparchive", "bzip2")


def scratch_root(
    tmp_path: Path,
    os_release: str,
    installed=NODE_PACKAGES,
    tools=NODE_TOOLS,
    headers: bool = True,
) -> Path:
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "etc", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for tool in tools:
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        (root / "usr/bin" / tool).write_text("#!/bin/sh\n")
        (root / "usr/bin" / tool).chmod(0o755)
    if headers:
        (root / f"lib/modules/{os.uname().release}/build/scripts").mkdir(parents=True, exist_ok=True)
    (root / "etc/os-release").write_text(os_release)
    (root / "var/lib/dpkg/status").write_text(
        "".join(
            f"Package: {p}\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1\n"
            "Maintainer: t <t@t>\nDescription: t\n\n"
            for p in installed
        )
    )
    return root


DEBIAN12 = 'ID=debian\nVERSION_ID="12"\n'


def install(ofed: Path, root: Path, *args: str, **env: str):
    return subprocess.run(
        [str(ofed / "mlnxofedinstall"), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
        env={**os.environ, "DTLAB_STANDIN_ROOT": str(root), **env},
    )


def test_mlnxofedinstall_bad_option_is_22(ofed, tmp_path):
    root = scratch_root(tmp_path, DEBIAN12)
    proc = install(ofed, root, "--without-fw-update", "--frobnicate")
    assert proc.returncode == 22 and "Unsupported option: --frobnicate" in proc.stderr
    assert install(ofed, root, "--kernel").returncode == 22


def test_mlnxofedinstall_wrong_distro_and_kernel_fail(ofed, tmp_path):
    ubuntu = scratch_root(tmp_path, 'ID=ubuntu\nVERSION_ID="20.04"\n')
    proc = install(ofed, ubuntu, "--force", "--add-kernel-support", "--without-fw-update")
    assert proc.returncode == 1 and "intended for debian12" in proc.stderr
    root = scratch_root(tmp_path, DEBIAN12)
    proc = install(ofed, root, "--force", "--without-fw-update", "--kernel", "5.10.0-1-amd64")
    assert proc.returncode == 1 and "--add-kernel-support" in proc.stderr


def test_mlnxofedinstall_no_space_is_28(ofed, tmp_path):
    root = scratch_root(tmp_path, DEBIAN12)
    proc = install(
        ofed,
        root,
        "--force",
        "--add-kernel-support",
        "--without-fw-update",
        DTLAB_STANDIN_MIN_FREE_BYTES=str(1 << 62),
    )
    assert proc.returncode == 28 and "Not enough free space" in proc.stderr


def test_mlnxofedinstall_missing_prerequisites_is_172(ofed, tmp_path):
    root = scratch_root(
        tmp_path, DEBIAN12, installed=[p for p in NODE_PACKAGES if p not in ("pciutils", "ethtool")]
    )
    proc = install(ofed, root, "--force", "--add-kernel-support", "--without-fw-update")
    assert proc.returncode == 172
    assert "apt-get install pciutils ethtool" in proc.stdout


def test_add_kernel_support_refuses_without_headers_and_build_tools(ofed, tmp_path):
    kernel = os.uname().release
    root = scratch_root(
        tmp_path,
        DEBIAN12,
        installed=[p for p in NODE_PACKAGES if p not in ("quilt", "libelf-dev", f"linux-headers-{kernel}")],
        tools=("lsb_release",),
        headers=False,
    )
    proc = install(ofed, root, "--force", "--add-kernel-support", "--without-fw-update")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ERROR: 'apt-utils' is not installed!" in proc.stdout
    assert "ERROR: 'bzip2' is not installed!" in proc.stdout
    assert "One or more required packages for installing OFED-internal are missing." in proc.stdout
    assert f"/lib/modules/{kernel}/build/scripts is required for the Installation." in proc.stdout
    assert f"apt-get install libelf-dev quilt linux-headers-{kernel}" in proc.stdout
    assert f"Failed to build MLNX_OFED_LINUX for {kernel}" in proc.stderr
    # --skip-repo spares the repository tools, not the build's packages.
    proc = install(ofed, root, "--force", "--add-kernel-support", "--without-fw-update", "--skip-repo")
    assert proc.returncode == 1 and "apt-utils" not in proc.stdout and "linux-headers-" in proc.stdout


def test_add_kernel_support_without_lsb_release_takes_the_rpm_path(ofed, tmp_path):
    root = scratch_root(tmp_path, DEBIAN12, tools=("apt-ftparchive", "bzip2"))
    proc = install(ofed, root, "--force", "--add-kernel-support", "--without-fw-update")
    assert proc.returncode == 1 and "Linux Distribution () is not supported" in proc.stdout


def test_mlnxofedinstall_without_force_asks_and_aborts(ofed, tmp_path):
    root = scratch_root(tmp_path, DEBIAN12)
    proc = install(ofed, root, "--add-kernel-support", "--without-fw-update")
    assert proc.returncode == 1 and "Do you want to continue?[y/N]:" in proc.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("systemctl") is None,
    reason="dpkg --root installs need root and systemctl",
)
def test_mlnxofedinstall_installs_and_fw_update_needs_opt_out(ofed, tmp_path):
    root = scratch_root(tmp_path, DEBIAN12)
    proc = install(ofed, root, "--force", "--add-kernel-support")
    assert proc.returncode == 2, proc.stdout + proc.stderr  # no firmware for the device
    root2 = scratch_root(tmp_path / "2", DEBIAN12)
    proc = install(ofed, root2, "--without-fw-update", "--add-kernel-support", "--force")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Installation passed successfully" in proc.stdout
    assert "/etc/init.d/openibd restart" in proc.stdout
    assert (root2 / "etc/systemd/system/sysinit.target.wants/openibd.service").is_symlink()
    assert os.access(root2 / "etc/init.d/openibd", os.X_OK)
    info = subprocess.run(
        [str(root2 / "usr/bin/ofed_info"), "-s"], capture_output=True, text=True, check=True
    )
    assert info.stdout == "MLNX_OFED_LINUX-5.8-3.0.7.0:\n"


def test_kernel_headers_standin_has_the_build_tree_the_installers_check(repo, tmp_path):
    kernel = os.uname().release
    [deb] = (repo / "kernel").glob(f"linux-headers-{kernel}_*_amd64.deb")
    tree = extract(deb, tmp_path)
    build = tree / f"lib/modules/{kernel}/build"
    assert os.readlink(build) == f"/usr/src/linux-headers-{kernel}"
    assert (tree / f"usr/src/linux-headers-{kernel}/scripts").is_dir()
    release = (repo / "kernel/Release").read_text()
    assert "Origin: dtlab" in release and (repo / "kernel/InRelease").exists()
    assert (repo / "kernel/dtlab-archive-keyring.gpg").read_bytes()
    # apt verifies this repo by its signed Release: it is no pinned artifact.
    assert "kernel/" not in (repo / mirror.SUMS_FILE).read_text()


def test_openibd_unit_refuses_manual_stop_and_script_parses(ofed, tmp_path):
    utils = extract(next((ofed / "DEBS").glob("mlnx-ofed-kernel-utils_*.deb")), tmp_path)
    unit = (utils / "lib/systemd/system/openibd.service").read_text()
    assert "ExecStart=/etc/init.d/openibd start" in unit and "RefuseManualStop=true" in unit
    script = utils / "etc/init.d/openibd"
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    assert "restart" in script.read_text()


@pytest.fixture
def ib(ofed, tmp_path):
    diags = extract(next((ofed / "DEBS").glob("infiniband-diags_*.deb")), tmp_path)
    sysfs = tmp_path / "sys"

    def link(operstate: str | None, flags: str = "0x1003"):
        shutil.rmtree(sysfs, ignore_errors=True)
        if operstate is not None:
            (sysfs / "ib0").mkdir(parents=True)
            (sysfs / "ib0/operstate").write_text(operstate + "\n")
            (sysfs / "ib0/address").write_text("8a:2f:11:aa:bb:0c\n")
            (sysfs / "ib0/flags").write_text(flags + "\n")

    def run(tool: str, *args: str):
        return subprocess.run(
            [str(diags / "usr/sbin" / tool), *args],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "DTLAB_STANDIN_SYSFS_NET": str(sysfs), "DTLAB_STANDIN_HOSTNAME": "lab-gpu1"},
        )

    run.link = link
    return run


def test_ibstat_active_when_ib0_is_up(ib):
    ib.link("up")
    proc = ib("ibstat")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0] == "CA 'mlx5_0'"
    assert "\tCA type: MT4123" in lines and "\tNumber of ports: 1" in lines
    for want in (
        "\t\tState: Active",
        "\t\tPhysical state: LinkUp",
        "\t\tRate: 200",
        "\t\tSM lid: 1",
        "\t\tPort GUID: 0x1070fd0300aabb0c",
        "\t\tLink layer: InfiniBand",
    ):
        assert want in lines, want
    assert any(line.startswith("\t\tBase lid: ") and line != "\t\tBase lid: 0" for line in lines)
    assert ib("ibstat", "mlx5_0", "1").stdout.splitlines()[0] == "State: Active"
    assert ib("ibstat", "-l").stdout == "mlx5_0\n"
    assert ib("ibstat", "mlx5_9").returncode != 0


def test_ibstat_follows_ib0_going_down(ib):
    ib.link("down", flags="0x1002")
    lines = ib("ibstat").stdout.splitlines()
    assert "\t\tState: Down" in lines and "\t\tPhysical state: Disabled" in lines
    ib.link("lowerlayerdown", flags="0x1003")
    lines = ib("ibstat").stdout.splitlines()
    assert "\t\tState: Down" in lines and "\t\tPhysical state: Polling" in lines
    ib.link(None)
    assert ib("ibstat").returncode == 255


def test_ibstatus_and_iblinkinfo(ib):
    ib.link("up")
    out = ib("ibstatus").stdout
    assert out.startswith("Infiniband device 'mlx5_0' port 1 status:\n")
    assert "\tstate:\t\t 4: ACTIVE\n" in out and "\tphys state:\t 5: LinkUp\n" in out
    assert "\trate:\t\t 200 Gb/sec (4X HDR)\n" in out
    assert "\tdefault gid:\t fe80:0000:0000:0000:1070:fd03:00aa:bb0c\n" in out
    assert ib("iblinkinfo").stdout.startswith("CA: lab-gpu1 mlx5_0:\n")
    ib.link("down", flags="0x1002")
    assert "\tstate:\t\t 1: DOWN\n" in ib("ibstatus").stdout


def test_ofed_info_forms(ofed, tmp_path):
    scripts = extract(next((ofed / "DEBS").glob("ofed-scripts_*.deb")), tmp_path)
    exe = scripts / "usr/bin/ofed_info"

    def run(arg: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), arg], capture_output=True, text=True, check=False)

    assert run("-s").stdout == "MLNX_OFED_LINUX-5.8-3.0.7.0:\n"
    assert run("-n").stdout == "5.8-3.0.7.0\n"
    assert run("-x").returncode == 1


def test_every_packaged_script_says_what_it_stands_in_for(repo, tmp_path):
    """Executables: line 2 after the shebang; other stand-in files are checked at the source."""
    debs = list((repo / "cuda/repos/debian12/x86_64").glob("*.deb"))
    with tarfile.open(repo / "mofed" / f"{OFED}-debian12-x86_64.tgz") as tar:
        tar.extractall(tmp_path / "ofed", filter="tar")
    debs += list((tmp_path / "ofed").rglob("*.deb"))
    checked = 0
    for deb in debs:
        root = extract(deb, tmp_path / "x")
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and os.access(path, os.X_OK):
                head = path.read_bytes()[:400]
                if head.startswith(b"#!"):
                    second = head.split(b"\n")[1]
                    assert second.startswith(b"# Stands in for"), path
                    checked += 1
    assert checked >= 15


def test_every_source_file_says_what_it_stands_in_for():
    standins = Path(mirror.__file__).resolve().parent / "standins"
    checked = 0
    for sub in ("nvidia", "cuda", "nccl", "mofed"):
        for path in (standins / sub).iterdir():
            if not path.is_file() or path.suffix == ".pyc":
                continue
            lines = path.read_text().splitlines()
            first = lines[1] if lines[0].startswith("#!") else lines[0]
            assert first.startswith(
                ("# Stands in for", "/* Stands in for", "# Builds stand-ins", "# Stand-ins for")
            ), path
            checked += 1
    assert checked >= 25


# ---------------------------------------------------------------- the smoke trial's CUDA step

SMOKE_TRIAL = Path(__file__).resolve().parents[2] / "deploy/experiment/smoke_model/smoke_trial.py"


@pytest.mark.parametrize(
    ("loaded", "cuda_version", "said"),
    [
        ("515.65.01", "11.3.1", None),  # Determined's CUDA 11.3 image on R515 (CUDA 11.7)
        ("515.65.01", "11.8.0", None),  # minor version compatibility within CUDA 11
        ("515.65.01", None, None),  # no CUDA runtime in the image: nothing to compare
        (
            "515.65.01",
            "12.4.0.041",  # NGC PyTorch 24.03, Determined 0.38's default image
            "SMOKE-FAIL single-agent-allreduce: CUDA driver version is insufficient for CUDA "
            "runtime version: the image's CUDA 12.4.0.041 on ",
        ),
        (None, "11.3.1", "SMOKE-FAIL checkpoint-save: cuInit returned 100 CUDA_ERROR_NO_DEVICE on "),
        ("515.86.01", "11.3.1", "SMOKE-FAIL checkpoint-save: cuInit returned 803 CUDA_ERROR_SYSTEM_DRIVER"),
    ],
)
def test_smoke_trial_cuda_step_against_the_driver_library(unpack, tmp_path, loaded, cuda_version, said):
    """The smoke's first step in a GPU container, with the driver's libcuda.so.1 found as
    nvidia-container-cli mounts it (the library path), and the module state it reads."""
    lib = unpack("libnvidia-compute-515", "515.65.01-0ubuntu1") / "usr/lib/x86_64-linux-gnu"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if loaded:
        (run_dir / "loaded-version").write_text(loaded + "\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VERSION"}
    env |= {"LD_LIBRARY_PATH": str(lib), "DTLAB_STANDIN_RUN_DIR": str(run_dir)}
    if cuda_version:
        env["CUDA_VERSION"] = cuda_version
    row = "single-agent-allreduce" if cuda_version and cuda_version.startswith("12") else "checkpoint-save"
    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('t', sys.argv[1]); "
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t); t.cuda(sys.argv[2])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(SMOKE_TRIAL), row],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if said is None:
        assert (out.returncode, out.stdout) == (0, ""), out
    else:
        assert out.returncode == 1 and out.stdout.startswith(said), out


# --- sminfo and the opensm stand-in (rdma-core infiniband-diags/sminfo.c) ------------------------


def test_sminfo_names_the_switch_sm_until_opensm_runs_here(ib, ofed, tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "DTLAB_STANDIN_RUN_DIR": str(run_dir)}
    ib.link("up")

    diags = Path(ib("ibstat", "-l").args[0]).parent
    sysfs_env = {"DTLAB_STANDIN_SYSFS_NET": str(tmp_path / "sys"), "DTLAB_STANDIN_HOSTNAME": "lab-gpu1"}

    def tool(name, *args):
        return subprocess.run(
            [str(diags / name), *args], capture_output=True, text=True, check=False, env={**env, **sysfs_env}
        )

    out = tool("sminfo")
    assert out.returncode == 0
    found = parse_sminfo(out.stdout)
    assert found is not None and found["lid"] == 1 and found["name"] == "SMINFO_MASTER"
    assert re.fullmatch(
        r"sminfo: sm lid 1 sm guid 0x[0-9a-f]+, activity count \d+ priority 0 state 3 SMINFO_MASTER\n",
        out.stdout,
    )
    opensm = extract(next((ofed / "DEBS").glob("opensm_*.deb")), tmp_path / "opensm")
    assert (opensm / "lib/systemd/system/opensmd.service").is_file()
    daemon = subprocess.Popen(
        [str(opensm / "usr/sbin/opensm")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(50):
            if (run_dir / "opensm.json").exists():
                break
            time.sleep(0.1)
        mine = parse_sminfo(tool("sminfo").stdout)
        lines = tool("ibstat").stdout.splitlines()
        base = next(line.split(": ")[1] for line in lines if line.startswith("\t\tBase lid: "))
        assert mine is not None and mine["guid"] == "0x1070fd0300aabb0c" and mine["name"] == "SMINFO_MASTER"
        assert f"\t\tSM lid: {base}" in lines
        standby = parse_sminfo(tool("sminfo", "1").stdout)
        assert standby is not None and standby["name"] == "SMINFO_STANDBY"
    finally:
        daemon.terminate()
        daemon.wait(5)
    assert not (run_dir / "opensm.json").exists()
    assert parse_sminfo(tool("sminfo").stdout)["lid"] == 1


def test_sminfo_fails_as_infiniband_diags_without_an_active_port(ib):
    ib.link("lowerlayerdown", flags="0x1003")
    out = ib("sminfo")
    assert out.returncode == 255 and out.stdout == "sminfo: iberror: failed: query\n"
    assert parse_sminfo(out.stdout) == {"failed": "query"}
    ib.link(None)
    out = ib("sminfo")
    assert out.returncode == 255 and "Failed to open" in out.stdout
