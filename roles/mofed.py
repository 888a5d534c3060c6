"""MLNX_OFED on every node, from the tarball cluster.yaml pins by URL and sha256.

skip:      when `ofed_info -s` already names the pinned release
download:  shared_ops.fetch_verified: sha256-checked before it takes the tarball's name; a
           mismatch deletes the download and stops this host (pyinfra's files.download would
           leave the unverified file in place)
install:   the packages mlnxofedinstall checks for (python3, lsof, pciutils, ethtool), then
           files/mofed/install.sh: unpack, `./mlnxofedinstall --without-fw-update
           --add-kernel-support --force`, its exit status explained, `/etc/init.d/openibd
           restart`, then `ofed_info -s` must name the pinned release; the unpacked tree and the
           tarball are removed after success
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import LinuxDistribution

from deploy.cluster import Cluster, Node
from deploy.facts.fabric import OfedRelease
from deploy.pins import ofed_release
from roles.apt_pinsets import os_release
from roles.scripts import script
from roles.shared_ops import fetch_verified, packages

WORK_DIR = "/var/cache/mlnx-ofed"
OPENIBD = "/etc/init.d/openibd"
# What mlnxofedinstall's "Checking SW Requirements" asks for on every distribution; without
# them it stops with status 172 and an apt-get line to run.
PREREQUISITES = ["python3", "lsof", "pciutils", "ethtool"]


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
def verified_tarball(url: str, sha256: str, dest: str, release: str):
    """dest holds the tarball with the pinned sha256 (skipped once `release` is installed)."""
    if host.get_fact(OfedRelease) == release:
        host.noop(f"{release} is installed")
        return
    if (host.get_fact(Sha256File, path=dest) or "").lower() == sha256.lower():
        host.noop(f"{dest} is the pinned tarball")
        return
    yield fetch_verified(url, dest, artifact=tarball_name(url), sha256=sha256)


@operation()
def install(tarball: str, release: str, work_dir: str = WORK_DIR, openibd: str = OPENIBD):
    """files/mofed/install.sh, unless `ofed_info -s` already names `release`."""
    if host.get_fact(OfedRelease) == release:
        host.noop(f"{release} is installed")
        return
    top = unpacked_dir(tarball_name(tarball))
    yield script("mofed/install.sh", tarball, work_dir, top, release, openibd)


@deploy("MLNX_OFED")
def apply(cluster: Cluster, node: Node) -> None:
    release = ofed_release(cluster.versions.mofed)
    if host.get_fact(OfedRelease) == release:
        host.noop(f"MLNX_OFED: ofed_info -s says {release}")
        return
    distribution = host.get_fact(LinuxDistribution)
    os_id, os_version = os_release(distribution)
    url = cluster.sources.mofed_url_for(os_id, os_version, cluster.versions.mofed)
    tarball = f"{WORK_DIR}/{tarball_name(url)}"
    verified_tarball(
        name=f"Download {tarball_name(url)} (sha256 checked)",
        url=url,
        sha256=cluster.sources.mofed_tarball.sha256,
        dest=tarball,
        release=release,
    )
    packages(PREREQUISITES, "MLNX_OFED prerequisites")
    install(name=f"Install {release} and restart openibd", tarball=tarball, release=release)
