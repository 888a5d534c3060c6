"""Node classes: what an agent node's hardware is expected to be, per preset.

A preset fills every `hardware.*` key cluster.yaml does not write (this module,
`Hardware`); tests/verify/test_health.py checks the nodes against the result.

Sources of the numbers:
- GPU names are nvidia-smi's `name` field ("NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB").
- Memory is the board's nominal capacity in MiB; nvidia-smi's memory.total shows it or a
  little less, depending on the driver (A100 80 GB: 81920 MiB; A100 40 GB: 40960 or 40536 MiB;
  V100 32 GB: 32768 or 32510 MiB; V100 16 GB: 16384, 16160 or 16130 MiB): verify accepts
  GPU_MEMORY_TOLERANCE below it.
- The fabric: A100 SXM4 servers (DGX A100, HGX A100, Azure ND A100 v4) carry one ConnectX-6
  HDR port per GPU, 200 Gb/s at width 4X; V100 SXM2 servers (DGX-1V) carry four ConnectX-4/5
  EDR ports, 100 Gb/s at 4X.
- The bandwidth floors are Azure's for the same hardware (Azure/azurehpc-health-checks
  conf/nd96amsr_a100_v4.conf: check_cuda_bw 24 GB/s, check_nccl_allreduce 228 GB/s bus
  bandwidth on 8 GPUs, check_ib_bw_gdr 185 Gb/s; conf/nd40rs_v2.conf, 8 x V100 SXM2 32 GB:
  check_gpu_bw 10 GB/s, check_ib_bw_non_gdr 78 Gb/s). Azure runs no NCCL check on V100:
  100 GB/s is this toolkit's floor for a DGX-1V hybrid cube mesh (NVLink 2), not a vendor's.
"""

# No `from __future__ import annotations`: Hardware's keys are its annotations, read once
# (keys.specs), as in every section module of deploy/cluster.
import re
from dataclasses import dataclass
from typing import Annotated, Any

from deploy.cluster import checks
from deploy.cluster.checks import Check, check
from deploy.cluster.keys import Computed, Key, allowed, read
from deploy.cluster.reader import Map, Reader

GPU_MEMORY_TOLERANCE = 0.03

# ibstat's Rate values (Gb/s) and the link widths ibstatus prints ("200 Gb/sec (4X HDR)").
IB_RATES = (10, 14, 20, 25, 40, 50, 56, 100, 200, 400)
IB_WIDTHS = ("1X", "2X", "4X", "8X", "12X")

_A100 = {
    "gpu_count": 8,
    "ib_ports": 8,
    "ib_rate_gbps": 200,
    "ib_width": "4X",
    "host_device_gbps": 24.0,
    "nccl_busbw_gbps": 228.0,
    "ib_write_gbps": 185.0,
}
_V100 = {
    "gpu_count": 8,
    "ib_ports": 4,
    "ib_rate_gbps": 100,
    "ib_width": "4X",
    "host_device_gbps": 10.0,
    "nccl_busbw_gbps": 100.0,
    "ib_write_gbps": 78.0,
}

PRESETS: dict[str, dict] = {
    "a100-sxm4-80gb": {"gpu_model": "NVIDIA A100-SXM4-80GB", "gpu_memory_mib": 81920, **_A100},
    "a100-sxm4-40gb": {"gpu_model": "NVIDIA A100-SXM4-40GB", "gpu_memory_mib": 40960, **_A100},
    "v100-sxm2-32gb": {"gpu_model": "Tesla V100-SXM2-32GB", "gpu_memory_mib": 32768, **_V100},
    "v100-sxm2-16gb": {"gpu_model": "Tesla V100-SXM2-16GB", "gpu_memory_mib": 16384, **_V100},
}
PRESET_NAMES = tuple(PRESETS)
DEFAULT_PRESET = "a100-sxm4-80gb"


# --- checks of the hardware keys (deploy/cluster/checks.py's protocol) ---------------------


