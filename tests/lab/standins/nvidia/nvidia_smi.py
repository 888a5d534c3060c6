#!/usr/bin/python3
# Stands in for NVIDIA's nvidia-smi (package nvidia-utils-515, driver @DRIVER_VERSION@); lab only.
"""nvidia-smi for lab nodes without GPUs.

Answers the forms the deploy and its checks use, in the real output formats:
  nvidia-smi                      the usual table
  nvidia-smi -L                   one line per GPU
  nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits] [-i IDS]
  nvidia-smi topo -m              the topology matrix with legend
  nvidia-smi -q                   a short NVSMI LOG
  nvidia-smi -pm 0|1              persistence mode (root only)
  nvidia-smi --query-remapped-rows=F,... --format=csv[,...]   row remapping (A100 and later)

Faults: /etc/dtlab/faults.json (lab only; the lab test writes it, nothing else does) makes
GPUs report what failing hardware reports, per GPU index:

  {"gpus": {"3": {"ecc_uncorrectable": 2,        # volatile DRAM uncorrectable ECC errors
                  "remap_pending": true,         # a row waits for remapping (GPU reset)
                  "remap_failure": true,         # remapping failed: RMA
                  "retired_pages": 3,            # double-bit retired pages (V100 and older)
                  "retired_pending": true,       # a page waits for retirement
                  "throttle": ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"],
                  "pcie_gen": 3, "pcie_width": 8}}}   # the link trained below Gen4 x16

XID events are not here: they are kernel log lines (NVRM: Xid ...), and a lab node has no
kernel log of its own (docs/verify.md, "Health").

The "driver" is the kernel-module state written at boot by nvidia-module-load.service into
/run/nvidia-standin/loaded-version. Missing: exit 9 (driver not loaded); different from this
userspace version: exit 18 (Driver/library version mismatch). So a driver change needs a
reboot before nvidia-smi works again, as on real hardware.

GPU topology: /etc/dtlab/gpu-topology.json if present (written by the lab before boot),
otherwise 8 x NVIDIA A100-SXM4-80GB in two NVLink domains of four. Format:

  {
    "gpus": [                               # one entry per GPU, a name or an object
      "NVIDIA A100-SXM4-80GB",
      {"name": "NVIDIA A100-SXM4-80GB",     # required in the object form
       "bus_id": "00000000:07:00.0",        # optional, defaults per index
       "memory_mib": 81920,                 # optional, from the name (80GB/40GB/...)
       "uuid": "GPU-...",                   # optional, derived from hostname and index
       "cpu_affinity": "0-31",              # optional, "N/A" when absent
       "numa_affinity": "0"}                # optional, "N/A" when absent
    ],
    "nics": ["mlx5_0"],                     # optional NIC columns of topo -m
    "matrix": [["X", "NV12", ...], ...]     # (gpus + nics) square, symmetric, "X" on the
  }                                         # diagonal; X SYS NODE PHB PXB PIX NV<n>

Test-only environment overrides (never set on a node): DTLAB_STANDIN_ETC_DIR (for
/etc/dtlab), DTLAB_STANDIN_RUN_DIR (for /run/nvidia-standin), DTLAB_STANDIN_HOSTNAME.
"""

import json
import os
import re
import socket
import sys
import time
import uuid

DRIVER_VERSION = "@DRIVER_VERSION@"
CUDA_VERSION = "@CUDA_VERSION@"

ETC_DIR = os.environ.get("DTLAB_STANDIN_ETC_DIR", "/etc/dtlab")
RUN_DIR = os.environ.get("DTLAB_STANDIN_RUN_DIR", "/run/nvidia-standin")

EXIT_INVALID_ARG = 2
EXIT_NO_PERMISSION = 4
EXIT_NO_DEVICES = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_VERSION_MISMATCH = 18
EXIT_OTHER = 255

MSG_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
MSG_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\n"
MSG_INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"

