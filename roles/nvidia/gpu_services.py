"""What the GPUs need running beside the driver, on agents: persistence, fabric manager, peermem.

persistence: nvidia-persistenced (nvidia-compute-utils-<branch>, in the driver's pin set)
           with NVIDIA's own override of the packaged unit's --no-persistence-mode
           (files/nvidia/nvidia-persistenced.conf), wanted by multi-user.target (the
           packaged unit has no [Install]: udev starts it, StopWhenUnneeded stops it), so
           persistence mode is on for every GPU after every boot.
           A GPU found with persistence off (`nvidia-smi -pm 0` by hand) is set on again.
fabric manager: on a node whose GPUs sit on NVSwitches (deploy/facts/gpu.py NvSwitches: NVIDIA
           PCI devices of class 0x068000), nvidia-fabricmanager-<branch> at exactly the
           driver's version (deploy/pins.py), pinned and held like the driver, enabled, running
           and ordered before the agents. Without it CUDA fails with error 802 (system not
           ready) while nvidia-smi looks healthy. A node without NVSwitches gets none: there the
           service exits 1 (NV_WARN_NOTHING_TO_DO).
With reboot: never and a new driver not loaded yet, the units are written and enabled but not
started: the reboot the driver waits for starts them.
peermem:   /etc/modules-load.d/nvidia-peermem.conf: GPUDirect RDMA's module loads at boot
           (MLNX_OFED is on every node, installed before the driver: deploy/site.py), and
           `modprobe nvidia-peermem` now when /sys/module/nvidia_peermem is not live: the
           file alone turns it on only at the next boot. Not while a new driver waits for its
           reboot: nvidia-peermem.ko is built for the new nvidia.ko, and inserting it beside
           the old one fails ("disagrees about version of symbol"); that boot loads it.
           A driver built before MLNX_OFED has an nvidia-peermem whose init fails with EINVAL
           (no peer-memory symbols at build time: NVIDIA's nvidia-peermem.c), and modprobe's
           "could not insert 'nvidia_peermem': Invalid argument" fails the host.
"""

from __future__ import annotations

from typing import cast

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents
from pyinfra.operations import apt, files, systemd
from pyinfra.operations.util import any_changed

from deploy.cluster import Cluster, Node
from deploy.facts.gpu import GpuPersistence, ModuleState, NvSwitches
from deploy.gpu_node import FABRICMANAGER, PEERMEM, PEERMEM_MODULE
from deploy.pins import driver_pins, fabricmanager_pins
from roles.apt import cuda_repo as apt_pins
from roles.apt.pinsets import not_at_pin
from roles.nvidia import driver as nvidia_driver
from roles.shared.ops import APT_LOCK_WAIT
from roles.shared.templates import files_path

PERSISTENCED = "nvidia-persistenced.service"
PERSISTENCED_DROP_IN = f"/etc/systemd/system/{PERSISTENCED}.d/10-persistence-mode.conf"
PERSISTENCED_WANTED = f"/etc/systemd/system/multi-user.target.wants/{PERSISTENCED}"
PERSISTENCED_UNIT = f"/lib/systemd/system/{PERSISTENCED}"
FABRICMANAGER_DROP_IN = f"/etc/systemd/system/{FABRICMANAGER}.d/10-before-agent.conf"


def persistence_off(modes: dict[int, str]) -> list[int]:
    """GPU indexes whose persistence mode is not Enabled."""
    return sorted(i for i, mode in modes.items() if mode != "Enabled")


@operation()
def persistence_on():
    """`nvidia-smi -pm 1` when a GPU reports persistence mode off. Read while planning: on a
    first deploy nvidia-smi has no driver yet and the daemon's start sets it instead."""
    off = persistence_off(host.get_fact(GpuPersistence))
    if not off:
        host.noop("persistence mode is on for every GPU nvidia-smi lists")
        return
    yield "nvidia-smi -pm 1"


