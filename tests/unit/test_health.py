"""Node health without a lab: the stand-ins' fault reports, the health rows' parsing, the drain's
decisions and the hardware keys of cluster.yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.cluster import ClusterError, load_cluster
from tests.verify import drain
from tests.verify.test_health import parse_xids, xid_summary

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "lab" / "standins"
LAB = REPO / "inventories" / "lab" / "cluster.yaml"


@pytest.fixture
def smi(tmp_path):
    """The nvidia-smi stand-in's source with its build placeholders filled, tmp /etc/dtlab."""
    exe = tmp_path / "nvidia-smi"
    source = (STANDINS / "nvidia" / "nvidia_smi.py").read_text()
    exe.write_text(source.replace("@DRIVER_VERSION@", "515.65.01").replace("@CUDA_VERSION@", "11.7"))
    (tmp_path / "run").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "run" / "loaded-version").write_text("515.65.01\n")
    env = {
        **os.environ,
        "DTLAB_STANDIN_RUN_DIR": str(tmp_path / "run"),
        "DTLAB_STANDIN_ETC_DIR": str(tmp_path / "etc"),
        "DTLAB_STANDIN_HOSTNAME": "lab-gpu1",
    }

    def run(*args: str, faults: dict | None = None):
        if faults is not None:
            (tmp_path / "etc" / "faults.json").write_text(json.dumps(faults))
        return subprocess.run(
            [sys.executable, str(exe), *args], check=False, capture_output=True, text=True, env=env
        )

    return run


HEALTH = (
    "index,ecc.errors.uncorrected.volatile.total,retired_pages.pending,"
    "clocks_throttle_reasons.active,clocks_throttle_reasons.hw_slowdown,"
    "clocks_throttle_reasons.hw_thermal_slowdown,clocks_throttle_reasons.hw_power_brake_slowdown,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
)


def test_smi_healthy_gpus_report_no_fault(smi):
    proc = smi(f"--query-gpu={HEALTH}", "--format=csv,noheader,nounits")
    assert proc.returncode == 0, proc.stdout
    rows = [line.split(", ") for line in proc.stdout.splitlines()]
    assert len(rows) == 8
    # A100: no page retirement (row remapping instead): the CSV's [N/A].
    assert rows[0] == ["0", "0", "[N/A]", "0x0000000000000000", *["Not Active"] * 3, "4", "4", "16", "16"]


def test_smi_reports_each_fault_on_its_gpu(smi):
    faults = {
        "gpus": {
            "2": {"ecc_uncorrectable": 3},
            "5": {"throttle": ["hw_power_brake_slowdown"], "pcie_gen": 3, "pcie_width": 8},
            "6": {"remap_pending": True},
            "7": {"remap_failure": True},
        }
    }
    rows = smi(f"--query-gpu={HEALTH}", "--format=csv,noheader,nounits", faults=faults).stdout.splitlines()
    assert rows[2].split(", ")[1] == "3"
    # Power brake is a kind of HW Slowdown: both bits (0x80 | 0x08), as NVML sets them.
    assert rows[5].split(", ")[3:] == [
        "0x0000000000000088",
        "Active",
        "Not Active",
        "Active",
        "3",
        "4",
        "8",
        "16",
    ]
    remaps = smi(
        "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure",
        "--format=csv",
        faults=faults,
    ).stdout.splitlines()
    assert remaps[0] == "gpu_bus_id, remapped_rows.pending, remapped_rows.failure"
    assert remaps[7:] == ["00000000:B7:00.0, 1, 0", "00000000:BD:00.0, 0, 1"]
    log = smi("-q", "-i", "2", faults=faults).stdout
    assert "            DRAM Uncorrectable            : 3" in log
    assert "    Clocks Throttle Reasons" in log
    assert "        Remapping Failure Occurred        : No" in log
    table = smi(faults=faults).stdout
    assert "| 00000000:47:00.0 Off |                    3 |" in table