DEFAULT_BUS_IDS = [
    "00000000:07:00.0",
    "00000000:0F:00.0",
    "00000000:47:00.0",
    "00000000:4E:00.0",
    "00000000:87:00.0",
    "00000000:90:00.0",
    "00000000:B7:00.0",
    "00000000:BD:00.0",
]
LINK_LABEL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV[1-9][0-9]*)$")

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


class TopologyError(Exception):
    pass


def default_topology():
    gpus = []
    for i in range(8):
        domain = i // 4
        gpus.append(
            {
                "name": "NVIDIA A100-SXM4-80GB",
                "cpu_affinity": "0-31" if domain == 0 else "32-63",
                "numa_affinity": str(domain),
            }
        )
    nics = ["mlx5_0"]
    n = len(gpus) + len(nics)
    matrix = [["SYS"] * n for _ in range(n)]
    for a in range(8):
        for b in range(8):
            if a == b:
                matrix[a][b] = "X"
            elif a // 4 == b // 4:
                matrix[a][b] = "NV12"
        # mlx5_0 hangs off the PCIe switch of the first domain (NUMA 0).
        matrix[a][8] = matrix[8][a] = "PXB" if a < 4 else "SYS"
    matrix[8][8] = "X"
    return {"gpus": gpus, "nics": nics, "matrix": matrix}


def hostname():
    name = os.environ.get("DTLAB_STANDIN_HOSTNAME")
    if name:
        return name
    try:
        with open("/etc/hostname") as f:
            name = f.read().strip()
    except OSError:
        name = ""
    return name or socket.gethostname()


def memory_for(name):
    m = re.search(r"(\d+)GB", name)
    return int(m.group(1)) * 1024 if m else 81920


def load_topology():
    path = os.path.join(ETC_DIR, "gpu-topology.json")
    if os.path.exists(path):
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError) as exc:
            raise TopologyError(f"{path}: {exc}") from None
        where = path
    else:
        raw = default_topology()
        where = "default topology"
    topo = normalise(raw, where)
    for index, fault in load_faults(topo).items():
        topo["gpus"][index]["faults"] = fault
    return topo


def normalise(raw, where):
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list):
        raise TopologyError(f"{where}: needs a 'gpus' list")
    host = hostname()
    gpus = []
    for i, g in enumerate(raw["gpus"]):
        if isinstance(g, str):
            g = {"name": g}  # noqa: PLW2901 (a bare name is shorthand for {name: ...})
        if not isinstance(g, dict) or not isinstance(g.get("name"), str):
            raise TopologyError(f"{where}: gpus[{i}] needs a 'name'")
        bus = g.get("bus_id") or (
            DEFAULT_BUS_IDS[i] if i < len(DEFAULT_BUS_IDS) else f"00000000:{0xC0 + i:02X}:00.0"
        )
        gpus.append(
            {
                "index": i,
                "name": g["name"],
                "bus_id": bus,
                "memory_mib": int(g.get("memory_mib") or memory_for(g["name"])),
                "uuid": g.get("uuid") or "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{host}.gpu{i}.dtlab")),
                "cpu_affinity": str(g.get("cpu_affinity", "N/A")),
                "numa_affinity": str(g.get("numa_affinity", "N/A")),
            }
        )
    nics = raw.get("nics", [])
    if not isinstance(nics, list) or not all(isinstance(n, str) for n in nics):
        raise TopologyError(f"{where}: 'nics' must be a list of names")
    n = len(gpus) + len(nics)
    matrix = raw.get("matrix")
    if matrix is None:
        matrix = [["X" if a == b else "SYS" for b in range(n)] for a in range(n)]
    if not isinstance(matrix, list) or len(matrix) != n:
        raise TopologyError(f"{where}: 'matrix' must have {n} rows (gpus + nics)")
    for a, row in enumerate(matrix):
        if not isinstance(row, list) or len(row) != n:
            raise TopologyError(f"{where}: matrix row {a} must have {n} entries")
        for b, label in enumerate(row):
            if not isinstance(label, str) or not LINK_LABEL.match(label):
                raise TopologyError(f"{where}: matrix[{a}][{b}]: bad link label {label!r}")
            if (a == b) != (label == "X"):
                raise TopologyError(f"{where}: matrix[{a}][{b}]: 'X' belongs on the diagonal only")
            if matrix[b][a] != label:
                raise TopologyError(f"{where}: matrix is not symmetric at [{a}][{b}]")
    return {"gpus": gpus, "nics": nics, "matrix": matrix}