@operation()
def module_loaded(module: str):
    """`modprobe MODULE` unless /sys/module/MODULE is live (deploy/facts/gpu.py ModuleState)."""
    if host.get_fact(ModuleState, module=module) == "live":
        host.noop(f"module {module} is loaded")
        return
    yield StringCommand("modprobe", QuoteString(module))


def driver_waits_for_reboot(cluster: Cluster) -> bool:
    """reboot: never, and the driver is installed by this run or by one whose reboot is owed:
    no daemon can start before that reboot (which starts them, being wanted at boot)."""
    if cluster.reboot != "never":
        return False  # the driver role reboots before these operations run
    pins = driver_pins(cluster.versions.nvidia_driver).as_dict()
    owed = host.get_fact(FileContents, path=f"{nvidia_driver.REBOOT_REQUIRED}.pkgs") or []
    return bool(not_at_pin(pins, host.get_fact(DebPackages))) or nvidia_driver.reboot_pending(
        {line.strip() for line in owed}, list(pins)
    )


def _persistence(start: bool) -> None:
    # nvidia-compute-utils-<branch> is in the driver's pin set (deploy/pins.py): it moves
    # with the driver, whose nvidia-driver-<branch> depends on its exact build.
    drop_in = files.put(
        name="nvidia-persistenced turns persistence mode on",
        src=str(files_path("nvidia/nvidia-persistenced.conf")),
        dest=PERSISTENCED_DROP_IN,
        mode="644",
    )
    wanted = files.link(
        name="nvidia-persistenced starts at every boot",
        path=PERSISTENCED_WANTED,
        target=PERSISTENCED_UNIT,
    )
    systemd.daemon_reload(name="Reload systemd for nvidia-persistenced", _if=any_changed(drop_in, wanted))
    if not start:
        return
    systemd.service(
        name="Restart nvidia-persistenced with persistence mode",
        service=PERSISTENCED,
        running=True,
        restarted=True,
        _if=drop_in.did_change,
    )
    systemd.service(name="nvidia-persistenced running", service=PERSISTENCED, running=True)
    persistence_on(name="Persistence mode on for every GPU")


def _fabric_manager(cluster: Cluster, start: bool) -> None:
    pinset = fabricmanager_pins(cluster.versions.nvidia_driver)
    if not host.get_fact(NvSwitches):
        apt.packages(
            name="No fabric manager on a node without NVSwitches",
            packages=[p for p, _ in pinset.packages],
            present=False,
            extra_uninstall_args=APT_LOCK_WAIT,
        )
        return
    # @deploy's typing gives every deploy an OperationMeta result; cuda_repo returns a Repo.
    repo = cast(apt_pins.Repo, apt_pins.cuda_repo(cluster=cluster))
    installed = apt_pins.pinned(pinset=pinset, repo=repo)
    drop_in = files.put(
        name="The fabric manager starts before the agents",
        src=str(files_path("nvidia/fabricmanager-before-agent.conf")),
        dest=FABRICMANAGER_DROP_IN,
        mode="644",
    )
    systemd.daemon_reload(name="Reload systemd for the fabric manager", _if=drop_in.did_change)
    if not start:  # enabled: the reboot the new driver waits for starts it
        systemd.service(name="Fabric manager enabled", service=FABRICMANAGER, enabled=True)
        return
    systemd.service(
        name="Restart the fabric manager at its new version",
        service=FABRICMANAGER,
        running=True,
        restarted=True,
        _if=installed.did_change,
    )
    systemd.service(
        name="Fabric manager enabled and running", service=FABRICMANAGER, running=True, enabled=True
    )


@deploy("GPU services: persistence mode, fabric manager, nvidia-peermem")
def apply(cluster: Cluster, node: Node) -> None:
    start = not driver_waits_for_reboot(cluster)
    _persistence(start)
    _fabric_manager(cluster, start)
    files.put(
        name="nvidia-peermem loads at boot (GPUDirect RDMA)",
        src=str(files_path("nvidia/nvidia-peermem.conf")),
        dest=PEERMEM,
        mode="644",
    )
    if start:
        module_loaded(name="nvidia-peermem loaded (GPUDirect RDMA)", module=PEERMEM_MODULE)