def test_smi_refuses_a_broken_fault_file(smi):
    proc = smi("-L", faults={"gpus": {"9": {"ecc_uncorrectable": 1}}})
    assert proc.returncode == 255
    assert "gpus.9" in proc.stderr
    proc = smi("-L", faults={"gpus": {"0": {"throttle": ["sw_power_cap"]}}})
    assert proc.returncode == 255


@pytest.fixture
def ib(tmp_path):
    net = tmp_path / "net" / "ib0"
    net.mkdir(parents=True)
    (net / "operstate").write_text("up\n")
    (net / "flags").write_text("0x1003\n")
    (net / "address").write_text("80:00:00:00:fe:80:00:00:00:00:00:00:10:70:fd:03:00:aa:bb:cc\n")
    (tmp_path / "etc").mkdir()
    env = {
        **os.environ,
        "DTLAB_STANDIN_SYSFS_NET": str(tmp_path / "net"),
        "DTLAB_STANDIN_ETC_DIR": str(tmp_path / "etc"),
        "DTLAB_STANDIN_RUN_DIR": str(tmp_path / "run"),
    }

    def run(tool: str, *args: str, faults: dict | None = None) -> str:
        if faults is not None:
            (tmp_path / "etc" / "faults.json").write_text(json.dumps({"ib": faults}))
        script = str(STANDINS / "mofed" / "ib_diags.py")
        proc = subprocess.run(
            [sys.executable, script, tool, *args], check=False, capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    return run


def test_ib_diags_healthy_and_trained_down(ib):
    assert "\t\tRate: 200\n" in ib("ibstat")
    assert "rate:\t\t 200 Gb/sec (4X HDR)" in ib("ibstatus", "mlx5_0:1")
    assert "LinkDownedCounter:...............0" in ib("perfquery", "-C", "mlx5_0", "-P", "1")
    assert "\t\tRate: 100\n" in ib("ibstat", faults={"rate": 100, "width": "2X"})
    assert "rate:\t\t 100 Gb/sec (2X HDR)" in ib("ibstatus")
    assert "rate:\t\t 100 Gb/sec (4X EDR)" in ib("ibstatus", faults={"rate": 100})


def test_ib_link_downed_counter_rises_per_read_when_flapping(ib):
    ib("ibstat", faults={"link_downed_per_read": 2})
    reads = [ib("perfquery") for _ in range(2)]
    assert "LinkDownedCounter:...............2" in reads[0]
    assert "LinkDownedCounter:...............4" in reads[1]


def test_xid_lines_are_parsed_with_their_meaning():
    log = (
        "[ 9.1] kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  515.65.01\n"
        "[77.2] kernel: NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked "
        "for remapping, reset gpu to activate.\n"
        "[80.0] kernel: NVRM: Xid (PCI:0000:4e:00): 79, pid=2202, GPU has fallen off the bus.\n"
        "[80.1] kernel: NVRM: Xid (PCI:0000:4e:00): 79, pid=2202, GPU has fallen off the bus.\n"
    )
    events = parse_xids(log)
    assert events == [("0000:10:1c", 63), ("0000:4e:00", 79), ("0000:4e:00", 79)]
    summary = xid_summary(events)
    assert "Xid 79 on 0000:4e:00 x2: GPU has fallen off the bus" in summary
    assert "Xid 63 on 0000:10:1c x1" in summary
    assert parse_xids("NVRM: GPU at PCI:0000:4e:00: GPU-abc\n") == []


def _report(check: str, node: str, when="call", outcome="passed", message="", ssh=False):
    crash = SimpleNamespace(message=message)
    props = [("verify.node", node)] + ([("verify.ssh", "SSH: timed out")] if ssh else [])
    return SimpleNamespace(
        nodeid=f"tests/verify/test_health.py::{check}[{node}]",
        when=when,
        passed=outcome == "passed",
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        longrepr=SimpleNamespace(reprcrash=crash) if message else None,
        user_properties=props,
    )


def test_drain_never_for_a_check_that_could_not_run():
    health: dict[str, drain.Health] = {}
    for report in (
        _report("test_gpu_memory", "gpu1"),
        _report(
            "test_no_uncorrectable_ecc_errors", "gpu1", outcome="failed", message="AssertionError: GPU 2: 3"
        ),
        _report(
            "test_gpu_memory", "gpu2", outcome="failed", message="Failed: could not run: nvidia-smi -> exit 9"
        ),
        _report(
            "test_gpu_memory", "gpu3", when="setup", outcome="failed", message="SSH: timed out", ssh=True
        ),
        _report("test_host_device_bandwidth", "gpu4", when="setup", outcome="skipped"),
        _report("test_gpu_memory", "gpu4"),
        _report("test_gpu_memory", "master"),  # not in test_health's agents: no agents of it
    ):
        drain.classify(health, report)
    assert {n: h.verdict for n, h in health.items()} == {
        "gpu1": "unhealthy",
        "gpu2": "unknown",
        "gpu3": "unknown",
        "gpu4": "healthy",
        "master": "healthy",
    }
    agents = {
        "gpu1": {"gpu1-0": True, "gpu1-1": False, "gpu1-2": True, "gpu1-3": False},
        "gpu2": {"gpu2": False},
        "gpu3": {"gpu3": False},
        "gpu4": {"gpu4": False},
    }
    # gpu1-1: drained already; gpu1-2: drained, but re-registered enabled after a restart;
    # gpu1-3: disabled by an operator, never touched (neither now nor when gpu1 is healthy).
    actions = drain.plan(health, agents, drained={"gpu2", "gpu3", "gpu4", "gpu1-1", "gpu1-2"})
    assert [(a, agent) for a, agent, _, _ in actions] == [
        ("disable", "gpu1-0"),
        ("disable", "gpu1-2"),
        ("enable", "gpu4"),
    ]
    assert "GPU 2: 3" in actions[0][3]


@pytest.mark.parametrize("suffix", ["", "@lab-gpu1"])
def test_drain_reads_the_node_from_the_test_id_without_the_matrix(suffix):
    """Without the matrix plugin's verify.node property: the parametrisation id, also under
    --dist loadgroup, whose test ids end with "@<group>" (a drained node came back otherwise)."""
    report = _report("test_gpu_memory", "lab-gpu1")
    report.user_properties = []
    report.nodeid += suffix
    health: dict[str, drain.Health] = {}
    drain.classify(health, report)
    assert {n: h.verdict for n, h in health.items()} == {"lab-gpu1": "healthy"}


def _lab_with(tmp_path, old: str, new: str) -> Path:
    text = LAB.read_text()
    assert old in text
    path = tmp_path / "cluster.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_hardware_defaults_presets_and_node_classes(tmp_path):
    lab = load_cluster(LAB, resolve_secrets=False)
    assert lab.hardware.gpu_model == "NVIDIA A100-SXM4-80GB" and lab.hardware.ib_ports == 1
    assert lab.node("lab-gpu1").hardware == lab.hardware
    assert lab.master_node.hardware is None
    path = _lab_with(
        tmp_path,
        "    slots: 8\n\nsources:",
        "    slots: 8\n    hardware: {preset: v100-sxm2-16gb}\n\nsources:",
    )
    gpu3 = load_cluster(path, resolve_secrets=False).node("lab-gpu3").hardware
    assert (gpu3.gpu_model, gpu3.gpu_memory_mib, gpu3.ib_rate_gbps, gpu3.ib_ports) == (
        "Tesla V100-SXM2-16GB",
        16384,
        100,
        4,
    )


def test_hardware_keys_are_checked(tmp_path):
    path = _lab_with(tmp_path, "  ib_ports: 1\n", "  ib_ports: 1\n  ib_rate_gbps: 150\n  ib_width: 4x\n")
    with pytest.raises(ClusterError) as e:
        load_cluster(path, resolve_secrets=False)
    assert [p.split(": ", 1)[1] for p in e.value.problems] == [
        "hardware.ib_rate_gbps: 150: must be an InfiniBand port rate in Gb/s as ibstat shows it: "
        "10, 14, 20, 25, 40, 50, 56, 100, 200, 400",
        "hardware.ib_width: '4x': must be one of 1X, 2X, 4X, 8X, 12X",
    ]


# `ibstat` of an HCA whose second port runs in Ethernet mode (RoCE), as MLNX_OFED prints it.
IBSTAT_MIXED = """CA 'mlx5_0'
\tCA type: MT4123
\tNumber of ports: 1
\tPort 1:
\t\tState: {state}
\t\tPhysical state: LinkUp
\t\tRate: 200
\t\tLink layer: InfiniBand
CA 'mlx5_1'
\tCA type: MT4123
\tNumber of ports: 1
\tPort 1:
\t\tState: Down
\t\tPhysical state: Disabled
\t\tRate: 40
\t\tLink layer: Ethernet
"""


@pytest.mark.parametrize("state, passes", [("Active", True), ("Initializing", False)])
def test_ib_ports_row_reads_infiniband_ports_only(state, passes):
    from tests.verify.test_gpu_stack import test_ib_ports_active

    host = SimpleNamespace(check_output=lambda command: IBSTAT_MIXED.format(state=state))
    if passes:
        test_ib_ports_active(None, lambda node: host)
    else:
        with pytest.raises(AssertionError, match="mlx5_0 port 1: State Initializing"):
            test_ib_ports_active(None, lambda node: host)


# --- sminfo (rdma-core infiniband-diags/sminfo.c and ibdiag_common.c ibexit) ---------------------


def test_parse_sminfo_master_line():
    from deploy.facts.fabric import parse_sminfo

    out = (
        "sminfo: sm lid 1 sm guid 0xb8599f0300a0a0a0, activity count 4711 priority 0 state 3 SMINFO_MASTER\n"
    )
    assert parse_sminfo(out) == {
        "lid": 1,
        "guid": "0xb8599f0300a0a0a0",
        "activity": 4711,
        "priority": 0,
        "state": 3,
        "name": "SMINFO_MASTER",
    }
    assert (
        parse_sminfo(out.replace("state 3 SMINFO_MASTER", "state 2 SMINFO_STANDBY"))["name"]
        == "SMINFO_STANDBY"
    )


def test_parse_sminfo_failures():
    from deploy.facts.fabric import parse_sminfo

    assert parse_sminfo("sminfo: iberror: failed: query\n") == {"failed": "query"}
    assert parse_sminfo("/usr/sbin/sminfo: iberror: [pid 812] main: failed: query\n") == {"failed": "query"}
    assert parse_sminfo("ibwarn: x\nsminfo: iberror: failed: can't resolve sm port (null)\n") == {
        "failed": "can't resolve sm port (null)"
    }
    assert parse_sminfo("bash: sminfo: command not found\n") is None


def test_the_drain_state_follows_xdg_state_home(monkeypatch, tmp_path):
    from tests.verify.drain import state_file

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert state_file(None) == tmp_path / "gpu-cluster" / "drained-agents.json"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/dir")  # the spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_file(None) == tmp_path / "home" / ".local" / "state" / "gpu-cluster" / "drained-agents.json"
    assert state_file("~/x.json") == tmp_path / "home" / "x.json"


def test_sminfo_is_not_blamed_for_a_port_whose_link_is_down():
    from deploy.facts.fabric import no_linked_port

    def port(state, phys, layer="InfiniBand"):
        return {"State": state, "Physical state": phys, "Link layer": layer}

    assert no_linked_port({("mlx5_0", 1): port("Active", "LinkUp")}) is None
    # Initializing behind a linked port: an unmanaged fabric, the SM row's to fail.
    assert no_linked_port({("mlx5_0", 1): port("Initializing", "LinkUp")}) is None
    down = no_linked_port(
        {("mlx5_0", 1): port("Down", "Polling"), ("mlx5_1", 1): port("Active", "LinkUp", "Ethernet")}
    )
    assert down == "no InfiniBand port is linked up (mlx5_0/1 Polling)"
    assert no_linked_port({}) == "no InfiniBand port"
