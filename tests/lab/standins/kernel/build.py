# Builds a stand-in for Debian/Ubuntu's linux-headers-<uname -r> package, for the lab's kernel.
"""linux-headers-<release> for the kernel the lab nodes run, in a flat apt repo `kernel/`.

The lab nodes are containers on the controller's kernel, whose headers no Debian archive has.
On a real node linux-headers-$(uname -r) comes from the distribution's archive, which the node
already has configured; the lab puts this repo into every node's apt sources before boot
(tests/lab/rootfs.py: seed_kernel_archive), the same kind of setting as the Debian sources
debootstrap wrote. The package has the layout the installers look for: the build tree under
/usr/src/linux-headers-<release> (with scripts/, which MLNX_OFED's install.pl checks) and
/lib/modules/<release>/build pointing at it.
"""

from __future__ import annotations

import os

from tests.lab.debs import Symlink

REPO = "kernel"
ORIGIN = "dtlab"
LABEL = "Lab kernel headers"
KEYRING = "dtlab-archive-keyring.gpg"
NOTE = "\n This is a lab stand-in built by tests/lab for the controller's kernel; no kernel sources."


def release() -> str:
    return os.uname().release


def build(ctx) -> None:
    kernel = release()
    tree = f"/usr/src/linux-headers-{kernel}"
    repo = ctx.mirror_dir / REPO
    repo.mkdir(parents=True, exist_ok=True)
    ctx.build_deb(
        repo,
        f"linux-headers-{kernel}",
        # A Debian version must start with a digit, as a kernel release does.
        f"{kernel}-1" if kernel[:1].isdigit() else f"0~{kernel}-1",
        {
            f"{tree}/Makefile": (b"# lab stand-in: there is nothing to build against\n", 0o644),
            f"{tree}/scripts/README.lab": (b"Stand-in for the kernel's build scripts (lab only).\n", 0o644),
            f"/lib/modules/{kernel}/build": Symlink(tree),
        },
        description=f"Header files related to Linux kernel {kernel}{NOTE}",
        maintainer="DTLab <lab@dtlab.invalid>",
        extra_control={"Section": "kernel", "Priority": "optional"},
    )
    (repo / KEYRING).write_bytes(ctx.keyring)
    ctx.flat_repos.append((repo, ORIGIN, LABEL))