def driver_state():
    """Exit code and message when the 'kernel module' does not match, else None."""
    try:
        with open(os.path.join(RUN_DIR, "loaded-version")) as f:
            loaded = f.read().strip()
    except FileNotFoundError:
        return EXIT_DRIVER_NOT_LOADED, MSG_NO_DRIVER
    if loaded != DRIVER_VERSION:
        return EXIT_VERSION_MISMATCH, MSG_MISMATCH
    return None


PERSISTENCE_FILE = "persistence-mode"


def persistence_on(topo):
    """Bus ids with persistence mode on. /run/nvidia-standin/persistence-mode: missing = none,
    empty = every GPU (what the nvidia-persistenced stand-in writes), else one bus id a line."""
    path = os.path.join(RUN_DIR, PERSISTENCE_FILE)
    try:
        with open(path) as f:
            lines = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return set()
    return set(lines) if lines else {g["bus_id"] for g in topo["gpus"]}


def persistence_enabled(g):
    return g["bus_id"] in persistence_on(load_topology())


FAULTS_FILE = "faults.json"
FAULT_KEYS = {
    "ecc_uncorrectable": int,
    "remap_pending": bool,
    "remap_failure": bool,
    "retired_pages": int,
    "retired_pending": bool,
    "throttle": list,
    "pcie_gen": int,
    "pcie_width": int,
}
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def load_faults(topo):
    """GPU index -> its faults, from /etc/dtlab/faults.json; {} without the file."""
    path = os.path.join(ETC_DIR, FAULTS_FILE)
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise TopologyError(f"{path}: {exc}") from None
    gpus = raw.get("gpus", {}) if isinstance(raw, dict) else None
    if not isinstance(gpus, dict):
        raise TopologyError(f"{path}: 'gpus' must map GPU indexes to faults")
    faults = {}
    for index, fault in gpus.items():
        if not str(index).isdigit() or int(index) >= len(topo["gpus"]) or not isinstance(fault, dict):
            raise TopologyError(f"{path}: gpus.{index}: not a GPU index with a mapping of faults")
        for key, value in fault.items():
            kind = FAULT_KEYS.get(key)
            if kind is None or not isinstance(value, kind):
                raise TopologyError(f"{path}: gpus.{index}.{key}: unknown fault or wrong type")
        if not set(fault.get("throttle", [])) <= set(THROTTLE_REASONS):
            raise TopologyError(f"{path}: gpus.{index}.throttle: one of {', '.join(THROTTLE_REASONS)}")
        faults[int(index)] = fault
    return faults


def is_v100(g):
    return "V100" in g["name"]


def health(g):
    """What the GPU reports about its health: the fault file's values, else a healthy GPU's."""
    fault = g.get("faults", {})
    v100 = is_v100(g)
    return {
        "ecc_uncorrectable": fault.get("ecc_uncorrectable", 0),
        # A100 and later remap rows instead of retiring pages: nvidia-smi shows N/A for pages
        # there, and V100 has no row remapper (nvidia-smi -q: "Remapped Rows : N/A").
        "remap": None if v100 else (fault.get("remap_pending", False), fault.get("remap_failure", False)),
        "retired": (fault.get("retired_pages", 0), fault.get("retired_pending", False)) if v100 else None,
        "throttle": set(fault.get("throttle", [])),
        "pcie_gen": fault.get("pcie_gen", 3 if v100 else 4),
        "pcie_gen_max": 3 if v100 else 4,
        "pcie_width": fault.get("pcie_width", 16),
    }


