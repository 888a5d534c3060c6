"""MLNX_OFED on every node, from the tarball cluster.yaml pins by URL and sha256.

skip:      when `ofed_info -s` already names the pinned release; openibd is then started if
           its unit failed (at boot)
download:  shared_ops.fetch_verified: sha256-checked before it takes the tarball's name; a
           mismatch deletes the download and stops this host (pyinfra's files.download would
           leave the unverified file in place)
install:   what the installer checks for and never installs itself (PREREQUISITES below),
           the running kernel's headers (roles/shared/kernel.py), then files/fabric/install.sh: unpack,
           `./mlnxofedinstall --without-fw-update --add-kernel-support --force`, its exit
           status explained, `/etc/init.d/openibd restart`, then `ofed_info -s` must name the
           pinned release; the unpacked tree and the tarball are removed after success
hold:      on every run, installed or not (the headers too): --add-kernel-support builds the modules for the
           running kernel without DKMS, so that kernel is held and unattended-upgrades told to
           leave it (roles/shared/kernel.py); docs/operations.md says how to move to a new kernel
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import systemd

from deploy.cluster import Cluster, Node
from deploy.facts.fabric import OfedRelease
from deploy.facts.system import UnitState
from deploy.pins import ofed_release
from roles.apt.pinsets import os_release
from roles.shared import kernel
from roles.shared.ops import DPKG_LOCK_TIMEOUT, fail, fetch_verified, packages
from roles.shared.scripts import script

WORK_DIR = "/var/cache/mlnx-ofed"
OPENIBD = "/etc/init.d/openibd"
OPENIBD_UNIT = "openibd.service"
# What the installer checks for before it builds and installs, on Ubuntu (deb) systems:
# - mlnxofedinstall's "Checking SW Requirements" (status 172 with an apt-get line):
#   python3 lsof pciutils ethtool;
# - mlnx_add_kernel_support.sh, which --add-kernel-support runs: `which apt-ftparchive` (the
#   script names the package: "'apt-utils' is not installed!"; it is apt-utils, not dpkg-dev)
#   and `which bzip2`, exit 1 when either is missing; lsb_release, by which it tells a deb
#   system from an rpm one (without it it takes the rpm path and fails);
# - the `install.pl --kernel-only --build-only --without-dkms --check-deps-only` it runs
#   (MLNX_OFED_SRC-5.9-0.5.6.0/install.pl, the closest published to 5.8): @required_debs
#   autotools-dev autoconf automake m4 debhelper chrpath swig graphviz libltdl-dev
#   build-essential (its dpatch is left out: Debian and Ubuntu no longer ship it), libelf-dev
#   for kernels built with ORC unwinding (Ubuntu's are), the kernel packages' build needs
#   quilt make gcc pkg-config dh-autoreconf and their install needs kmod perl procps, and
#   $kernel_sources/scripts, i.e. linux-headers-$(uname -r) (roles/shared/kernel.py).
PREREQUISITES = [
    "python3",
    "lsof",
    "pciutils",
    "ethtool",
    "apt-utils",
    "bzip2",
    "lsb-release",
    "autotools-dev",
    "autoconf",
    "automake",
    "m4",
    "debhelper",
    "chrpath",
    "swig",
    "graphviz",
    "libltdl-dev",
    "build-essential",
    "libelf-dev",
    "quilt",
    "make",
    "gcc",
    "pkg-config",
    "dh-autoreconf",
    "kmod",
    "perl",
    "procps",
]


def tarball_name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def unpacked_dir(tarball: str) -> str:
    """MLNX_OFED_LINUX-5.8-3.0.7.0-ubuntu20.04-x86_64.tgz unpacks into the same name."""
    for suffix in (".tgz", ".tar.gz"):
        if tarball.endswith(suffix):
            return tarball[: -len(suffix)]
    raise ValueError(f"{tarball}: an MLNX_OFED tarball ends with .tgz")


# Custom operations: both skip on the OfedRelease fact, which pyinfra does not have, and
# files.download keeps a file that fails its sha256 check.


@operation()
def verified_tarball(url: str, sha256: str | None, dest: str, release: str):
    """dest holds the tarball with the pinned sha256 (skipped once `release` is installed)."""
    if host.get_fact(OfedRelease) == release:
        host.noop(f"{release} is installed")
        return
    if sha256 is None:  # pins per distro, none for this node's: nothing is fetched unpinned
        yield fail(
            f"sources.mofed_tarball.sha256 has no pin for {tarball_name(url)}: add this node's "
            "distro to it (sha256sum FILE); nothing is installed unpinned"
        )
        return
    if (host.get_fact(Sha256File, path=dest) or "").lower() == sha256.lower():
        host.noop(f"{dest} is the pinned tarball")
        return
    yield fetch_verified(url, dest, artifact=tarball_name(url), sha256=sha256)


@operation()
def install(tarball: str, release: str, work_dir: str = WORK_DIR, openibd: str = OPENIBD):
    """files/fabric/install.sh, unless `ofed_info -s` already names `release`."""
    if host.get_fact(OfedRelease) == release:
        host.noop(f"{release} is installed")
        return
    top = unpacked_dir(tarball_name(tarball))
    yield script("fabric/install.sh", tarball, work_dir, top, release, openibd, DPKG_LOCK_TIMEOUT)


@deploy("MLNX_OFED")
def apply(cluster: Cluster, node: Node) -> None:
    release = ofed_release(cluster.versions.mofed)
    running = kernel.running_release()
    if not kernel.valid(running):
        kernel.refuse(name="The running kernel has a release apt knows", release=running)
        return
    # Also where MLNX_OFED is in place: the held kernel keeps the build tree it was built with.
    kernel.install_headers(running)
    if host.get_fact(OfedRelease) == release:
        host.noop(f"MLNX_OFED: ofed_info -s says {release}")
        # An openibd that failed (at boot: the 32-node bench met it) leaves the node without
        # the fabric's modules and /dev/infiniband: a re-run starts it. Only a failed one: after
        # an install (install.sh runs the init script itself) the unit is inactive until the
        # next boot, with the modules loaded. Start, not restart, which MLNX_OFED's unit
        # refuses (RefuseManualStop=true).
        if host.get_fact(UnitState, unit=OPENIBD_UNIT)[0] == "failed":
            systemd.service(name="openibd is active", service=OPENIBD_UNIT, running=True)
        kernel.hold(running)
        return
    distribution = host.get_fact(LinuxDistribution)
    os_id, os_version = os_release(distribution)
    url = cluster.sources.mofed_url_for(os_id, os_version, cluster.versions.mofed)
    tarball = f"{WORK_DIR}/{tarball_name(url)}"
    verified_tarball(
        name=f"Download {tarball_name(url)} (sha256 checked)",
        url=url,
        sha256=cluster.sources.mofed_sha256_for(os_id, os_version),
        dest=tarball,
        release=release,
    )
    packages(PREREQUISITES, "MLNX_OFED prerequisites")
    install(name=f"Install {release} and restart openibd", tarball=tarball, release=release)
    kernel.hold(running)
