# Builds stand-ins for NVIDIA's MLNX_OFED_LINUX-5.8-3.0.7.0-<distro>-x86_64.tgz installer tarballs.
"""MLNX_OFED 5.8-3.0.7.0 tarballs for the lab mirror's `mofed/` folder.

Each tarball has NVIDIA's layout: a top folder named like the tarball holding mlnxofedinstall,
uninstall.sh, `distro`, `.mlnx`, `.arch` and DEBS/*.deb. The packages (same for every distro)
are ofed-scripts (ofed_info), mlnx-ofed-kernel-utils (/etc/init.d/openibd and
openibd.service), mlnx-ofed-kernel-dkms, infiniband-diags (ibstat, ibstatus, iblinkinfo, perfquery,
sminfo) and opensm (the subnet manager and its opensmd.service, not enabled by the package).
"""

from __future__ import annotations

from pathlib import Path

from tests.lab.network import IB_KERNEL_NAME, IB_PARKED
from tests.lab.standins import render_from, source

OFED_VERSION = "5.8-3.0.7.0"
OFED_BASE = "5.8-3.0.7"
SCRIPTS_VERSION = "5.8-OFED.5.8.3.0.7"
KERNEL_VERSION = "5.8-OFED.5.8.3.0.7.1"
DIAGS_VERSION = "58mlnx43-1.58307"
# MLNX_OFED 5.8's OpenSM: opensm_5.13.0.MLNX20221016.10d3954-0.1.<build>_amd64.deb in NVIDIA's
# mlnx_ofed/latest-5.8/ubuntu20.04 apt repository (build 58604 there, 5.8-6); this release's
# build number 58307 as its other packages carry it (DIAGS_VERSION). Inferred, not seen.
OPENSM_VERSION = "5.13.0.MLNX20221016.10d3954-0.1.58307"
MAINTAINER = "Mellanox Technologies <support@mellanox.com>"

# Distro -> kernels the prebuilt modules match (any other kernel needs --add-kernel-support).
DISTROS = {
    "ubuntu20.04": "5.4.0-26-generic",
    "ubuntu22.04": "5.15.0-25-generic",
    "debian12": "6.1.0-9-amd64",
}
PACKAGES = ("ofed-scripts", "mlnx-ofed-kernel-utils", "mlnx-ofed-kernel-dkms", "infiniband-diags", "opensm")
NOTE = "\n This is a lab stand-in built by tests/lab; it contains no NVIDIA/Mellanox software."

SUBS = {
    "OFED_VERSION": OFED_VERSION,
    "OFED_BASE": OFED_BASE,
    "SCRIPTS_VERSION": SCRIPTS_VERSION,
    "KERNEL_VERSION": KERNEL_VERSION,
    "DIAGS_VERSION": DIAGS_VERSION,
    "OPENSM_VERSION": OPENSM_VERSION,
    "PACKAGES": " ".join(PACKAGES),
    # openibd's ib_ipoib "load": the lab's parked fabric port gets the kernel's IPoIB name.
    "IB_PARKED": IB_PARKED,
    "IB_KERNEL_NAME": IB_KERNEL_NAME,
}

UTILS_POSTINST = """#!/bin/sh
# Stands in for mlnx-ofed-kernel-utils' postinst (openibd enabled at boot); lab only.
set -e
if [ "$1" = configure ] && command -v systemctl >/dev/null 2>&1; then
    systemctl ${DPKG_ROOT:+--root="$DPKG_ROOT"} enable openibd.service >/dev/null 2>&1 \\
        || systemctl ${DPKG_ROOT:+--root="$DPKG_ROOT"} enable openibd.service
fi
exit 0
"""
UTILS_PRERM = """#!/bin/sh
# Stands in for mlnx-ofed-kernel-utils' prerm; lab only.
set -e
if [ "$1" = remove ] && command -v systemctl >/dev/null 2>&1; then
    systemctl ${DPKG_ROOT:+--root="$DPKG_ROOT"} disable openibd.service >/dev/null 2>&1 || true
fi
exit 0
"""


def _script(name: str, extra: dict[str, str] | None = None) -> tuple[bytes, int]:
    return render_from(source(f"mofed/{name}"), {**SUBS, **(extra or {})}).encode(), 0o755