# NVML's clocks throttle reason bits (nvml.h nvmlClocksThrottleReason*), as
# clocks_throttle_reasons.active prints them; a GPU in P0 without load shows none.
THROTTLE_BITS = {"hw_slowdown": 0x8, "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80}


def throttle_mask(h):
    mask = 0
    for reason in h["throttle"]:
        mask |= THROTTLE_BITS[reason]
    # HW Thermal and Power Brake Slowdown are kinds of HW Slowdown: nvidia-smi -q nests them
    # under it and the HW Slowdown bit is set with either.
    if mask & 0xC0:
        mask |= 0x8
    return mask


def active(flag):
    return "Active" if flag else "Not Active"


def gpu_metrics(g):
    i = g["index"]
    cap = 400 if "A100-SXM" in g["name"] else 300
    return {"temp": 30 + i % 5, "power": 58 + i, "cap": cap}


def short_name(name):
    return name if len(name) <= 18 else name[:15] + "..."


def table(topo):
    lines = [time.strftime("%a %b %e %H:%M:%S %Y") + "       "]
    sep = "+-------------------------------+----------------------+----------------------+"
    full = "+-----------------------------------------------------------------------------+"
    lines.append(full)
    head = f"NVIDIA-SMI {DRIVER_VERSION}    Driver Version: {DRIVER_VERSION}    CUDA Version: {CUDA_VERSION}"
    lines.append("| " + head.ljust(76) + "|")
    lines.append("|-------------------------------+----------------------+----------------------+")
    lines.append("| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |")
    lines.append("| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |")
    lines.append("|                               |                      |               MIG M. |")
    lines.append("|===============================+======================+======================|")
    for g in topo["gpus"]:
        m = gpu_metrics(g)
        pm = "On" if persistence_enabled(g) else "Off"
        lines.append(
            f"| {g['index']:>3}  {short_name(g['name']):<18}  {pm:<4} | {g['bus_id']:<16} Off | {health(g)['ecc_uncorrectable']:>20} |"
        )
        lines.append(
            f"| N/A   {m['temp']:>2}C    P0   {m['power']:>3}W / {m['cap']:>3}W "
            f"| {0:>6}MiB / {g['memory_mib']:>5}MiB | {0:>6}%      Default |"
        )
        lines.append(f"| {'':<29} | {'':<20} | {'Disabled':>20} |")
        lines.append(sep)
    lines.append(" " * 79)
    lines.append(full)
    for text in (
        "Processes:",
        " GPU   GI   CI        PID   Type   Process name                  GPU Memory",
        "       ID   ID                                                   Usage     ",
    ):
        lines.append("| " + text.ljust(76) + "|")
    lines.append("|=============================================================================|")
    lines.append("|  No running processes found".ljust(78) + "|")
    lines.append(full)
    return "\n".join(lines) + "\n"


def list_gpus(topo):
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in topo["gpus"])


# name -> (canonical header, unit or None, value function)
def _fields(topo):
    count = len(topo["gpus"])
    return {
        "timestamp": ("timestamp", None, lambda g: time.strftime("%Y/%m/%d %H:%M:%S.000")),
        "driver_version": ("driver_version", None, lambda g: DRIVER_VERSION),
        "count": ("count", None, lambda g: str(count)),
        "index": ("index", None, lambda g: str(g["index"])),
        "name": ("name", None, lambda g: g["name"]),
        "gpu_name": ("name", None, lambda g: g["name"]),
        "uuid": ("uuid", None, lambda g: g["uuid"]),
        "gpu_uuid": ("uuid", None, lambda g: g["uuid"]),
        "serial": ("serial", None, lambda g: f"13201210{g['index']:05d}"),
        "pci.bus_id": ("pci.bus_id", None, lambda g: g["bus_id"]),
        "gpu_bus_id": ("pci.bus_id", None, lambda g: g["bus_id"]),
        "persistence_mode": (
            "persistence_mode",
            None,
            lambda g: "Enabled" if persistence_enabled(g) else "Disabled",
        ),
        "pstate": ("pstate", None, lambda g: "P0"),
        "vbios_version": ("vbios_version", None, lambda g: "92.00.36.00.01"),
        "compute_mode": ("compute_mode", None, lambda g: "Default"),
        "mig.mode.current": ("mig.mode.current", None, lambda g: "Disabled"),
        "ecc.mode.current": ("ecc.mode.current", None, lambda g: "Enabled"),
        "temperature.gpu": ("temperature.gpu", None, lambda g: str(gpu_metrics(g)["temp"])),
        "utilization.gpu": ("utilization.gpu [%]", "%", lambda g: "0"),
        "utilization.memory": ("utilization.memory [%]", "%", lambda g: "0"),
        "memory.total": ("memory.total [MiB]", "MiB", lambda g: str(g["memory_mib"])),
        "memory.used": ("memory.used [MiB]", "MiB", lambda g: "0"),
        "memory.free": ("memory.free [MiB]", "MiB", lambda g: str(g["memory_mib"])),
        "power.draw": ("power.draw [W]", "W", lambda g: f"{gpu_metrics(g)['power']:.2f}"),
        "power.limit": ("power.limit [W]", "W", lambda g: f"{gpu_metrics(g)['cap']:.2f}"),
        **_health_fields(),
    }


