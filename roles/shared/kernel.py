"""The running kernel, as the roles that build modules for it need it (a helper, no apply()).

headers: linux-headers-$(uname -r), what the NVIDIA driver's DKMS build and MLNX_OFED's
         --add-kernel-support build compile against. Neither vendor package depends on it:
         NVIDIA's driver installation guide says the deb "will install the latest version of
         these packages, which may or may not match the version of the kernel your system is
         using", and mlnx_add_kernel_support.sh only checks for /lib/modules/$(uname -r)/build.
hold:    the running kernel's packages and Ubuntu's kernel meta packages held (apt-mark hold),
         and unattended-upgrades told to leave them (Unattended-Upgrade::Package-Blacklist),
         because MLNX_OFED's --add-kernel-support modules are built for this one kernel,
         without DKMS: a new kernel would boot without them.
"""

from __future__ import annotations

import io
import re

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import KernelVersion
from pyinfra.operations import files

from deploy.facts.apt import HeldPackages
from deploy.gpu_node import UU_CONF, headers_package, hold_candidates, uu_blacklist_entries
from roles.shared.ops import DPKG_LOCK_TIMEOUT, fail, packages
from roles.shared.scripts import script

# `uname -r` as a package-name suffix: what Debian and Ubuntu kernels print (5.15.0-91-generic,
# 6.1.0-17-amd64). Anything else is refused before it reaches apt or a config file.
RELEASE = re.compile(r"[0-9][A-Za-z0-9.+_~-]*")
# The package names of a kernel's hold and UU_CONF: deploy/gpu_node.py (verify checks them).


def running_release() -> str:
    return (host.get_fact(KernelVersion) or "").strip()


def valid(release: str) -> bool:
    return RELEASE.fullmatch(release) is not None


def uu_blacklist(release: str) -> str:
    """An apt.conf.d file adding this kernel's packages and the metas to the blacklist.

    unattended-upgrades reads each entry as a Python regular expression matched against the
    package name; apt appends list entries from every file, so the distribution's own
    50unattended-upgrades entries stay."""
    lines = [
        "// Written by the gpu-cluster deploy (roles/shared/kernel.py). MLNX_OFED's modules are built",
        f"// for kernel {release} only; its packages are also held (apt-mark showhold).",
        "Unattended-Upgrade::Package-Blacklist {",
        *(f'    "{e}";' for e in uu_blacklist_entries(release)),
        "};",
    ]
    return "\n".join(lines) + "\n"


@operation()
def refuse(release: str):
    """Stop this host: `uname -r` is not a kernel release apt has packages for."""
    yield fail(
        f"uname -r says {release!r}: not a Debian/Ubuntu kernel release this deploy can install headers for"
    )


def install_headers(release: str):
    """linux-headers-<release> from the node's configured archives."""
    return packages([headers_package(release)], f"headers of the running kernel {release}")


@operation()
def hold_installed(candidates: list):
    """`apt-mark hold` those of `candidates` that are installed and not held yet."""
    installed = host.get_fact(DebPackages)
    held = host.get_fact(HeldPackages)
    todo = [p for p in candidates if p in installed and p not in held]
    if not todo:
        host.noop("the running kernel's packages are held")
        return
    yield script("shared/apt-mark-hold.sh", DPKG_LOCK_TIMEOUT, *todo)


def hold(release: str) -> None:
    """Hold the running kernel and keep unattended-upgrades away from it."""
    hold_installed(
        name=f"Hold kernel {release} and the kernel meta packages", candidates=hold_candidates(release)
    )
    files.put(
        name="unattended-upgrades leaves the kernel alone",
        src=io.StringIO(uu_blacklist(release)),
        dest=UU_CONF,
        mode="644",
    )
