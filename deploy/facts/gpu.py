"""The GPUs as nvidia-smi reports them; parsing and grouping live in deploy/topology.py.

`pyinfra INVENTORY fact deploy.facts.gpu.GpuTopology` prints a node's matrix and domains.
"""

from __future__ import annotations

import shlex

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


# NVSwitches are PCI devices of NVIDIA's vendor id with class 0x068000 ("bridge, other"): the
# test NVIDIA's go-nvlib (pkg/nvpci: PCINvSwitchClass) and NCCL (ncclDeviceType) make. It reads
# the hardware, so it answers before the driver is loaded (a first deploy plans before the
# driver's reboot), unlike /proc/driver/nvidia-nvswitch/devices, which the loaded driver fills.
NVIDIA_PCI_VENDOR = "0x10de"
NVSWITCH_PCI_CLASS = "0x068000"
PCI_DEVICES = "/sys/bus/pci/devices"


def parse_nvswitches(lines) -> list[str]:
    """`ADDRESS VENDOR CLASS` lines -> the sorted PCI addresses of NVIDIA NVSwitches."""
    found = []
    for line in lines:
        parts = line.split()
        if len(parts) != 3:
            continue
        address, vendor, pci_class = parts
        if vendor.lower() == NVIDIA_PCI_VENDOR and pci_class.lower() == NVSWITCH_PCI_CLASS:
            found.append(address)
    return sorted(found)


def nvswitch_command(devices: str = PCI_DEVICES) -> str:
    return (
        f"for d in {devices}/*; do "
        '[ -r "$d/vendor" ] && [ -r "$d/class" ] && echo "${d##*/} $(cat "$d/vendor") $(cat "$d/class")"; '
        "done; true"
    )


class NvSwitches(FactBase):
    """PCI addresses of the node's NVSwitches ([] on a node without any)."""

    def command(self):
        return nvswitch_command()

    @staticmethod
    def default():
        return []

    def process(self, output):
        return parse_nvswitches(output)


class GpuPersistence(FactBase):
    """{gpu index: "Enabled" | "Disabled"}; {} without a working nvidia-smi (driver not loaded)."""

    def command(self):
        return "nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader 2>/dev/null || true"

    @staticmethod
    def default():
        return {}

    def process(self, output):
        modes = {}
        for line in output:
            index, _, mode = line.partition(",")
            if index.strip().isdigit() and mode.strip():
                modes[int(index)] = mode.strip()
        return modes


class ModuleState(FactBase):
    """A kernel module's /sys/module/<name>/initstate: "live" once loaded, None when it is not.

    pyinfra's KernelModules (and server.modprobe) read /proc/modules; /sys/module/<name> is the
    kernel's own per-module entry (sysfs-module ABI: initstate is "live", "coming" or
    "going"), present wherever modules load, and the one verify reads as well.
    """

    def command(self, module: str):
        # Quoted although every caller passes a constant module name of the deploy's.
        return f"cat {shlex.quote(f'/sys/module/{module}/initstate')} 2>/dev/null || true"

    def process(self, output):
        state = "\n".join(output).strip()
        return state or None