NA = "[N/A]"  # how CSV output shows a field the GPU does not support


def _retired(g, item):
    r = health(g)["retired"]
    if r is None:
        return NA
    return {"sbe": "0", "dbe": str(r[0]), "pending": "Yes" if r[1] else "No"}[item]


def _health_fields():
    ecc = ("ecc.errors.uncorrected.volatile", "ecc.errors.uncorrected.aggregate")
    fields = {}
    for prefix in ecc:
        fields[f"{prefix}.total"] = (f"{prefix}.total", None, lambda g: str(health(g)["ecc_uncorrectable"]))
        fields[f"{prefix}.dram"] = (f"{prefix}.dram", None, lambda g: str(health(g)["ecc_uncorrectable"]))
        fields[f"{prefix}.sram"] = (f"{prefix}.sram", None, lambda g: "0")
    for name, item in (
        ("retired_pages.single_bit_ecc.count", "sbe"),
        ("retired_pages.double_bit.count", "dbe"),
        ("retired_pages.pending", "pending"),
    ):
        fields[name] = (name, None, lambda g, item=item: _retired(g, item))
    fields["retired_pages.sbe"] = fields["retired_pages.single_bit_ecc.count"]
    fields["retired_pages.dbe"] = fields["retired_pages.double_bit.count"]
    base = "clocks_throttle_reasons"
    fields[f"{base}.active"] = (f"{base}.active", None, lambda g: f"0x{throttle_mask(health(g)):016x}")
    for reason, bit in THROTTLE_BITS.items():
        fields[f"{base}.{reason}"] = (
            f"{base}.{reason}",
            None,
            lambda g, bit=bit: active(throttle_mask(health(g)) & bit),
        )
    fields["pcie.link.gen.current"] = ("pcie.link.gen.current", None, lambda g: str(health(g)["pcie_gen"]))
    fields["pcie.link.gen.max"] = ("pcie.link.gen.max", None, lambda g: str(health(g)["pcie_gen_max"]))
    fields["pcie.link.width.current"] = (
        "pcie.link.width.current",
        None,
        lambda g: str(health(g)["pcie_width"]),
    )
    fields["pcie.link.width.max"] = ("pcie.link.width.max", None, lambda g: "16")
    return fields


def _remap(g, item):
    r = health(g)["remap"]
    if r is None:
        return NA
    return {
        "correctable": "0",
        "uncorrectable": str(int(r[0] or r[1])),
        "pending": str(int(r[0])),
        "failure": str(int(r[1])),
    }[item]


# --query-remapped-rows: what NVML's nvmlDeviceGetRemappedRows returns (counts, 0/1 flags).
def _remap_fields():
    fields = {
        "gpu_bus_id": ("gpu_bus_id", None, lambda g: g["bus_id"]),
        "gpu_uuid": ("gpu_uuid", None, lambda g: g["uuid"]),
    }
    for item in ("correctable", "uncorrectable", "pending", "failure"):
        name = f"remapped_rows.{item}"
        fields[name] = (name, None, lambda g, item=item: _remap(g, item))
    return fields


