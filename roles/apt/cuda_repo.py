"""NVIDIA's CUDA apt repository, and packages held at exact versions from it.

Shared by roles/nvidia/driver.py, roles/nvidia/gpu_services.py, roles/nvidia/cuda.py, roles/nvidia/nccl.py and
roles/determined/docker.py:

- `cuda_repo(cluster)` trusts the repo through NVIDIA's cuda-keyring package (downloaded from
  the configured repo folder, installed only if its sha256 is the folder's pin in
  sources.cuda_keyring, and re-checked on every run: `keyring`) and writes our own sources
  list under the keyring's file name, so the configured URL (a mirror, in an air-gapped site)
  is the one apt uses.
- `pinned(pinset, repo)` checks the repo offers every pinned version (else stops the host
  naming what is missing), writes the apt preferences (files/apt/preferences.j2: the
  pinned version at 1001, other NVIDIA builds at 100, anything else never), installs every
  package at its exact version (moving held packages too; without Recommends where the pin set
  says so), and holds them.

The operations decide from facts read when they run, so a second deploy changes nothing.
"""

from __future__ import annotations

import io
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from pyinfra import host, state
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files

from deploy.cluster import Cluster
from deploy.facts.apt import AptRepoVersions, HeldPackages
from deploy.facts.keyring import KeptKeyring
from deploy.pins import (
    CUDA_KEYRING_DEB,
    CUDA_KEYRING_FILE,
    CUDA_KEYRING_PACKAGE,
    CUDA_KEYRING_VERSION,
    PinSet,
)
from roles.apt.pinsets import (
    missing_from_repo,
    not_at_pin,
    os_release,
    preferences_path,
    render_preferences,
    repo_folder,
    sources_list,
    sources_list_path,
)
from roles.shared.apt_lists import update_command
from roles.shared.ops import (
    APT_LOCK_WAIT,
    DPKG_KEEP_CONFIG,
    DPKG_LOCK_TIMEOUT,
    fail,
    fetch_verified,
)
from roles.shared.scripts import script

# The verified keyring .deb stays on the node: each run compares the installed keyring with
# it (and it with the pin) without downloading anything.
KEPT_KEYRING = f"/var/lib/gpu-cluster/{CUDA_KEYRING_DEB}"

# --- operations: pyinfra's apt.update cannot tell a stale cache, nor is there a hold op --------


@operation()
def update_if_stale(pins: dict, repo_url: str, sources_changed: Callable[[], bool] | None = None):
    """`apt-get update` when the sources list changed, or a version still to install is not
    in apt's cache (a node already on its pins needs no update, whatever the mirror holds)."""
    if sources_changed is not None and state.is_executing and sources_changed():
        yield update_command()
        return
    wrong = not_at_pin(pins, host.get_fact(DebPackages))
    if not wrong:
        host.noop(f"{', '.join(sorted(pins))} at their pinned versions")
        return
    offered = host.get_fact(AptRepoVersions, packages=sorted(wrong))
    if not missing_from_repo(wrong, offered, repo_url):
        host.noop(f"apt's cache offers {', '.join(sorted(wrong))} from {repo_url}")
        return
    yield update_command()


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
def hold(packages: list):
    """`apt-mark hold` the packages that are not held yet."""
    held = host.get_fact(HeldPackages)
    todo = [p for p in packages if p not in held]
    if not todo:
        host.noop(f"held: {', '.join(packages)}")
        return
    yield script("shared/apt-mark-hold.sh", DPKG_LOCK_TIMEOUT, *todo)


@operation()
def keyring(url: str, sha256: str | None, folder: str):
    """NVIDIA's keyring from the .deb pinned in cluster.yaml, re-checked on every run: the kept
    .deb must still have the pin's sha256 and the installed keyring file must be the one inside
    it (an installed version says nothing of where its files came from). Otherwise the .deb is
    fetched (nothing is installed unless its sha256 is the pin) and installed over whatever is
    there."""
    if sha256 is None:  # pins are per repo folder: this node's OS has none
        yield fail(
            f"sources.cuda_keyring has no sha256 for {folder}: pin that folder's "
            f"{CUDA_KEYRING_DEB} in cluster.yaml (sha256sum FILE); nothing is trusted unpinned"
        )
        return
    found = host.get_fact(
        KeptKeyring, deb=KEPT_KEYRING, keyring=CUDA_KEYRING_FILE, package=CUDA_KEYRING_PACKAGE
    )
    if found == {"deb": sha256, "keyring": True, "version": CUDA_KEYRING_VERSION}:
        host.noop(f"{CUDA_KEYRING_FILE} is the one in the pinned {CUDA_KEYRING_DEB}")
        return
    if found["deb"] != sha256:
        yield fetch_verified(url, KEPT_KEYRING, artifact=CUDA_KEYRING_DEB, sha256=sha256)
    yield StringCommand(
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall --allow-downgrades {APT_LOCK_WAIT}"
        f" {DPKG_KEEP_CONFIG} {shlex.quote(KEPT_KEYRING)}"
    )


# --- deploys -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repo:
    url: str  # the repo folder, ending with "/"
    sources: OperationMeta  # the sources-list operation (did it change?)


@deploy("NVIDIA CUDA apt repository")
def cuda_repo(cluster: Cluster) -> Repo:
    distribution = host.get_fact(LinuxDistribution)
    os_id, os_version = os_release(distribution)
    url = cluster.sources.cuda_repo_for(os_id, os_version)
    keyring(
        name=f"Trust the CUDA repository ({CUDA_KEYRING_DEB})",
        url=url + CUDA_KEYRING_DEB,
        sha256=cluster.sources.cuda_keyring_sha256(os_id, os_version),
        folder=repo_folder(os_id, os_version),
    )
    sources = files.put(
        name="CUDA repository sources list",
        src=io.StringIO(sources_list(url)),
        dest=sources_list_path(os_id, os_version),
        mode="644",
    )
    return Repo(url=url, sources=sources)


@deploy("Pinned packages")
def pinned(pinset: PinSet, repo: Repo, before_install: Callable[[], object] | None = None) -> OperationMeta:
    """Update if needed, check, preferences, exact install, hold. Returns the install op.

    `before_install` adds operations that run just before the install, on a host where it will
    install something (a pin absent or at another version when planning)."""
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
    if before_install is not None and not_at_pin(pinset.as_dict(), host.get_fact(DebPackages)):
        before_install()
    first, *rest = pinset.install_args()
    # apt.packages installs only the pins not yet in place, in one apt-get run; a held package
    # at another version is moved too (--allow-change-held-packages), and stays held.
    # Without Recommends where the pin set says so (the driver's: nvidia-settings, unversioned,
    # would come at the repo's newest build, outside the pin; deploy/pins.py).
    installed = apt.packages(
        name=f"Install {first}" + (f" and {len(rest)} more" if rest else ""),
        packages=pinset.install_args(),
        allow_downgrades=True,
        no_recommends=not pinset.recommends,
        extra_install_args=f"{APT_LOCK_WAIT} --allow-change-held-packages",
    )
    hold(name=f"Hold {pinset.name}", packages=[p for p, _ in pinset.packages])
    return installed
