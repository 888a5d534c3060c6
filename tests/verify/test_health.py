"""Node health the way HPC sites check it before a job lands (LBNL NHC as Azure extends it for
GPU servers: Azure/azurehpc-health-checks, conf/nd96amsr_a100_v4.conf and customTests/).

Every expected value comes from cluster.yaml's `hardware` (per node: `nodes[].hardware`).
A command that cannot run fails its row with a message starting "could not run:": such a row
is red, but `--drain-unhealthy` (tests/verify/drain.py) never drains a node for it.
The bandwidth rows need real GPUs and run with `python -m deploy verify --hardware` only;
without it they are skipped with "not run: needs GPUs".
"""

import json
import re
import shlex
import time

import pytest

from deploy.cluster.hardware import GPU_MEMORY_TOLERANCE
from deploy.facts.fabric import parse_ibstat
from tests.verify.matrix import P_SEEN

COULD_NOT_RUN = "could not run"
NOT_RUN = "not run: needs GPUs (python -m deploy verify --hardware)"

# NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/index.html): the events that
# mean the GPU or its memory is failing; any other Xid is shown with its number only.
XID_MEANINGS = {
    48: "double-bit ECC error (DBE): reset the GPU; recurring: RMA",
    63: "ECC page retirement or row remapping recorded: reset the GPU to activate it",
    64: "ECC page retirement or row remapping FAILED: RMA the GPU",
    74: "NVLink error: check the NVLink/NVSwitch fabric, reset the GPU",
    79: "GPU has fallen off the bus: reboot; recurring: reseat or RMA",
    92: "high single-bit ECC error rate: watch; RMA if it persists",
    94: "contained ECC error: restart the application that hit it",
    95: "uncontained ECC error: reset the GPU (all its applications die)",
}
# `NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: ...` (the driver's kernel log line,
# as stas00/ml-engineering compute/accelerator/nvidia/debug.md quotes it).
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),")


def _run(h, command: str) -> str:
    """stdout of `command` on the node; a failure is the check not running, not a finding."""
    result = h.run(command)
    if result.rc != 0:
        err = (result.stderr or result.stdout).strip().splitlines()
        pytest.fail(f"{COULD_NOT_RUN}: {command} -> exit {result.rc}: {err[-1] if err else 'no output'}")
    return result.stdout


def _csv(h, query: str, option: str = "--query-gpu") -> list[list[str]]:
    out = _run(h, f"nvidia-smi {option}={query} --format=csv,noheader,nounits")
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def _seen(record_property, node, what: str, value: str) -> None:
    record_property(P_SEEN, json.dumps({"what": what, "node": node.hostname, "value": value}))


def test_gpu_count_and_model(agent, host_of):
    hw = agent.hardware
    rows = _csv(host_of(agent), "index,name")
    names = [name for _, name in rows]
    assert len(names) == hw.gpu_count, f"{len(names)} GPUs, expected {hw.gpu_count}: {names}"
    wrong = [f"GPU {i}: {name}" for i, name in rows if name != hw.gpu_model]
    assert not wrong, f"expected {hw.gpu_model}; " + "; ".join(wrong)


def test_gpu_memory(agent, host_of):
    least = agent.hardware.gpu_memory_mib * (1 - GPU_MEMORY_TOLERANCE)
    rows = _csv(host_of(agent), "index,memory.total")
    short = [f"GPU {i}: {mib} MiB" for i, mib in rows if float(mib) < least]
    assert not short, f"below {least:.0f} MiB ({agent.hardware.gpu_memory_mib} less 3%): " + "; ".join(short)


def parse_xids(log: str) -> list[tuple[str, int]]:
    """(PCI address, Xid) of every `NVRM: Xid` line of a kernel log, in order."""
    return [(m["pci"], int(m["xid"])) for m in XID_LINE.finditer(log)]


def xid_summary(events: list[tuple[str, int]]) -> str:
    counts: dict[tuple[str, int], int] = {}
    for event in events:
        counts[event] = counts.get(event, 0) + 1
    return "; ".join(
        f"Xid {xid} on {pci} x{n}: {XID_MEANINGS.get(xid, 'see NVIDIA Xid catalog')}"
        for (pci, xid), n in counts.items()
    )


def test_no_gpu_xid_since_boot(agent, host_of):
    # journalctl -k -b: the kernel's messages of this boot from the journal, which keeps them
    # after dmesg's ring buffer wrapped. A lab node has no kernel log (systemd-nspawn gives a
    # container no /dev/kmsg): there the journal holds no kernel lines and the row passes.
    log = _run(host_of(agent), "journalctl -k -b --no-pager -q -o short-monotonic")
    events = parse_xids(log)
    assert not events, xid_summary(events)


def test_no_uncorrectable_ecc_errors(agent, host_of):
    rows = _csv(host_of(agent), "index,ecc.errors.uncorrected.volatile.total")
    bad = [f"GPU {i}: {n}" for i, n in rows if n.isdigit() and int(n) > 0]
    assert not bad, "volatile uncorrectable ECC errors since the last reset: " + "; ".join(bad)


