"""NVIDIA's CUDA apt repository, and packages held at exact versions from it.

Shared by roles/nvidia_driver.py, roles/cuda.py and roles/nccl.py:

- `cuda_repo()` trusts the repo through NVIDIA's cuda-keyring package (downloaded from the
  configured repo folder) and writes our own sources list under the keyring's file name, so
  the configured URL (a mirror, in an air-gapped site) is the one apt uses.
- `pinned(pinset, repo)` checks the repo offers every pinned version (else stops the host
  naming what is missing), writes the apt preferences, installs every package at its exact
  version (moving held packages too), and holds them.

The operations decide from facts read when they run, so a second deploy changes nothing.
"""

from __future__ import annotations

import io
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files

from deploy.facts_gpu import AptRepoVersions, HeldPackages
from deploy.pins import (
    CUDA_KEYRING_DEB,
    CUDA_KEYRING_FILE,
    CUDA_KEYRING_PACKAGE,
    CUDA_KEYRING_VERSION,
    PinSet,
)

SOURCES_DIR = "/etc/apt/sources.list.d"
PREFERENCES_DIR = "/etc/apt/preferences.d"
LOCK_WAIT = "-o DPkg::Lock::Timeout=600"
PIN_PRIORITY = 1001
# Other builds from NVIDIA's repo: installable only when asked for by exact version.
OTHER_NVIDIA_PRIORITY = 100
NEVER = -1


# ---------------------------------------------------------------------------------------------
# Pure helpers (unit tested)


def os_release(distribution: dict) -> tuple[str, str]:
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
        "# NVIDIA CUDA repository, written by the cluster deploy (roles/apt_pins.py).\n"
        f"deb [signed-by={CUDA_KEYRING_FILE}] {repo_url} /\n"
    )


def preferences_path(pinset: PinSet) -> str:
    # apt ignores files in preferences.d whose names have an extension other than .pref.
    return f"{PREFERENCES_DIR}/{pinset.name}.pref"


def render_preferences(pinset: PinSet) -> str:
    """apt preferences that allow exactly one build of each package: the pinned one.

    apt uses the FIRST stanza that matches a package version, and a stanza takes one `Pin:`
    line (given two, apt silently keeps the last). Version and origin are therefore pinned
    with three ordered stanzas per package:
      1. the pinned version, priority 1001 (installed even when that is a downgrade);
      2. any other version from NVIDIA's repo (Release `Origin:`), priority 100;
      3. every other version, priority -1 (never): Ubuntu's own builds of the driver.
    """
    head = (
        f"# {pinset.name}: exact versions from the repository with origin {pinset.origin!r}.\n"
        "# Written by the cluster deploy (roles/apt_pins.py); apt uses the first matching\n"
        "# stanza, so the order below matters.\n"
    )
    stanzas = []
    for package, version in pinset.packages:
        stanzas += [
            f"Package: {package}\nPin: version {version}\nPin-Priority: {PIN_PRIORITY}\n",
            (f"Package: {package}\nPin: release o={pinset.origin}\nPin-Priority: {OTHER_NVIDIA_PRIORITY}\n"),
            f"Package: {package}\nPin: version *\nPin-Priority: {NEVER}\n",
        ]
    return head + "\n" + "\n".join(stanzas)


