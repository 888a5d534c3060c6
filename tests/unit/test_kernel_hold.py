"""roles/shared/kernel.py on Ubuntu kernels the lab cannot boot: what is held, what apt reads.

MLNX_OFED's --add-kernel-support modules are built for the running kernel only, so its packages
and Ubuntu's kernel meta packages are held and kept away from unattended-upgrades. The
blacklist file is read back with the controller's apt-config (what unattended-upgrades asks
apt for) and its entries are matched with re.match, as unattended-upgrades matches them.
"""

import re
import shutil
import subprocess

import pytest

from roles.shared import kernel

FOCAL = "5.4.0-169-generic"
JAMMY = "5.15.0-91-generic"


@pytest.mark.parametrize("release", [FOCAL, JAMMY, "6.1.0-17-amd64"])
def test_release_is_valid(release):
    assert kernel.valid(release)
    assert kernel.headers_package(release) == f"linux-headers-{release}"


@pytest.mark.parametrize("release", ["", "5.15.0-91-generic; reboot", "$(id)", "-rf", "5.15 0"])
def test_odd_release_is_refused(release):
    assert not kernel.valid(release)


def test_hold_candidates_cover_the_build_and_the_metas():
    held = kernel.hold_candidates(JAMMY)
    for name in (
        f"linux-image-{JAMMY}",
        f"linux-headers-{JAMMY}",
        f"linux-modules-{JAMMY}",
        f"linux-modules-extra-{JAMMY}",
        "linux-generic",
        "linux-image-generic",
        "linux-headers-generic",
        "linux-generic-hwe-20.04",
        "linux-generic-hwe-22.04",
    ):
        assert name in held


def test_debian_kernel_metas_are_held_and_blacklisted():
    """Debian's metas pull a new ABI's kernel in as Ubuntu's do (linux-image-amd64 Depends on
    linux-image-<abi>-amd64): held and blacklisted too, and the next ABI's kernel is not."""
    bookworm = "6.1.0-17-amd64"
    held = kernel.hold_candidates(bookworm)
    for name in (
        f"linux-image-{bookworm}",
        "linux-image-amd64",
        "linux-headers-amd64",
        "linux-image-cloud-amd64",
    ):
        assert name in held and blacklisted(bookworm, name)
    assert not blacklisted(bookworm, "linux-image-6.1.0-18-amd64")


def blacklisted(release: str, package: str) -> bool:
    return any(re.match(e, package) for e in kernel.uu_blacklist_entries(release))


@pytest.mark.parametrize("release", [FOCAL, JAMMY])
def test_blacklist_matches_this_kernel_and_the_metas_only(release):
    assert blacklisted(release, f"linux-image-{release}")
    assert blacklisted(release, f"linux-headers-{release}")
    assert blacklisted(release, "linux-image-generic-hwe-20.04")
    # The next ABI is a new package: kept out by the metas, not by this kernel's entries.
    newer = release.replace("-generic", "0-generic")
    assert not blacklisted(release, f"linux-image-{newer}")
    assert not blacklisted(release, "linux-firmware")
    assert not blacklisted(release, "linux-generic-extra")


@pytest.mark.skipif(shutil.which("apt-config") is None, reason="needs apt-config to read the file")
def test_apt_reads_the_blacklist_file(tmp_path):
    conf = tmp_path / "51gpu-cluster-kernel"
    conf.write_text(kernel.uu_blacklist(JAMMY))
    out = subprocess.run(
        ["apt-config", "-c", str(conf), "dump", "Unattended-Upgrade::Package-Blacklist"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    read = [
        line.split(" ", 1)[1].strip('";')
        for line in out.splitlines()
        if line.startswith("Unattended-Upgrade::Package-Blacklist:: ")
    ]
    assert read == kernel.uu_blacklist_entries(JAMMY)
    assert "^linux-headers-5[.]15[.]0-91-generic$" in read
