"""The GPUs as nvidia-smi reports them; parsing and grouping live in deploy/topology.py.

`pyinfra INVENTORY fact deploy.facts.gpu.GpuTopology` prints a node's matrix and domains.
"""

from __future__ import annotations

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from deploy.topology import UNAVAILABLE, Topology, TopologyError, parse_mig_modes, parse_topo


class GpuTopology(FactBase):
    """`nvidia-smi topo -m` of the host as a Topology.

    Without output (nvidia-smi missing) pyinfra returns `default()`: status UNAVAILABLE.
    A driver that is not loaded yet (first deploy, before the reboot) is UNAVAILABLE with
    nvidia-smi's message in `detail`; a node without GPUs is NO_DEVICES.
    """

    def command(self):
        return "nvidia-smi topo -m 2>/dev/null || true"

    @staticmethod
    def default():
        return Topology(status=UNAVAILABLE, detail="nvidia-smi printed nothing (not installed?)")

    def process(self, output):
        try:
            return parse_topo("\n".join(output))
        except TopologyError as exc:
            raise FactProcessError(f"nvidia-smi topo -m: {exc}") from None


class GpuMigModes(FactBase):
    """{gpu index: "Enabled" | "Disabled" | "N/A"}; {} without a working nvidia-smi."""

    def command(self):
        return "nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader 2>/dev/null || true"

    @staticmethod
    def default():
        return {}

    def process(self, output):
        return parse_mig_modes(output)
