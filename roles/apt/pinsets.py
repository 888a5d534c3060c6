"""What NVIDIA's repo and the pins look like on a node: names, file texts, missing versions.

Pure functions (no pyinfra, no I/O but the template), unit tested; roles/apt/cuda_repo.py applies
them. The apt preferences come from files/apt/preferences.j2: apt uses the FIRST stanza
that matches a package version, and a stanza takes one `Pin:` line (given two, apt silently
keeps the last). Version and origin are therefore pinned with three ordered stanzas per package:
  1. the pinned version, priority 1001 (installed even when that is a downgrade);
  2. any other version from NVIDIA's repo (Release `Origin:`), priority 100;
  3. every other version, priority -1 (never): e.g. Ubuntu's own builds of the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deploy.pins import CUDA_KEYRING_FILE, PinSet
from roles.shared.templates import render

SOURCES_DIR = "/etc/apt/sources.list.d"
PREFERENCES_DIR = "/etc/apt/preferences.d"
PIN_PRIORITY = 1001  # above 1000: installed even when that is a downgrade
# Other builds from NVIDIA's repo: installable only when asked for by exact version.
OTHER_NVIDIA_PRIORITY = 100
NEVER = -1  # every other origin, e.g. Ubuntu's own builds of the driver


def os_release(distribution: Mapping[str, Any]) -> tuple[str, str]:
    """("ubuntu", "20.04") from pyinfra's LinuxDistribution fact (os-release ID, VERSION_ID)."""
    meta = distribution.get("release_meta") or {}
    os_id = meta.get("ID") or (distribution.get("name") or "").lower()
    version = meta.get("VERSION_ID") or ""
    if not os_id or not version:
        raise ValueError(f"cannot tell the distribution from /etc/os-release: {distribution!r}")
    return os_id.lower(), version


def repo_folder(os_id: str, os_version: str) -> str:
    """ubuntu2004, ubuntu2204, debian12: NVIDIA's name for a distribution's repo folder."""
    return os_id.lower() + os_version.replace(".", "")


def sources_list_path(os_id: str, os_version: str) -> str:
    # The name cuda-keyring gives its own list: ours replaces it, so apt does not see
    # NVIDIA's public URL next to the configured mirror.
    return f"{SOURCES_DIR}/cuda-{repo_folder(os_id, os_version)}-x86_64.list"


def sources_list(repo_url: str) -> str:
    """A flat repo (`URL /`), trusted only through NVIDIA's keyring."""
    return (
        "# NVIDIA CUDA repository, written by the cluster deploy (roles/apt/cuda_repo.py).\n"
        f"deb [signed-by={CUDA_KEYRING_FILE}] {repo_url} /\n"
    )


def preferences_path(pinset: PinSet) -> str:
    # apt ignores files in preferences.d whose names have an extension other than .pref.
    return f"{PREFERENCES_DIR}/{pinset.name}.pref"


def render_preferences(pinset: PinSet) -> str:
    """apt preferences that allow exactly one build of each package: the pinned one."""
    return render(
        "apt/preferences.j2",
        name=pinset.name,
        origin=pinset.origin,
        packages=pinset.packages,
        pinned=PIN_PRIORITY,
        other_builds=OTHER_NVIDIA_PRIORITY,
        never=NEVER,
    )


def missing_from_repo(
    pins: dict[str, str], offered: dict[str, set[tuple[str, str]]], repo_url: str
) -> list[str]:
    """`pkg=version` strings the repo at repo_url does not offer (per apt-cache madison)."""
    want = repo_url.rstrip("/")
    return [f"{p}={v}" for p, v in pins.items() if (v, want) not in offered.get(p, set())]


def not_at_pin(pins: dict[str, str], installed: dict[str, set[str]]) -> dict[str, str]:
    """The pins whose package is absent or installed at another version."""
    return {p: v for p, v in pins.items() if v not in installed.get(p, set())}