def test_no_pending_remaps_or_retirements(agent, host_of):
    """Row remapping (A100 and later) and page retirement (V100): pending means the GPU needs a
    reset, a failure means RMA (NVIDIA's GPU memory error management; Azure's azure_gpu_ecc.nhc
    fails on the same two flags)."""
    h = host_of(agent)
    problems = []
    rows = _csv(h, "index,retired_pages.pending,retired_pages.double_bit.count")
    for i, pending, dbe in rows:
        if pending == "Yes":
            problems.append(f"GPU {i}: page retirement pending ({dbe} double-bit pages)")
    remaps = _csv(h, "gpu_bus_id,remapped_rows.pending,remapped_rows.failure", "--query-remapped-rows")
    for bus, pending, failure in remaps:
        if failure in ("1", "Yes"):
            problems.append(f"{bus}: row remapping FAILED")
        elif pending in ("1", "Yes"):
            problems.append(f"{bus}: row remap pending")
    assert not problems, "; ".join(problems)


THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def test_no_hardware_clock_throttling(agent, host_of):
    """HW Slowdown (and its kinds: thermal, power brake) halves the clocks or worse: hardware
    trouble. Idle, SW power cap and application clocks are normal (azure_gpu_clock_throttling.nhc)."""
    fields = ",".join(f"clocks_throttle_reasons.{r}" for r in THROTTLE)
    rows = _csv(host_of(agent), f"index,{fields}")
    bad = [
        f"GPU {row[0]}: "
        + ", ".join(r for r, state in zip(THROTTLE, row[1:], strict=True) if state == "Active")
        for row in rows
        if "Active" in row[1:]
    ]
    assert not bad, "; ".join(bad)


def test_pcie_links_at_max(agent, host_of):
    """Width must be the GPU's maximum always; generation only in P0, since an idle GPU lowers
    its link generation to save power (nvidia-smi -q shows "Current : 1" at P8)."""
    query = "index,pstate,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    bad = []
    for i, pstate, gen, gen_max, width, width_max in _csv(host_of(agent), query):
        if width.isdigit() and width_max.isdigit() and int(width) < int(width_max):
            bad.append(f"GPU {i}: x{width} of x{width_max}")
        if pstate == "P0" and gen.isdigit() and gen_max.isdigit() and int(gen) < int(gen_max):
            bad.append(f"GPU {i}: Gen{gen} of Gen{gen_max}")
    assert not bad, "PCIe link trained down: " + "; ".join(bad)


def _ib_ports(h) -> dict[tuple[str, int], dict[str, str]]:
    ports = parse_ibstat(_run(h, "ibstat").splitlines())
    return {k: v for k, v in ports.items() if v.get("Link layer", "InfiniBand") == "InfiniBand"}


IBSTATUS_RATE = re.compile(r"rate:\s+(?P<rate>\d+) Gb/sec \((?P<width>\d+X)")


def test_ib_ports_rate_and_width(agent, host_of, record_property):
    hw, h = agent.hardware, host_of(agent)
    ports = _ib_ports(h)
    problems = [] if len(ports) == hw.ib_ports else [f"{len(ports)} InfiniBand ports, expected {hw.ib_ports}"]
    seen = []
    for (ca, port), fields in sorted(ports.items()):
        state, rate = fields.get("State"), fields.get("Rate")
        status = _run(h, f"ibstatus {shlex.quote(ca)}:{port}")
        found = IBSTATUS_RATE.search(status)
        width = found["width"] if found else "?"
        seen.append(f"{ca}/{port} {state} {rate} Gb/s {width}")
        if state != "Active":
            problems.append(f"{ca} port {port}: {state}")
        elif rate != str(hw.ib_rate_gbps) or width != hw.ib_width:
            problems.append(
                f"{ca} port {port}: {rate} Gb/s {width}, expected {hw.ib_rate_gbps} {hw.ib_width}"
            )
    _seen(record_property, agent, "InfiniBand ports", ", ".join(seen) or "none")
    assert not problems, "; ".join(problems)


LINK_DOWNED = re.compile(r"^LinkDownedCounter:\.*(\d+)$", re.M)
FLAP_INTERVAL = 3  # seconds between the two reads


def test_ib_links_not_flapping(agent, host_of):
    """LinkDownedCounter rising between two reads: the link went down and retrained meanwhile
    (Azure's azure_ib_link_flapping.nhc looks for 'lost carrier' in syslog for the same)."""
    h = host_of(agent)
    ports = sorted(_ib_ports(h))

    def counters():
        found = {}
        for ca, port in ports:
            out = _run(h, f"perfquery -C {shlex.quote(ca)} -P {port}")
            value = LINK_DOWNED.search(out)
            assert value, f"{COULD_NOT_RUN}: perfquery -C {ca} -P {port}: no LinkDownedCounter"
            found[(ca, port)] = int(value[1])
        return found

    first = counters()
    time.sleep(FLAP_INTERVAL)
    second = counters()
    rising = [
        f"{ca} port {p}: {first[ca, p]} -> {second[ca, p]}" for ca, p in ports if second[ca, p] > first[ca, p]
    ]
    assert not rising, f"LinkDownedCounter rose within {FLAP_INTERVAL} s: " + "; ".join(rising)


