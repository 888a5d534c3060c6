"""The NVIDIA driver on GPU nodes, from NVIDIA's CUDA apt repository, pinned and held.

install:   linux-headers-$(uname -r) first (roles/shared/kernel.py: nvidia-dkms-<branch>'s DKMS build
           compiles against it and no driver package depends on it), then
           cuda-drivers-<branch>=<version>-1 and the driver's whole package set at its exact
           NVIDIA versions, without Recommends (deploy/pins.py), preferences + apt-mark hold
           (roles/apt/cuda_repo.py)
configure: nouveau blacklisted; the initramfs rebuilt when that file changed (if the node
           has update-initramfs at all)
activate:  a reboot when the driver packages changed (reboot: auto), confirmed by a new
           /proc/sys/kernel/random/boot_id and nvidia-smi; a unit wanted at boot (BOOT_UNITS)
           that failed during that boot is started once more, and fails the host if it fails
           again; with reboot: never, a warning that one is pending
guard:     while the master runs trials on the node (deploy/training.py), a reboot it would
           take stops the host instead, naming them; the reboot stays owed (below) for the
           deploy after the node is drained (or accepted with --data disruptive=yes)

A reboot still owed from an interrupted run is remembered the Debian way, in
/run/reboot-required(.pkgs), written just before the driver packages are installed: /run is
empty again after a reboot, so the next deploy reboots only if the previous one did not get
to it, wherever it stopped after the install.
"""

from __future__ import annotations

import shlex
import time
from typing import cast

from paramiko import SSHException
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.connectors.util import clear_askpass_cache, remove_any_sudo_askpass_file
from pyinfra.facts.files import FileContents
from pyinfra.operations import files, python, server

from deploy.cluster import Cluster, Node
from deploy.pins import driver_pins
from deploy.training import IDLE, Busy
from roles.apt import cuda_repo as apt_pins
from roles.fabric import mofed
from roles.shared import kernel
from roles.shared.guards import not_while_training
from roles.shared.scripts import script
from roles.shared.templates import files_path

BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
REBOOT_REQUIRED = "/run/reboot-required"
# What a GPU node needs from boot: MLNX_OFED's openibd (the SysV script's generated unit) for
# the fabric, and NVIDIA's persistence daemon (installed with the driver, at its version). Not
# the fabric manager: after a driver change it refuses the new driver until roles/nvidia/gpu_services.py
# installs its matching version and restarts it, later in the same run.
BOOT_UNITS = (mofed.OPENIBD_UNIT, "nvidia-persistenced.service")
BOOT_WAIT_SECONDS = 300

REBUILD_INITRAMFS = (
    "if command -v update-initramfs >/dev/null 2>&1; then update-initramfs -u; "
    "else echo 'update-initramfs not found: no initramfs to rebuild'; fi"
)


def driver_loaded_check(version: str, seconds: int = 60) -> StringCommand:
    """Wait for nvidia-smi to report `version` on every GPU, else fail with what nvidia-smi
    said: a reboot that did not load the new module stops this host here."""
    return script("nvidia/driver-loaded.sh", version, seconds)


def reboot_pending(pending_packages: set[str], driver_packages: list[str]) -> bool:
    """Did an earlier run install driver packages without the reboot that loads them?"""
    return any(p in pending_packages for p in driver_packages)


def mark_reboot_required_shell(packages: list[str]) -> str:
    names = "\n".join(packages) + "\n"
    return (
        f"printf %s {shlex.quote(names)} >> {REBOOT_REQUIRED}.pkgs && "
        f"echo '*** System restart required ***' > {REBOOT_REQUIRED}"
    )


def _boot_id(host) -> str | None:
    try:
        ok, output = host.run_shell_command(StringCommand("cat", BOOT_ID))
    except (OSError, EOFError, SSHException):  # the connection of a node going down
        return None
    value = output.stdout.strip() if ok else ""
    return value or None