def query(topo, fields_arg, fmt_arg, ids, fields=None):
    fields = fields or _fields(topo)
    names = [f.strip() for f in fields_arg.split(",") if f.strip()]
    if not names:
        return EXIT_INVALID_ARG, "", MSG_INVALID
    for name in names:
        if name not in fields:
            return EXIT_INVALID_ARG, "", f'Field "{name}" is not a valid field to query.\n\n'
    opts = [o.strip() for o in fmt_arg.split(",")]
    if "csv" not in opts:
        return EXIT_INVALID_ARG, "", f'"{fmt_arg}" is not a valid format.\n'
    for o in opts:
        if o not in ("csv", "noheader", "nounits"):
            return EXIT_INVALID_ARG, "", f'"{o}" is not a valid format option.\n'
    gpus = select(topo, ids)
    if isinstance(gpus, tuple):
        return gpus
    out = []
    if "noheader" not in opts:
        out.append(", ".join(fields[n][0] for n in names))
    for g in gpus:
        cells = []
        for n in names:
            _, unit, fn = fields[n]
            value = fn(g)
            cells.append(value if unit is None or "nounits" in opts else f"{value} {unit}")
        out.append(", ".join(cells))
    return 0, "".join(line + "\n" for line in out), ""


def select(topo, ids):
    if ids is None:
        return topo["gpus"]
    chosen = []
    for raw_token in ids.split(","):
        token = raw_token.strip()
        match = [
            g
            for g in topo["gpus"]
            if token == str(g["index"]) or token == g["uuid"] or token.upper() == g["bus_id"]
        ]
        if not match:
            return EXIT_INVALID_ARG, "", f"No devices were found matching ID {token}\n"
        chosen.extend(match)
    return chosen


def topo_matrix(topo):
    names = [f"GPU{g['index']}" for g in topo["gpus"]] + topo["nics"]
    lines = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity"]
    for a, row_name in enumerate(names):
        cells = [" X " if label == "X" else label for label in topo["matrix"][a]]
        row = row_name + "\t" + "\t".join(cells)
        if a < len(topo["gpus"]):
            g = topo["gpus"][a]
            row += f"\t{g['cpu_affinity']}\t{g['numa_affinity']}"
        lines.append(row)
    return "\n".join(lines) + "\n" + LEGEND


def nvsmi_log(topo):
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"Timestamp                                 : {time.strftime('%a %b %e %H:%M:%S %Y')}",
        f"Driver Version                            : {DRIVER_VERSION}",
        f"CUDA Version                              : {CUDA_VERSION}",
        "",
        f"Attached GPUs                             : {len(topo['gpus'])}",
    ]
    for g in topo["gpus"]:
        out += [f"GPU {g['bus_id']}", *gpu_log(g), ""]
    return "\n".join(out) + "\n"


def _row(label, value="", indent=1):
    """One line of nvidia-smi -q: labels padded so that the colons line up at column 43."""
    text = "    " * indent + label
    return text if value == "" else f"{text.ljust(42)}: {value}"