@check(", ".join(f"`{r}`" for r in IB_RATES))
def ib_rate(r: Reader, path: str, v: Any) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool) and v in IB_RATES:
        return v
    r.bad(
        path,
        v,
        "must be an InfiniBand port rate in Gb/s as ibstat shows it: " + ", ".join(map(str, IB_RATES)),
    )
    return None


@check("number from 0 to 50")
def tolerance_pct(r: Reader, path: str, v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 50:
        return float(v)
    r.bad(path, v, "must be a percentage from 0 to 50")
    return None


@check("GPU name as nvidia-smi prints it")
def gpu_name(r: Reader, path: str, v: Any) -> str | None:
    # nvidia-smi's names: "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3".
    if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._()/-]{0,95}", v):
        return v
    r.bad(path, v, "must be a GPU name as `nvidia-smi --query-gpu=name --format=csv` prints it")
    return None


def preset_key(check_: Check[Any], doc: str) -> Key:
    """A `hardware.*` key whose default is the preset's value (deploy/cluster/rules.py fills it)."""
    return Key(check_, Computed("from `preset`"), doc)


# The keys of `hardware` (a section of cluster.yaml, and a node's own): here beside their
# presets and checks: the section's module (model.py composes the sections).
@dataclass(frozen=True)
class Hardware:
    """What an agent node is expected to have (tests/verify/test_health.py checks it)."""

    preset: Annotated[
        str,
        Key(checks.choice(PRESET_NAMES), DEFAULT_PRESET, "fills each key below not written"),
    ]
    gpu_model: Annotated[str, preset_key(gpu_name, "every GPU's name, as `nvidia-smi -L` shows it")]
    gpu_count: Annotated[int, preset_key(checks.integer(0, 64), "the GPUs nvidia-smi lists")]
    gpu_memory_mib: Annotated[
        int, preset_key(checks.integer(1024), "each GPU's memory (MiB), less 3% at most")
    ]
    host_memory_gib: Annotated[
        float | None,
        Key(checks.number_at_least(1), None, "MemTotal (/proc/meminfo), GiB; unset: not checked"),
    ]
    host_memory_tolerance_pct: Annotated[
        float, Key(tolerance_pct, 3.0, "how far MemTotal may fall below `host_memory_gib`")
    ]
    cpu_count: Annotated[
        int | None, Key(checks.integer(1), None, "logical CPUs (`nproc`); unset: not checked")
    ]
    ib_ports: Annotated[
        int, preset_key(checks.integer(0, 64), "InfiniBand ports, each Active at rate and width")
    ]
    ib_rate_gbps: Annotated[int, preset_key(ib_rate, "each IB port's rate, ibstat's `Rate:`")]
    ib_width: Annotated[str, preset_key(checks.choice(IB_WIDTHS), "each IB port's width (ibstatus)")]
    host_device_gbps: Annotated[
        float, preset_key(checks.number_at_least(0), "`--hardware`: host<->GPU, GB/s")
    ]
    nccl_busbw_gbps: Annotated[float, preset_key(checks.number_at_least(0), "`--hardware`: all-reduce, GB/s")]
    ib_write_gbps: Annotated[float, preset_key(checks.number_at_least(0), "`--hardware`: ib_write_bw, Gb/s")]


@check("mapping of `hardware.*` keys")
def node_keys(r: Reader, path: str, v: Any) -> dict[str, Any] | None:
    """A node's own hardware keys, each checked as the cluster's are: {key: value} as written."""
    if not isinstance(v, dict):
        r.bad(path, v, "must be a mapping of hardware keys, like {preset: v100-sxm2-32gb, ib_ports: 4}")
        return None
    before = len(r.problems)
    m = Map(r, v, path, allowed(Hardware))
    values = read(m, Hardware)
    if len(r.problems) > before:
        return None
    return {k: values[k] for k in values if m.given(k)}