def test_host_memory(agent, host_of, record_property):
    hw = agent.hardware
    meminfo = _run(host_of(agent), "cat /proc/meminfo")
    kib = int(re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)[1])  # type: ignore[index]
    gib = kib / 2**20
    if hw.host_memory_gib is None:
        _seen(
            record_property,
            agent,
            "host memory",
            f"{gib:.1f} GiB (not checked: hardware.host_memory_gib unset)",
        )
        return
    _seen(record_property, agent, "host memory", f"{gib:.1f} GiB")
    tol = hw.host_memory_tolerance_pct / 100
    low, high = hw.host_memory_gib * (1 - tol), hw.host_memory_gib * (1 + tol)
    assert low <= gib <= high, (
        f"MemTotal {gib:.1f} GiB, expected {hw.host_memory_gib} GiB ± {hw.host_memory_tolerance_pct}%"
    )


def test_cpu_count(agent, host_of, record_property):
    count = int(_run(host_of(agent), "nproc --all").strip())
    expected = agent.hardware.cpu_count
    if expected is None:
        _seen(record_property, agent, "CPUs", f"{count} (not checked: hardware.cpu_count unset)")
        return
    _seen(record_property, agent, "CPUs", str(count))
    assert count == expected, f"{count} logical CPUs, expected {expected}"


# --- real hardware only (python -m deploy verify --hardware) ---------------------------------


@pytest.fixture
def hardware_run(request):
    if not request.config.getoption("--hardware", default=False):
        pytest.skip(NOT_RUN)


BANDWIDTH_TEST = "/usr/local/cuda/extras/demo_suite/bandwidthTest"
MBPS_LINE = re.compile(r"^\s*\d+\s+([\d.]+)\s*$", re.M)


def test_host_device_bandwidth(agent, host_of, hardware_run):
    """CUDA's bandwidthTest (cuda-demo-suite), pinned memory, per GPU, both directions; floor
    hardware.host_device_gbps (Azure's check_cuda_bw 24 GB/s on A100)."""
    h, floor = host_of(agent), agent.hardware.host_device_gbps
    slow = []
    for i in range(agent.hardware.gpu_count):
        out = _run(h, f"{BANDWIDTH_TEST} --device={i} --memory=pinned --htod --dtoh --csv")
        values = [float(v) / 1000 for v in MBPS_LINE.findall(out)]
        found = re.findall(r"Bandwidth = ([\d.]+) GB/s", out)
        values += [float(v) for v in found]
        assert values, f"{COULD_NOT_RUN}: bandwidthTest printed no bandwidth for GPU {i}"
        if min(values) < floor:
            slow.append(f"GPU {i}: {min(values):.1f} GB/s")
    assert not slow, f"host<->device below {floor} GB/s: " + "; ".join(slow)


def test_nccl_allreduce_bandwidth(agent, host_of, hardware_run):
    """nccl-tests' all_reduce_perf over the node's GPUs; floor hardware.nccl_busbw_gbps (Azure's
    check_nccl_allreduce 228 GB/s on 8 x A100)."""
    hw = agent.hardware
    out = _run(host_of(agent), f"all_reduce_perf -b 1G -e 4G -f 2 -g {hw.gpu_count}")
    found = re.search(r"# Avg bus bandwidth\s*:\s*([\d.]+)", out)
    assert found, f"{COULD_NOT_RUN}: all_reduce_perf printed no average bus bandwidth"
    busbw = float(found[1])
    assert busbw >= hw.nccl_busbw_gbps, f"all-reduce bus bandwidth {busbw} GB/s < {hw.nccl_busbw_gbps}"


def test_ib_write_bandwidth(agent, host_of, hardware_run):
    """perftest's ib_write_bw in loopback on each port (server and client on the node); floor
    hardware.ib_write_gbps (Azure's check_ib_bw_gdr 185 Gb/s on HDR)."""
    h, floor = host_of(agent), agent.hardware.ib_write_gbps
    slow = []
    for ca, port in sorted(_ib_ports(h)):
        dev = f"-d {shlex.quote(ca)} -i {port} --report_gbits -D 3"
        out = _run(h, f"(ib_write_bw {dev} >/dev/null 2>&1 &) ; sleep 1; ib_write_bw {dev} localhost")
        rows = re.findall(r"^\s*\d+\s+\d+\s+([\d.]+)\s+([\d.]+)", out, re.M)
        assert rows, f"{COULD_NOT_RUN}: ib_write_bw printed no result on {ca}/{port}"
        average = float(rows[-1][1])
        if average < floor:
            slow.append(f"{ca}/{port}: {average} Gb/s")
    assert not slow, f"ib_write_bw below {floor} Gb/s: " + "; ".join(slow)
