"""MLNX_OFED on every node, from the tarball cluster.yaml pins by URL and sha256.

skip:      when `ofed_info -s` already names the pinned release
download:  to a temporary name beside the destination, sha256-checked, then renamed; a
           mismatch deletes the download and stops this host (pyinfra's files.download would
           leave the unverified file in place)
install:   the packages mlnxofedinstall checks for (python3, lsof, pciutils, ethtool);
           unpack, `./mlnxofedinstall --without-fw-update --add-kernel-support --force`,
           its exit status explained, `/etc/init.d/openibd restart`, then `ofed_info -s` must name
           the pinned release; the unpacked tree and the tarball are removed after success
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import LinuxDistribution

from deploy.facts_gpu import OfedRelease
from deploy.pins import ofed_release
from roles.apt_pins import fetch_shell, os_release
from roles.shared_ops import packages

WORK_DIR = "/var/cache/mlnx-ofed"
OPENIBD = "/etc/init.d/openibd"
# What mlnxofedinstall's "Checking SW Requirements" asks for on every distribution; without
# them it stops with status 172 and an apt-get line to run.
PREREQUISITES = ["python3", "lsof", "pciutils", "ethtool"]
INSTALL_ARGS = "--without-fw-update --add-kernel-support --force"

# mlnxofedinstall's exit statuses (MLNX_OFED user manual).
EXIT_STATUS = {
    0: "installed",
    1: "the installation failed",
    2: "no firmware was found for the adapter (the software itself is installed)",
    22: "invalid parameter",
    28: "not enough free disk space",
    171: "not applicable to this system (no supported adapter or OS?)",
    172: "prerequisites are not met (missing packages or kernel headers?)",
    173: "the mst driver failed to start",
}
# Statuses after which the software is in place; anything else stops the host.
INSTALLED_STATUSES = (0, 2)


def describe_exit(status: int) -> str:
    return EXIT_STATUS.get(status, f"unexpected exit status {status}")


def tarball_name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def unpacked_dir(tarball: str) -> str:
    """MLNX_OFED_LINUX-5.8-3.0.7.0-ubuntu20.04-x86_64.tgz unpacks into the same name."""
    for suffix in (".tgz", ".tar.gz"):
        if tarball.endswith(suffix):
            return tarball[: -len(suffix)]
    raise ValueError(f"{tarball}: an MLNX_OFED tarball ends with .tgz")


def download_shell(url: str, sha256: str, dest: str) -> str:
    """Download url to dest only if its sha256 is `sha256`; otherwise leave no file behind."""
    artifact = tarball_name(url)
    sha256 = sha256.lower()
    part = f"{dest}.part"
    d, p = shlex.quote(dest), shlex.quote(part)
    failed = shlex.quote(f"{artifact}: download from {url} failed")
    mismatch = shlex.quote(f"{artifact}: sha256 mismatch (downloaded from {url}): expected {sha256}, got ")
    return (
        f"mkdir -p {shlex.quote(dest.rsplit('/', 1)[0] or '/')} && rm -f {d} {p}; "
        f"({fetch_shell(url, part)}) || {{ rm -f {p}; echo {failed} >&2; exit 1; }}; "
        f"actual=$(sha256sum {p} | cut -d' ' -f1); "
        f'if [ "$actual" != {shlex.quote(sha256)} ]; then rm -f {p}; '
        f"echo {mismatch}\"$actual\"'; the download was deleted' >&2; exit 1; fi; "
        f"mv -f {p} {d}"
    )


def exit_status_case(release: str) -> str:
    """A shell `case` on $rc: explains mlnxofedinstall's status, exits 1 unless installed."""
    arms = []
    for status, meaning in EXIT_STATUS.items():
        text = shlex.quote(f"{release}: mlnxofedinstall exited {status}: {meaning}")
        if status == 0:
            arms.append("0) ;;")
        elif status in INSTALLED_STATUSES:
            arms.append(f"{status}) echo {text} >&2 ;;")
        else:
            arms.append(f"{status}) echo {text} >&2; exit 1 ;;")
    other = shlex.quote(f"{release}: mlnxofedinstall exited ")
    arms.append(f"*) echo {other}\"$rc\"': unexpected exit status' >&2; exit 1 ;;")
    return 'case "$rc" in ' + " ".join(arms) + " esac"


def install_shell(tarball: str, work_dir: str, release: str, openibd: str = OPENIBD) -> str:
    """Unpack, install, restart openibd and check `ofed_info -s` names `release`."""
    top = unpacked_dir(tarball.rsplit("/", 1)[-1])
    t, w = shlex.quote(tarball), shlex.quote(work_dir)
    tree = shlex.quote(f"{work_dir}/{top}")
    unpack_failed = shlex.quote(f"{release}: cannot unpack {tarball}")
    no_installer = shlex.quote(f"{release}: {tarball} holds no {top}/mlnxofedinstall")
    restart_failed = shlex.quote(f"{release}: {openibd} restart failed")
    wrong = shlex.quote(f"{release}: after the installation ofed_info -s says ")
    return (
        f"rm -rf {tree}; mkdir -p {w} || exit 1; "
        f"tar -xzf {t} -C {w} || {{ echo {unpack_failed} >&2; exit 1; }}; "
        f"[ -x {tree}/mlnxofedinstall ] || {{ echo {no_installer} >&2; exit 1; }}; "
        f"cd {tree} || exit 1; ./mlnxofedinstall {INSTALL_ARGS}; rc=$?; cd /; "
        f"{exit_status_case(release)}; "
        f"{shlex.quote(openibd)} restart || {{ echo {restart_failed} >&2; exit 1; }}; "
        f"now=$(ofed_info -s 2>/dev/null); "
        f'[ "$now" = {shlex.quote(release + ":")} ] || '
        f"{{ echo {wrong}\"'$now'\" >&2; exit 1; }}; "
        f"rm -rf {tree} {t}"
    )


@operation()
def verified_tarball(url: str, sha256: str, dest: str, release: str):
    """dest holds the tarball with the pinned sha256 (skipped once `release` is installed)."""
    if host.get_fact(OfedRelease) == release:
        host.noop(f"{release} is installed")
        return
    if (host.get_fact(Sha256File, path=dest) or "").lower() == sha256.lower():
        host.noop(f"{dest} is the pinned tarball")
        return
    yield StringCommand(download_shell(url, sha256, dest))


@operation()
def install(tarball: str, release: str):
    if host.get_fact(OfedRelease) == release:
        host.noop(f"{release} is installed")
        return
    yield StringCommand(install_shell(tarball, WORK_DIR, release))


@deploy("MLNX_OFED")
def apply():
    cluster = host.data.cluster
    release = ofed_release(cluster.versions.mofed)
    installed = host.get_fact(OfedRelease)
    if installed == release:
        host.noop(f"MLNX_OFED: ofed_info -s says {release}")
        return
    os_id, os_version = os_release(host.get_fact(LinuxDistribution))
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