def gpu_log(g):
    """The sections of one GPU in nvidia-smi -q, in its order and wording (driver 515/525:
    "Clocks Throttle Reasons"; 535 renamed it "Clocks Event Reasons"). A100 output of driver
    525.60.13: stas00/ml-engineering, compute/accelerator/nvidia/debug.md and the A100 node
    logs it links; V100 boards show "Remapped Rows : N/A" and A100 boards N/A retired pages."""
    h = health(g)
    mask = throttle_mask(h)
    ecc = h["ecc_uncorrectable"]
    lines = [
        _row("Product Name", g["name"]),
        _row("Persistence Mode", "Enabled" if persistence_enabled(g) else "Disabled"),
        _row("GPU UUID", g["uuid"]),
        _row("PCI"),
        _row("Bus Id", g["bus_id"], 2),
        _row("GPU Link Info", "", 2),
        _row("PCIe Generation", "", 3),
        _row("Max", h["pcie_gen_max"], 4),
        _row("Current", h["pcie_gen"], 4),
        _row("Link Width", "", 3),
        _row("Max", "16x", 4),
        _row("Current", f"{h['pcie_width']}x", 4),
        _row("Performance State", "P0"),
        _row("Clocks Throttle Reasons"),
        _row("Idle", "Not Active", 2),
        _row("Applications Clocks Setting", "Not Active", 2),
        _row("SW Power Cap", "Not Active", 2),
        _row("HW Slowdown", active(mask & 0x8), 2),
        _row("HW Thermal Slowdown", active(mask & 0x40), 3),
        _row("HW Power Brake Slowdown", active(mask & 0x80), 3),
        _row("Sync Boost", "Not Active", 2),
        _row("SW Thermal Slowdown", "Not Active", 2),
        _row("Display Clock Setting", "Not Active", 2),
        _row("FB Memory Usage"),
        _row("Total", f"{g['memory_mib']} MiB", 2),
        _row("Used", "0 MiB", 2),
        _row("Free", f"{g['memory_mib']} MiB", 2),
        _row("ECC Errors"),
        _row("Volatile", "", 2),
        _row("SRAM Correctable", 0, 3),
        _row("SRAM Uncorrectable", 0, 3),
        _row("DRAM Correctable", 0, 3),
        _row("DRAM Uncorrectable", ecc, 3),
        _row("Aggregate", "", 2),
        _row("SRAM Correctable", 0, 3),
        _row("SRAM Uncorrectable", 0, 3),
        _row("DRAM Correctable", 0, 3),
        _row("DRAM Uncorrectable", ecc, 3),
        _row("Retired Pages"),
    ]
    retired = h["retired"]
    lines += [
        _row("Single Bit ECC", 0 if retired else "N/A", 2),
        _row("Double Bit ECC", retired[0] if retired else "N/A", 2),
        _row("Pending Page Blacklist", ("Yes" if retired[1] else "No") if retired else "N/A", 2),
    ]
    remap = h["remap"]
    if remap is None:
        return [*lines, _row("Remapped Rows", "N/A")]
    return [
        *lines,
        _row("Remapped Rows"),
        _row("Correctable Error", 0, 2),
        _row("Uncorrectable Error", int(remap[0] or remap[1]), 2),
        _row("Pending", "Yes" if remap[0] else "No", 2),
        _row("Remapping Failure Occurred", "Yes" if remap[1] else "No", 2),
    ]


def set_persistence(topo, value, every_gpu):
    if value not in ("0", "1", "ENABLED", "DISABLED"):
        return EXIT_INVALID_ARG, "", MSG_INVALID
    if os.geteuid() != 0 and "DTLAB_STANDIN_RUN_DIR" not in os.environ:
        lines = [
            f"Unable to set persistence mode for GPU {g['bus_id']}: Insufficient Permissions\n"
            for g in topo["gpus"]
        ]
        return EXIT_NO_PERMISSION, "", "".join(lines)
    enable = value in ("1", "ENABLED")
    flag = os.path.join(RUN_DIR, PERSISTENCE_FILE)
    chosen = {g["bus_id"] for g in topo["gpus"]}
    current = persistence_on(every_gpu)
    on = current | chosen if enable else current - chosen
    if not on:
        if os.path.exists(flag):
            os.remove(flag)
    else:
        os.makedirs(RUN_DIR, exist_ok=True)
        every = {g["bus_id"] for g in every_gpu["gpus"]}
        with open(flag, "w") as f:
            f.write("" if on == every else "".join(b + "\n" for b in sorted(on)))
    word = "Enabled" if enable else "Disabled"
    return 0, "".join(f"{word} persistence mode for GPU {g['bus_id']}.\n" for g in topo["gpus"]), ""