def fetch_shell(url: str, dest: str) -> str:
    """Shell that downloads url to dest with curl, wget or python3, whichever exists."""
    u, d = shlex.quote(url), shlex.quote(dest)
    py = (
        "import shutil, sys, urllib.request; "
        "r = urllib.request.urlopen(sys.argv[1], timeout=120); "
        "shutil.copyfileobj(r, open(sys.argv[2], 'wb'))"
    )
    return (
        f"if command -v curl >/dev/null 2>&1; then curl -fsSL --retry 3 -o {d} {u}; "
        f"elif command -v wget >/dev/null 2>&1; then wget -q -O {d} {u}; "
        f"else python3 -c {shlex.quote(py)} {u} {d}; fi"
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


def fail(message: str) -> FunctionCommand:
    """A command that stops this host with `message` (other hosts go on)."""

    def stop(state, host):
        host.log_styled(message, fg="red", log_func=logger.error)
        return False

    return FunctionCommand(stop, (), {})


# ---------------------------------------------------------------------------------------------
# Operations


@operation()
def keyring(folder_url: str):
    """Install NVIDIA's cuda-keyring from the repo folder, unless that version is installed."""
    installed = host.get_fact(DebPackages).get(CUDA_KEYRING_PACKAGE, set())
    if CUDA_KEYRING_VERSION in installed:
        host.noop(f"{CUDA_KEYRING_PACKAGE} {CUDA_KEYRING_VERSION} is installed")
        return
    url = folder_url + CUDA_KEYRING_DEB
    tmp = f"/var/cache/apt/archives/{CUDA_KEYRING_DEB}.partial"
    t = shlex.quote(tmp)
    yield StringCommand(
        f"rm -f {t}; ({fetch_shell(url, tmp)}) || "
        f"{{ rm -f {t}; echo {shlex.quote(f'could not download {CUDA_KEYRING_DEB} from {url}')} >&2;"
        " exit 1; }; "
        # confold: keep our sources list if it is there already (it has the keyring's name).
        f"dpkg --force-confdef --force-confold -i {t}; rc=$?; rm -f {t}; exit $rc"
    )


@operation()
def update_if_stale(pins: dict, repo_url: str, sources_changed: Callable[[], bool] | None = None):
    """`apt-get update` when the sources list changed, or a version still to install is not
    in apt's cache (a node already on its pins needs no update, whatever the mirror holds)."""
    if sources_changed is not None and state.is_executing and sources_changed():
        yield StringCommand(f"apt-get {LOCK_WAIT} update")
        return
    wrong = not_at_pin(pins, host.get_fact(DebPackages))
    if not wrong:
        host.noop(f"{', '.join(sorted(pins))} at their pinned versions")
        return
    offered = host.get_fact(AptRepoVersions, packages=sorted(wrong))
    if not missing_from_repo(wrong, offered, repo_url):
        host.noop(f"apt's cache offers {', '.join(sorted(wrong))} from {repo_url}")
        return
    yield StringCommand(f"apt-get {LOCK_WAIT} update")


@operation()
def available(pinset: PinSet, repo_url: str):
    """Stop this host, naming what is missing, if the repo lacks a version still to install."""
    wrong = not_at_pin(pinset.as_dict(), host.get_fact(DebPackages))
    if not wrong:
        host.noop(f"{pinset.name}: nothing to install")
        return
    offered = host.get_fact(AptRepoVersions, packages=sorted(wrong))
    missing = missing_from_repo(wrong, offered, repo_url)
    if not missing:
        host.noop(f"{repo_url} offers {', '.join(f'{p}={v}' for p, v in wrong.items())}")
        return
    yield fail(
        f"{pinset.name}: the apt repository {repo_url} does not offer "
        f"{', '.join(missing)}: add it to the mirror, or change versions in cluster.yaml"
    )


@operation()
def install_pinned(pinset: PinSet):
    """Install every package at its pinned version; held packages are moved too."""
    wrong = not_at_pin(pinset.as_dict(), host.get_fact(DebPackages))
    if not wrong:
        host.noop(f"{pinset.name}: {', '.join(pinset.install_args())} installed")
        return
    held = host.get_fact(HeldPackages)
    unhold = sorted(p for p in wrong if p in held)
    if unhold:
        yield StringCommand("apt-mark unhold " + " ".join(unhold))
    # Only the packages not yet at their pin: the others are already where they belong.
    yield from apt.packages._inner(
        packages=[f"{p}={v}" for p, v in wrong.items()],
        allow_downgrades=True,
        extra_install_args=f"{LOCK_WAIT} --allow-change-held-packages",
    )


@operation()
def hold(packages: list):
    """`apt-mark hold` the packages that are not held yet."""
    held = host.get_fact(HeldPackages)
    todo = [p for p in packages if p not in held]
    if not todo:
        host.noop(f"held: {', '.join(packages)}")
        return
    yield StringCommand("apt-mark hold " + " ".join(shlex.quote(p) for p in todo))


# ---------------------------------------------------------------------------------------------
# Deploys


@dataclass(frozen=True)
class Repo:
    url: str  # the repo folder, ending with "/"
    sources: OperationMeta  # the sources-list operation (did it change?)


@deploy("NVIDIA CUDA apt repository")
def cuda_repo() -> Repo:
    cluster = host.data.cluster
    os_id, os_version = os_release(host.get_fact(LinuxDistribution))
    url = cluster.sources.cuda_repo_for(os_id, os_version)
    keyring(name=f"Trust the CUDA repository ({CUDA_KEYRING_DEB})", folder_url=url)
    sources = files.put(
        name="CUDA repository sources list",
        src=io.StringIO(sources_list(url)),
        dest=sources_list_path(os_id, os_version),
        mode="644",
    )
    return Repo(url=url, sources=sources)


@deploy("Pinned packages")
def pinned(pinset: PinSet, repo: Repo) -> OperationMeta:
    """Update if needed, check, preferences, exact install, hold. Returns the install op."""
    update_if_stale(
        name=f"apt-get update if the cache lacks {pinset.name}",
        pins=pinset.as_dict(),
        repo_url=repo.url,
        sources_changed=repo.sources.did_change,
    )
    # Before anything is written: a repo without the pinned versions leaves the node as it was.
    available(name=f"The repository offers {pinset.name}", pinset=pinset, repo_url=repo.url)
    files.put(
        name=f"apt preferences for {pinset.name}",
        src=io.StringIO(render_preferences(pinset)),
        dest=preferences_path(pinset),
        mode="644",
    )
    first, *rest = pinset.install_args()
    installed = install_pinned(
        name=f"Install {first}" + (f" and {len(rest)} more" if rest else ""),
        pinset=pinset,
    )
    hold(name=f"Hold {pinset.name}", packages=[p for p, _ in pinset.packages])
    return installed
