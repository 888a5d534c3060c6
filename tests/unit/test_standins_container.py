"""The NVIDIA container stand-ins (tests/lab/standins/nvidia): the runtime hook, the cli's
requirement check, libcuda's cuInit and the fabric manager's state, and the lab's PCI bus of an
NVSwitch node. Each refusal is the vendor's (sources in the stand-ins' comments)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.facts.gpu import nvswitch_command, parse_nvswitches
from tests.lab import hardware
from tests.lab.standins import STANDINS_DIR, compile_shared_library, render, source

NVIDIA = STANDINS_DIR / "nvidia"
REFUSAL = (
    "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update "
    "your driver to a newer version, or use an earlier cuda container"
)


def installed(tmp_path: Path, name: str, target: str) -> Path:
    """A stand-in script as its package installs it (tokens filled in, executable)."""
    path = tmp_path / target
    path.write_text(render(source(f"nvidia/{name}"), VERSION="1.13.5", COMMIT="0" * 40))
    path.chmod(0o755)
    return path


# --- nvidia-container-runtime-hook ---------------------------------------------------------------


@pytest.fixture
def hook(tmp_path):
    exe = installed(tmp_path, "nvidia_container_runtime_hook.py", "nvidia-container-runtime-hook")
    argv_file = tmp_path / "cli-argv.json"
    cli = tmp_path / "fake-cli"
    cli.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))\n"
    )
    cli.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(source("nvidia/config.toml"))

    def run(env: list[str], pid: int = 4242):
        bundle = tmp_path / "bundle"
        bundle.mkdir(exist_ok=True)
        spec = {"ociVersion": "1.0.2", "process": {"env": env}, "root": {"path": "rootfs"}}
        (bundle / "config.json").write_text(json.dumps(spec))
        argv_file.unlink(missing_ok=True)
        proc = subprocess.run(
            [str(exe), "prestart"],
            input=json.dumps({"pid": pid, "bundle": str(bundle)}),
            capture_output=True,
            text=True,
            env={**os.environ, "DTLAB_STANDIN_CLI": str(cli), "DTLAB_STANDIN_HOOK_CONFIG": str(config)},
            check=False,
        )
        args = json.loads(argv_file.read_text()) if argv_file.exists() else None
        return proc, args, bundle

    return run


def test_hook_execs_the_cli_with_the_images_requirements(hook):
    proc, args, bundle = hook(
        ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471"]
    )
    assert proc.returncode == 0, proc.stderr
    assert args == [
        "--load-kmods",
        "configure",
        "--ldconfig=@/sbin/ldconfig",
        "--device=all",
        "--utility",
        "--compute",
        "--require=cuda>=12.4 brand=tesla,driver>=470,driver<471",
        "--pid=4242",
        str(bundle / "rootfs"),
    ]


def test_hook_legacy_image_disable_require_and_non_gpu_containers(hook):
    _, args, _ = hook(["CUDA_VERSION=11.3.1"])  # legacy: every device, every capability
    assert "--device=all" in args and "--require=cuda>=11.3" in args and "--video" in args
    _, args, _ = hook(
        ["NVIDIA_VISIBLE_DEVICES=0,1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4", "NVIDIA_DISABLE_REQUIRE=true"]
    )
    assert "--device=0,1" in args and not [a for a in args if a.startswith("--require")]
    for env in ([], ["NVIDIA_VISIBLE_DEVICES=void"], ["NVIDIA_VISIBLE_DEVICES="]):
        proc, args, _ = hook(env)
        assert proc.returncode == 0 and args is None, env  # not a GPU container: nothing to do


def test_hook_refuses_unsupported_capabilities(hook):
    proc, args, _ = hook(["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,warp"])
    assert proc.returncode == 1 and args is None
    assert "unsupported capabilities found in 'compute,warp'" in proc.stderr


# --- nvidia-container-cli ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    """The stand-in driver 515.65.01's libcuda, as libnvidia-compute-515 ships it."""
    where = tmp_path_factory.mktemp("lib")
    lib = compile_shared_library(
        source("nvidia/libcuda.c"),
        "libcuda.so.1",
        defines={"CUDA_DRIVER_API_VERSION": "11070", "DRIVER_VERSION": '"515.65.01"'},
    )
    (where / "libcuda.so.515.65.01").write_bytes(lib)
    (where / "libcuda.so.1").symlink_to("libcuda.so.515.65.01")
    return where


@pytest.fixture
def cli(tmp_path, libdir):
    exe = installed(tmp_path, "nvidia_container_cli.py", "nvidia-container-cli")
    run_dir, bin_dir = tmp_path / "run", tmp_path / "bin"
    run_dir.mkdir()
    bin_dir.mkdir()
    (run_dir / "loaded-version").write_text("515.65.01\n")
    smi = bin_dir / "nvidia-smi"  # two GPUs; `-L` succeeds
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in -L) echo "GPU 0: A100"; echo "GPU 1: A100";; '
        "*) echo '0, GPU-aaa, 00000000:07:00.0, NVIDIA A100-SXM4-80GB'; "
        "echo '1, GPU-bbb, 00000000:0F:00.0, NVIDIA A100-SXM4-80GB';; esac\n"
    )
    smi.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DTLAB_STANDIN_RUN_DIR": str(run_dir),
        "DTLAB_STANDIN_LIBDIR": str(libdir),
    }

    def run(*args: str):
        return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, check=False)

    run.run_dir = run_dir
    return run


