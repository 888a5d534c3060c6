"""Root filesystems: one cached Debian 12 base, one overlay per node on top of it."""

import os
import shutil
import uuid
from pathlib import Path

from .paths import BASE_ROOTFS
from .shell import LabError, run
from .spec import LabNode

DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What a freshly installed bare server has; everything else is the deploy's job.
BASE_PACKAGES = "systemd,systemd-sysv,dbus,openssh-server,iproute2,python3,sudo,ca-certificates"


def ensure_base() -> bool:
    """Build the cached base once; True when it had to be built."""
    if (BASE_ROOTFS / "usr/lib/systemd/systemd").exists():
        return False
    if shutil.which("debootstrap") is None:
        raise LabError("debootstrap is missing: apt-get install -y debootstrap")
    tmp = BASE_ROOTFS.with_name(BASE_ROOTFS.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a half-built base from an interrupted run
    tmp.parent.mkdir(parents=True, exist_ok=True)
    run(
        "debootstrap",
        "--variant=minbase",
        f"--include={BASE_PACKAGES}",
        "bookworm",
        tmp,
        DEBIAN_MIRROR,
        timeout=1800,
    )
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