@operation(is_idempotent=False)
def reboot(delay: int = 5, interval: int = 2, timeout: int = 900):
    """Reboot and wait until the node answers with a new boot_id.

    pyinfra's server.reboot waits for a smaller uptime, which a container's /proc/uptime
    never shows; a new boot_id marks a new boot on real servers and containers alike.
    """
    before: list[str] = []

    def record_boot_id(state, host):
        boot_id = _boot_id(host)
        if boot_id is None:
            host.log_styled(f"cannot read {BOOT_ID}: not rebooting", fg="red", log_func=logger.error)
            return False
        before.append(boot_id)
        # As server.reboot does: a sudo askpass file would not survive the reboot.
        remove_any_sudo_askpass_file(host)
        return True

    def wait_for_new_boot(state, host):
        time.sleep(delay)
        clear_askpass_cache(host)
        host.disconnect()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            host.connect(show_errors=False)
            if host.connected:
                boot_id = _boot_id(host)
                if boot_id and boot_id != before[0]:
                    host.log_styled("rebooted (new boot_id)", fg="green", log_func=logger.info)
                    return True
                # Still the old boot (shutting down), or not answering yet: start afresh.
                host.disconnect()
            time.sleep(interval)
        host.log_styled(
            f"did not come back with a new boot_id within {timeout}s after the reboot",
            fg="red",
            log_func=logger.error,
        )
        return False

    yield FunctionCommand(record_boot_id, (), {})
    # Detached, so the SSH channel closes before the node goes down.
    yield StringCommand("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")
    yield FunctionCommand(wait_for_new_boot, (), {})


def _warn_reboot_pending(state, host):
    host.log_styled(
        "the NVIDIA driver changed and cluster.yaml says reboot: never: REBOOT THIS NODE "
        "before using its GPUs (the old kernel module stays loaded until then)",
        fg="yellow",
        log_func=logger.warning,
    )
    return True


@deploy("NVIDIA driver")
def apply(cluster: Cluster, node: Node, busy: Busy = IDLE) -> None:
    # Long: the driver's operations in the order they run (repo, pins, hold, DKMS check, reboot):
    # the role reads as its plan
    pinset = driver_pins(cluster.versions.nvidia_driver)
    packages = [p for p, _ in pinset.packages]

    running = kernel.running_release()
    if not kernel.valid(running):
        kernel.refuse(name="The running kernel has a release apt knows", release=running)
        return
    kernel.install_headers(running)

    # @deploy's typing gives every deploy an OperationMeta result; cuda_repo returns a Repo.
    repo = cast(apt_pins.Repo, apt_pins.cuda_repo(cluster=cluster))
    blacklist = files.put(
        name="Blacklist nouveau",
        src=str(files_path("nvidia/blacklist-nouveau.conf")),
        dest=BLACKLIST,
        mode="644",
    )
    # Remembered before the install, not after it: a run that stops between the two (a hold
    # that fails, a lost connection) still leaves the next run the reboot it owes.
    installed = apt_pins.pinned(
        pinset=pinset,
        repo=repo,
        before_install=lambda: server.shell(
            name="Remember that the new driver needs a reboot",
            commands=[mark_reboot_required_shell(packages)],
        ),
    )
    server.shell(
        name="Rebuild the initramfs without nouveau",
        commands=[REBUILD_INITRAMFS],
        _if=blacklist.did_change,
    )

    # Read while planning, i.e. before this run installs anything: a reboot an earlier run
    # owed (installed, then stopped before rebooting). None when the file does not exist.
    listed = host.get_fact(FileContents, path=f"{REBOOT_REQUIRED}.pkgs") or []
    owed = reboot_pending({line.strip() for line in listed}, packages)
    if cluster.reboot == "auto":
        if busy.guarded:
            not_while_training(
                name="No reboot while trials run here",
                refusal=busy.refusal("rebooting into the new NVIDIA driver"),
                _if=lambda: owed or installed.did_change(),
            )
        rebooted = reboot(
            name="Reboot into the new NVIDIA driver (confirmed by a new boot_id)",
            _if=lambda: owed or installed.did_change(),
        )
        server.shell(
            name="The new driver is loaded: nvidia-smi answers with the pin",
            commands=[str(driver_loaded_check(cluster.versions.nvidia_driver))],
            _if=rebooted.did_change,
        )
        server.shell(
            name="The units wanted at boot came up (one that failed is started once more)",
            commands=[str(script("nvidia/boot-units.sh", BOOT_WAIT_SECONDS, *BOOT_UNITS))],
            _if=rebooted.did_change,
        )
    else:
        if owed:
            logger.warning(
                f"{host.print_prefix}a reboot is pending for the NVIDIA driver "
                "(cluster.yaml says reboot: never)"
            )
        python.call(
            name="Warn that a reboot is pending (reboot: never)",
            function=_warn_reboot_pending,
            _if=installed.did_change,
        )
