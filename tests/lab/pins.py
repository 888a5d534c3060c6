"""Keep the lab cluster.yaml's sha256 pins equal to what the lab mirror builds.

Stand-ins are built deterministically, so their sha256 is a fact of the sources; after
changing a stand-in run `python -m tests.lab.pins` (it rewrites only the sha256 lines),
and a unit test fails with the same advice when they drift.
"""

import re
import sys
from pathlib import Path

import yaml

from deploy.cluster import DEFAULT_DETERMINED_VERSION, DEFAULT_VERSIONS
from deploy.pins import CUDA_KEYRING_DEB

from .paths import DEFAULT_CLUSTER, MIRROR

LAB_DISTRO = "debian12"  # lab nodes are Debian 12
PINNED = ("mofed_tarball", "minio", "determined_master", "determined_agent")
# sources.cuda_keyring.<LAB_DISTRO>: the keyring .deb in the lab's CUDA repo folder (its key is
# committed, tests/lab/aptrepo.py, so the .deb is the same on every build).
KEYRING = "cuda_keyring"


# A URL's path inside the mirror: after the host, and after /labmirror/ when the URL goes
# through the controller's apt-cacher-ng (tests/lab/services.py; the bench's clusters).
MIRROR_PREFIX = re.compile(r"^https?://[^/]+/(labmirror/)?")


def mirror_paths(cluster_path: Path) -> dict[str, str]:
    """Source name -> path inside the mirror of the artifact the lab's nodes fetch."""
    raw = yaml.safe_load(Path(cluster_path).read_text())
    versions = {**DEFAULT_VERSIONS, **(raw.get("versions") or {})}
    det_version = (raw.get("determined") or {}).get("version", DEFAULT_DETERMINED_VERSION)
    paths = {}
    for name in PINNED:
        url = raw["sources"][name]["url"]
        version = det_version if name.startswith("determined") else versions["mofed"]
        url = url.format(version=version, distro=LAB_DISTRO)
        paths[name] = MIRROR_PREFIX.sub("", url)
    repo = raw["sources"]["cuda_repo"].format(distro=LAB_DISTRO) + CUDA_KEYRING_DEB
    paths[KEYRING] = MIRROR_PREFIX.sub("", repo)
    return paths


def built_sums(mirror_dir: Path) -> dict[str, str]:
    sums = {}
    for line in (mirror_dir / "artifacts.sha256").read_text().splitlines():
        digest, path = line.split(None, 1)
        sums[path.strip()] = digest
    return sums


def expected_pins(cluster_path: Path, mirror_dir: Path) -> dict[str, str]:
    sums = built_sums(mirror_dir)
    return {name: sums[path] for name, path in mirror_paths(cluster_path).items()}


def stale(cluster_path: Path, mirror_dir: Path = MIRROR) -> list[str]:
    raw = yaml.safe_load(Path(cluster_path).read_text())["sources"]
    return [
        name
        for name, digest in expected_pins(cluster_path, mirror_dir).items()
        if (raw[name].get(LAB_DISTRO) if name == KEYRING else raw[name].get("sha256")) != digest
    ]


def rewrite(text: str, pins: dict[str, str]) -> str:
    for name, digest in pins.items():
        field = LAB_DISTRO if name == KEYRING else "sha256"
        pattern = re.compile(rf"(\n  {name}:\n(?:    .*\n)*?    {field}: )([^\n]*)")
        text, n = pattern.subn(lambda m, d=digest: m.group(1) + d, text, count=1)
        if n != 1:
            raise ValueError(f"sources.{name}.{field} not found")
    return text


def main() -> int:
    cluster_path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CLUSTER
    pins = expected_pins(cluster_path, MIRROR)
    text = cluster_path.read_text()
    new = rewrite(text, pins)
    if new != text:
        cluster_path.write_text(new)
    for name, digest in pins.items():
        print(f"{name}: {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