def test_cli_refuses_a_newer_cuda_with_libnvidia_containers_message(cli):
    require = "--require=cuda>=12.4 brand=tesla,driver>=470,driver<471"
    proc = cli(
        "--load-kmods", "configure", "--device=all", "--compute", "--utility", require, "--pid=1", "/x/rootfs"
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == REFUSAL


def test_cli_info_reports_the_drivers_cuda(cli):
    out = cli("info").stdout
    assert "NVRM version:   515.65.01" in out and "CUDA version:   11.7" in out


def test_cli_driver_state_and_device_errors(cli):
    (cli.run_dir / "loaded-version").unlink()
    # nvidia-smi is the fake (exit 0) but the cli reads the driver's state itself too
    proc = cli("configure", "--device=all", "--pid=1", "/rootfs")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "nvidia-container-cli: initialization error: nvml error: driver not loaded"
    (cli.run_dir / "loaded-version").write_text("515.65.01\n")
    proc = cli("configure", "--device=7", "--require=cuda>=11.0", "--pid=1", "/rootfs")
    assert (
        proc.returncode == 1
        and proc.stderr.strip() == "nvidia-container-cli: device error: unknown device id: 7"
    )
    proc = cli("configure", "--device=all", "--pid=1", "relative")
    assert proc.returncode == 1 and "input error: invalid rootfs directory" in proc.stderr


@pytest.fixture(scope="module")
def dsl():
    import importlib.util

    spec = importlib.util.spec_from_file_location("standin_cli", NVIDIA / "nvidia_container_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("predicate", "met"),
    [
        ("cuda>=11.3 brand=tesla,driver>=418,driver<419 driver>=450", True),
        ("cuda>=11.7", True),
        ("cuda>=11.7.0", True),
        ("cuda>=11.8", False),
        ("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536", False),
        ("cuda>=12.4 driver>=515,driver<516", True),  # an alternative for this driver
        ("cuda>=9.0", True),
        ("driver=515.65.01", True),
        ("driver!=515.65.01", False),
        ("arch>=7.0", True),
    ],
)
def test_cli_requirement_language(dsl, predicate, met):
    facts = {"cuda": "11.7", "driver": "515.65.01", "arch": "8.0", "brand": "Nvidia"}
    if met:
        dsl.evaluate(predicate, facts)
    else:
        with pytest.raises(dsl.CliError, match="unsatisfied condition"):
            dsl.evaluate(predicate, facts)


def test_cli_requirement_messages(dsl):
    with pytest.raises(dsl.CliError) as err:
        dsl.evaluate("cuda>=12.4 brand=tesla,driver>=470,driver<471", {"cuda": "11.7", "driver": "515.65.01"})
    assert f"nvidia-container-cli: {err.value}" == REFUSAL
    with pytest.raises(dsl.CliError) as err:
        dsl.evaluate("driver>=520", {"cuda": "11.7", "driver": "515.65.01"})
    assert str(err.value) == "requirement error: unsatisfied condition: driver>=520"
    with pytest.raises(dsl.CliError, match="invalid expression"):
        dsl.evaluate("color=red", {"cuda": "11.7"})


# --- libcuda's cuInit ----------------------------------------------------------------------------


def test_cuinit_follows_the_driver_and_fabric_state(libdir, tmp_path, monkeypatch):
    monkeypatch.setenv("DTLAB_STANDIN_RUN_DIR", str(tmp_path))
    cuda = ctypes.CDLL(str(libdir / "libcuda.so.1"))
    assert cuda.cuInit(0) == 100  # no driver loaded: CUDA_ERROR_NO_DEVICE
    (tmp_path / "loaded-version").write_text("515.48.07\n")
    assert cuda.cuInit(0) == 803  # CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
    (tmp_path / "loaded-version").write_text("515.65.01\n")
    assert cuda.cuInit(0) == 0  # no NVSwitch fabric
    (tmp_path / "fabric-state").write_text("Not Started\n")
    assert cuda.cuInit(0) == 802  # CUDA_ERROR_SYSTEM_NOT_READY: no fabric manager
    (tmp_path / "fabric-state").write_text("Completed\n")
    assert cuda.cuInit(0) == 0


# --- nv-fabricmanager and the lab's PCI bus ------------------------------------------------------


def test_fabric_manager_completes_the_fabric_and_stopping_undoes_it(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    (tmp_path / "lab-hardware.yaml").write_text("nodes:\n  n1: {gpu_topology: a100-nvswitch-8}\n")
    pci = hardware.write_pci_tree(cluster, "n1", tmp_path / "pci")
    assert hardware.write_pci_tree(cluster, "n2", tmp_path / "pci2") is None
    lines = subprocess.run(
        ["sh", "-c", nvswitch_command(str(pci))], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(parse_nvswitches(lines)) == 6 and len(lines) == 14  # 8 GPUs + 6 NVSwitches

    exe = tmp_path / "nv-fabricmanager"
    exe.write_text(render(source("nvidia/nv-fabricmanager.sh"), VERSION="515.65.01", BRANCH="515"))
    exe.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "loaded-version").write_text("515.65.01\n")
    pid_file = tmp_path / "fm.pid"
    env = {
        **os.environ,
        "DTLAB_STANDIN_RUN_DIR": str(run_dir),
        "DTLAB_STANDIN_PCI_DEVICES": str(pci),
        "DTLAB_STANDIN_FM_PID": str(pid_file),
    }
    subprocess.run([str(exe)], env=env, check=True, capture_output=True)
    assert (run_dir / "fabric-state").read_text() == "Completed\n"
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    for _ in range(50):
        if (run_dir / "fabric-state").read_text() == "Not Started\n":
            break
        time.sleep(0.1)
    assert (run_dir / "fabric-state").read_text() == "Not Started\n"