def build_debs(ctx, out_dir: Path) -> list[Path]:
    debs = [
        ctx.build_deb(
            out_dir,
            "ofed-scripts",
            SCRIPTS_VERSION,
            {
                "/usr/bin/ofed_info": _script("ofed_info.sh"),
                "/usr/sbin/ofed_uninstall.sh": _script("uninstall.sh"),
                "/etc/infiniband/info": (
                    "#!/bin/sh\n# Stands in for MLNX_OFED's /etc/infiniband/info (ofed-scripts); lab only.\n"
                    f"prefix=/usr\nofedversion={OFED_BASE}\n".encode(),
                    0o755,
                ),
            },
            description=f"MLNX_OFED utilities{NOTE}",
            maintainer=MAINTAINER,
            extra_control={"Section": "net"},
        ),
        ctx.build_deb(
            out_dir,
            "mlnx-ofed-kernel-utils",
            KERNEL_VERSION,
            {
                "/etc/init.d/openibd": _script("openibd.sh"),
                "/lib/systemd/system/openibd.service": (
                    source("mofed/openibd.service").encode(),
                    0o644,
                ),
                "/etc/infiniband/openib.conf": (source("mofed/openib.conf").encode(), 0o644),
            },
            depends=[f"ofed-scripts (>= {SCRIPTS_VERSION})"],
            conffiles=["/etc/infiniband/openib.conf", "/etc/init.d/openibd"],
            description=f"Userspace tools to restart and tune mlx5 and IPoIB{NOTE}",
            maintainer=MAINTAINER,
            extra_control={"Section": "kernel"},
            scripts={"postinst": UTILS_POSTINST, "prerm": UTILS_PRERM},
        ),
        ctx.build_deb(
            out_dir,
            "mlnx-ofed-kernel-dkms",
            KERNEL_VERSION,
            {
                f"/usr/src/mlnx-ofed-kernel-{OFED_BASE.rsplit('-', 1)[0]}/README.lab": (
                    b"Stand-in for the MLNX_OFED kernel module sources (lab only).\n",
                    0o644,
                )
            },
            arch="all",
            depends=[f"mlnx-ofed-kernel-utils (>= {KERNEL_VERSION})"],
            description=f"DKMS support for mlnx-ofed kernel modules{NOTE}",
            maintainer=MAINTAINER,
            extra_control={"Section": "kernel"},
        ),
        ctx.build_deb(
            out_dir,
            "infiniband-diags",
            DIAGS_VERSION,
            {
                f"/usr/sbin/{tool}": _script("ib_diags.py")
                for tool in ("ibstat", "ibstatus", "iblinkinfo", "perfquery", "sminfo")
            },
            depends=["python3"],
            description=f"InfiniBand diagnostic programs{NOTE}",
            maintainer=MAINTAINER,
            extra_control={"Section": "net"},
        ),
        ctx.build_deb(
            out_dir,
            "opensm",
            OPENSM_VERSION,
            {
                "/usr/sbin/opensm": _script("opensm.py"),
                "/lib/systemd/system/opensmd.service": (source("mofed/opensmd.service").encode(), 0o644),
            },
            depends=["python3", f"infiniband-diags (>= {DIAGS_VERSION})"],
            description=f"An Infiniband subnet manager{NOTE}",
            maintainer=MAINTAINER,
            extra_control={"Section": "net"},
        ),
    ]
    return debs


def build(ctx) -> None:
    debs = build_debs(ctx, ctx.work_dir / "mofed-debs")
    deb_members = {f"DEBS/{d.name}": (d.read_bytes(), 0o644) for d in debs}
    for distro, kernel in DISTROS.items():
        top = f"MLNX_OFED_LINUX-{OFED_VERSION}-{distro}-x86_64"
        installer = _script("mlnxofedinstall.py", {"DISTRO": distro, "SUPPORTED_KERNELS": kernel})
        members = {
            "mlnxofedinstall": installer,
            "uninstall.sh": _script("uninstall.sh"),
            "distro": (f"{distro}\n".encode(), 0o644),
            ".mlnx": (f"{OFED_VERSION}\n".encode(), 0o644),
            ".arch": (b"x86_64\n", 0o644),
            "LICENSE": (
                b"Lab stand-in for MLNX_OFED_LINUX, built by tests/lab. No vendor software.\n",
                0o644,
            ),
            **deb_members,
        }
        ctx.build_tgz(
            ctx.mirror_dir / "mofed" / f"{top}.tgz",
            {f"{top}/{name}": entry for name, entry in members.items()},
        )
