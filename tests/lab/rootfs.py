"""Root filesystems: one cached Debian 12 base, one overlay per node on top of it."""

import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from .paths import BASE_ROOTFS
from .shell import LabError, run
from .spec import LabNode

DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What a freshly installed bare server has; everything else is the deploy's job.
BASE_PACKAGES = "systemd,systemd-sysv,dbus,openssh-server,iproute2,python3,sudo,ca-certificates"


def debootstrap(target: Path, attempts: int = 2, log=print) -> None:
    """debootstrap bookworm into `target`, once more after a failure.

    The archive (or the cache in front of it) can answer with a partial index: debootstrap
    then reports "Couldn't find these debs" for every package and exits 1, and the same run
    a moment later succeeds. A second failure is reported as it is.
    """
    for attempt in range(1, attempts + 1):
        try:
            run(
                "debootstrap",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                target,
                DEBIAN_MIRROR,
                timeout=1800,
            )
            return
        except LabError as exc:
            if attempt == attempts:
                raise
            log(f"debootstrap failed (attempt {attempt} of {attempts}), trying again: {exc}")
            shutil.rmtree(target, ignore_errors=True)


def ensure_base() -> bool:
    """Build the cached base once; True when it had to be built."""
    if (BASE_ROOTFS / "usr/lib/systemd/systemd").exists():
        return False
    if shutil.which("debootstrap") is None:
        raise LabError("debootstrap is missing: apt-get install -y debootstrap")
    tmp = BASE_ROOTFS.with_name(BASE_ROOTFS.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a half-built base from an interrupted run
    tmp.parent.mkdir(parents=True, exist_ok=True)
    debootstrap(tmp)
    # Every node gets its own identity; none may inherit the base's.
    for key in (tmp / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (tmp / "etc/machine-id").write_text("")
    (tmp / "etc/hostname").write_text("localhost\n")
    run("chroot", tmp, "apt-get", "clean")
    shutil.rmtree(BASE_ROOTFS, ignore_errors=True)
    tmp.rename(BASE_ROOTFS)
    return True


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def mount_node(node: LabNode) -> None:
    for sub in ("upper", "work", "root"):
        (node.dir / sub).mkdir(parents=True, exist_ok=True)
    if not is_mounted(node.root):
        opts = f"lowerdir={BASE_ROOTFS},upperdir={node.dir / 'upper'},workdir={node.dir / 'work'}"
        run("mount", "-t", "overlay", "overlay", "-o", opts, node.root)


def unmount_node(node: LabNode) -> None:
    if is_mounted(node.root):
        run("umount", node.root)


def wipe_node(node: LabNode) -> None:
    unmount_node(node)
    shutil.rmtree(node.dir, ignore_errors=True)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


# Lab only, for the machine running many nodes at once (the deploy does not know of it):
# - dpkg without an fsync per unpacked file (force-unsafe-io; dpkg(1): "can lose data on a
#   system crash"): a lab node dies with the controller, and every node's deploy unpacks some
#   thousands of files at once. Measured: a 4-node cold deploy on the bench's compressed btrfs
#   479.6 -> 269.7 s, on the lab's disk 218 -> 200 s; from 16 nodes the CPU decides (2-5 %).
# - no manual pages or documentation (what Ubuntu's minimal images exclude the same way,
#   copyrights kept): less to write and no man-db index run per package.
# - no .deb kept in /var/cache/apt/archives after an install (what Debian's container images
#   set): ~0.3 GB an agent; after its deploy an agent now takes 0.93 GB of overlay, 0.36 of Docker.
DPKG_TUNING = (
    "force-unsafe-io\n"
    "path-exclude=/usr/share/man/*\n"
    "path-exclude=/usr/share/doc/*\n"
    "path-include=/usr/share/doc/*/copyright\n"
)
APT_TUNING = 'APT::Keep-Downloaded-Packages "false";\n'


def write_package_tuning(root: Path) -> None:
    _write(root / "etc/dpkg/dpkg.cfg.d/dtlab-tuning", DPKG_TUNING)
    _write(root / "etc/apt/apt.conf.d/99dtlab-tuning", APT_TUNING)


# Lab only: a user's manager is never stopped once started (logind.conf(5) UserStopDelaySec=
# infinity). Once the deploy has pulled in libpam-systemd, every SSH session's pam_systemd
# starts user@0.service and logind stops it 10 s after root's last session ends (the default
# delay). In the lab's nested cgroup v1 setup that stop can fail to kill the unit's control
# group ("Failed to kill control group /user.slice/user-0.slice/user@0.service, ignoring:
# Input/output error"), wait out its stop timeout ("Processes still around after final
# SIGKILL. Entering failed mode"), and every session opened meanwhile waits in pam_systemd for
# the next start: sshd opens the PAM session before it serves a channel, so verify's probes
# met "Timeout opening channel" on healthy nodes. (Lingering would start the manager at boot,
# and fail it there while the base has no pam_systemd.)
LOGIND_TUNING_FILE = "etc/systemd/logind.conf.d/dtlab-tuning.conf"
LOGIND_TUNING = "[Login]\nUserStopDelaySec=infinity\n"


def write_session_tuning(root: Path) -> None:
    _write(root / LOGIND_TUNING_FILE, LOGIND_TUNING)


# Lab only: the node's kernel modules (tests/lab/standins/kernel/kmod.py): its own /sys/module
# from early boot, a modprobe ahead of kmod's in PATH for the stand-in drivers' modules, and
# what systemd-modules-load.service does on a real node (skipped in a container, which lacks
# CAP_SYS_MODULE).
KMOD = "usr/local/lib/dtlab/kmod.py"
KMOD_UNITS = {
    "dtlab-kmod.service": (
        "sysinit.target",
        "[Unit]\nDescription=Lab: this node's /sys/module\nDefaultDependencies=no\n"
        "After=local-fs.target\nBefore=sysinit.target\n\n"
        f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/usr/bin/python3 /{KMOD} setup\n"
        # The cgroup set-up failure (219/CGROUP) nvidia-module-load.service retries as well.
        "Restart=on-failure\nRestartSec=1\n\n[Install]\nWantedBy=sysinit.target\n",
    ),
    "dtlab-modules-load.service": (
        "multi-user.target",
        "[Unit]\nDescription=Lab: load the modules in modules-load.d\nDefaultDependencies=no\n"
        "After=local-fs.target dtlab-kmod.service\nBefore=multi-user.target\n\n"
        f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/usr/bin/python3 /{KMOD} modules-load\n"
        "Restart=on-failure\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n",
    ),
}


def write_lab_kernel(root: Path) -> None:
    from .standins.kernel import kmod

    _write(root / KMOD, Path(kmod.__file__).read_text(), 0o755)
    wrapper = f'#!/bin/sh\nexec /usr/bin/python3 /{KMOD} modprobe "$@"\n'
    _write(root / "usr/local/sbin/modprobe", wrapper, 0o755)
    for unit, (target, text) in KMOD_UNITS.items():
        _write(root / "etc/systemd/system" / unit, text)
        wants = root / "etc/systemd/system" / f"{target}.wants" / unit
        wants.parent.mkdir(parents=True, exist_ok=True)
        if not wants.is_symlink():
            wants.symlink_to(f"/etc/systemd/system/{unit}")


def seed_node(node: LabNode, public_key: str, lab_files: dict[str, str]) -> None:
    """Give a node what a freshly racked server has: a name, an identity, our SSH key."""
    root = node.root
    if not (root / "etc/ssh/ssh_host_ed25519_key").exists():
        run("ssh-keygen", "-q", "-A", "-f", root)
    if not (root / "etc/machine-id").read_text().strip():
        _write(root / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
        _write(root / "etc/hostname", node.hostname + "\n")
        # What the Debian installer writes; the deploy's managed block goes below it.
        _write(root / "etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{node.hostname}\n")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(ssh_dir / "authorized_keys", public_key, 0o600)
    for rel, text in lab_files.items():
        _write(root / "etc/dtlab" / rel, text)
    write_package_tuning(root)
    write_session_tuning(root)
    write_lab_kernel(root)
    # What the server has as delivered beyond the base (lab-hardware.yaml: `network: netplan`).
    from .nodes import preinstall

    preinstall(node)


def seed_kernel_archive(node: LabNode, base_url: str) -> None:
    """Point the node's apt at the mirror's `kernel/` repo (linux-headers-<uname -r>).

    What a real node has before the deploy: an archive (Ubuntu's) that carries the headers of
    the kernel it runs. The lab nodes run the controller's kernel, so the lab serves its
    headers package itself (tests/lab/standins/kernel/build.py). Written into running nodes
    too: the files are plain apt configuration, read at the next `apt-get update`.
    """
    from .paths import MIRROR
    from .standins.kernel.build import KEYRING, REPO

    keyring = MIRROR / REPO / KEYRING
    if not keyring.exists():
        raise LabError(f"{keyring} is missing: the lab mirror was not built")
    target = node.root / "usr/share/keyrings" / KEYRING
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(keyring.read_bytes())
    os.chmod(target, 0o644)
    _write(
        node.root / "etc/apt/sources.list.d/dtlab-kernel.list",
        f"deb [signed-by=/usr/share/keyrings/{KEYRING}] {base_url.rstrip('/')}/{REPO}/ /\n",
    )
    # Reached directly, also by an apt run told to use the lab's apt-cacher-ng (before boot).
    host = urlsplit(base_url).hostname
    _write(node.root / "etc/apt/apt.conf.d/50dtlab-kernel", f'Acquire::http::Proxy::{host} "DIRECT";\n')