def parse(argv):
    """-> (command, options) or None for an invalid combination."""
    opts = {}
    args = list(argv)
    positional = []
    while args:
        a = args.pop(0)
        key, eq, val = a.partition("=")
        if key in (
            "--query-gpu",
            "--query-remapped-rows",
            "--format",
            "-i",
            "--id",
            "-pm",
            "--persistence-mode",
        ):
            if not eq:
                if not args:
                    return None
                val = args.pop(0)
            opts[{"--id": "-i", "--persistence-mode": "-pm"}.get(key, key)] = val
        elif a in ("-L", "--list-gpus", "-q", "--query", "-h", "--help", "-m", "--matrix"):
            opts[{"--list-gpus": "-L", "--query": "-q", "--help": "-h", "--matrix": "-m"}.get(a, a)] = True
        elif not a.startswith("-"):
            positional.append(a)
        else:
            return None
    if positional == ["topo"]:
        return ("topo", opts) if opts.get("-m") and set(opts) <= {"-m"} else None
    if positional or opts.get("-m"):
        return None
    if opts.get("-h"):
        return "help", opts
    for option, command in (("--query-gpu", "query"), ("--query-remapped-rows", "remap")):
        if option in opts:
            if "--format" not in opts:
                return "noformat", opts
            return (command, opts) if set(opts) <= {option, "--format", "-i"} else None
    if "--format" in opts:
        return None
    if "-pm" in opts:
        return ("pm", opts) if set(opts) <= {"-pm", "-i"} else None
    if opts.get("-L"):
        return ("list", opts) if set(opts) <= {"-L", "-i"} else None
    if opts.get("-q"):
        return ("log", opts) if set(opts) <= {"-q", "-i"} else None
    return ("table", opts) if set(opts) <= {"-i"} else None


HELP = f"""NVIDIA System Management Interface -- v{DRIVER_VERSION}

NVSMI provides monitoring information for Tesla and select Quadro devices.

    -L,   --list-gpus       Display a list of GPUs connected to the system.
    -q,   --query           Display GPU or Unit info.
    -i,   --id=             Target a specific GPU.
    -pm,  --persistence-mode=  Set persistence mode: 0/DISABLED, 1/ENABLED
    --query-gpu=            Information about GPU. Call --help-query-gpu for more info.
    --format=               Comma separated list of format options: csv, noheader, nounits
    topo -m                 Display the GPUDirect communication matrix for the system.
"""


def main(argv):
    parsed = parse(argv)
    if parsed is None:
        sys.stdout.write(MSG_INVALID)
        return EXIT_INVALID_ARG
    command, opts = parsed
    if command == "help":
        sys.stdout.write(HELP)
        return 0
    if command == "noformat":
        option = "--query-gpu" if "--query-gpu" in opts else "--query-remapped-rows"
        sys.stdout.write(f'Option "--format" is required when "{option}" is used.\n' + MSG_INVALID)
        return EXIT_INVALID_ARG
    state = driver_state()
    if state is not None:
        code, message = state
        sys.stdout.write(message)
        return code
    try:
        topo = load_topology()
    except TopologyError as exc:
        sys.stderr.write(f"nvidia-smi (lab stand-in): invalid GPU topology: {exc}\n")
        return EXIT_OTHER
    if not topo["gpus"]:
        sys.stdout.write("No devices were found\n")
        return EXIT_NO_DEVICES
    if command == "topo":
        sys.stdout.write(topo_matrix(topo))
        return 0
    gpus = select(topo, opts.get("-i"))
    if isinstance(gpus, tuple):
        sys.stdout.write(gpus[2])
        return gpus[0]
    chosen = {**topo, "gpus": gpus}
    if command == "table":
        sys.stdout.write(table(chosen))
        return 0
    if command == "list":
        sys.stdout.write(list_gpus(chosen))
        return 0
    if command == "log":
        sys.stdout.write(nvsmi_log(chosen))
        return 0
    if command == "pm":
        code, out, err = set_persistence(chosen, opts["-pm"].upper(), topo)
    elif command == "remap":
        fields = _remap_fields()
        code, out, err = query(topo, opts["--query-remapped-rows"], opts["--format"], opts.get("-i"), fields)
    else:
        code, out, err = query(topo, opts["--query-gpu"], opts["--format"], opts.get("-i"))
    sys.stdout.write(out)
    sys.stdout.write(err)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
