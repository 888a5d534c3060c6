"""cluster.yaml's `sources` section: where each artifact comes from, and its pin."""

from dataclasses import dataclass
from typing import Annotated

from deploy.cluster import checks, credentials, images
from deploy.cluster.keys import ArtifactKey, Key
from deploy.secrets import Secret

ARTIFACT_KINDS = ("master", "agent")


@dataclass(frozen=True)
class Artifact:
    """`{url, sha256}` of one download; its keys are checked per file (see Sources, rules.py)."""

    url: str  # may hold {version} / {distro} placeholders
    # One pin, or (for a url with {distro}: one file per distro) one per distro; `sha256` is
    # then "" and `pin_for` is what a role reads.
    sha256: str
    per_distro: tuple[tuple[str, str], ...] = ()

    def pin_for(self, distro: str) -> str | None:
        """The sha256 of the file for `distro` (the url's {distro}); None: not pinned for it."""
        if not self.per_distro:
            return self.sha256
        return dict(self.per_distro).get(distro)


def mofed_distro(os_id: str, os_version: str) -> str:
    """MLNX_OFED's name for a distro in its tarballs' names: ubuntu20.04, ubuntu22.04, debian12."""
    return os_id.lower() + os_version


@dataclass(frozen=True)
class Sources:
    apt_proxy: Annotated[str | None, Key(checks.url(("http",)), None, "an apt proxy for the nodes")]
    apt_proxy_credentials: Annotated[Secret | None, credentials.APT_PROXY]
    cuda_repo: Annotated[
        str,
        Key(
            checks.url(("http", "https"), placeholders=("distro",), trailing_slash=True),
            "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/",
            "NVIDIA's CUDA apt repository; `{distro}` becomes NVIDIA's name for the node's OS "
            "(`ubuntu2004`, `ubuntu2204`, `debian12`)",
        ),
    ]
    mirror_credentials: Annotated[Secret | None, credentials.MIRROR]
    # NVIDIA's keyring .deb, the trust anchor of every package from cuda_repo: fetched from the
    # repo folder like any artifact, so pinned like one (it differs per folder).
    cuda_keyring: Annotated[
        tuple[tuple[str, str], ...] | None,
        Key(
            checks.keyring_pins,
            None,
            "sha256 of `cuda-keyring_1.1-1_all.deb` in each `cuda_repo` folder the nodes use, "
            "checked before it is installed and on every deploy; a node whose folder has no pin "
            "stops before the CUDA repository is trusted",
        ),
    ]
    mofed_tarball: Annotated[
        Artifact,
        ArtifactKey(
            "MLNX_OFED tarball",
            ("version", "distro"),
            "the MLNX_OFED tarball; `{distro}` becomes `ubuntu20.04`, `ubuntu22.04`, `debian12`; "
            "each distro's tarball is another file: `sha256` is one pin, or one per distro "
            "(`{ubuntu20.04: ..., ubuntu22.04: ...}`) for a cluster that mixes them",
        ),
    ]
    minio: Annotated[Artifact, ArtifactKey("MinIO server binary", (), "the MinIO server binary")]
    determined_master: Annotated[
        Artifact, ArtifactKey("determined-master package", ("version",), "the determined-master .deb")
    ]
    determined_agent: Annotated[
        Artifact, ArtifactKey("determined-agent package", ("version",), "the determined-agent .deb")
    ]
    # images.site_ref: the references pulled from it; no credentials (docs/cluster-yaml.md).
    registry: Annotated[
        str | None,
        Key(images.registry_host, None, "a site registry mirroring the task images: same path, tag, digest"),
    ]
    registry_ca: Annotated[
        str | None,
        Key(images.registry_ca_file, None, "`registry`'s CA, to /etc/docker/certs.d/<registry>/ca.crt"),
    ]

    def cuda_repo_for(self, os_id: str, os_version: str) -> str:
        """NVIDIA names its repos ubuntu2004, ubuntu2204, debian12."""
        return self.cuda_repo.format(distro=os_id.lower() + os_version.replace(".", ""))

    def cuda_keyring_sha256(self, os_id: str, os_version: str) -> str | None:
        """The pin of the keyring .deb in the node's repo folder, None if cluster.yaml has none."""
        return dict(self.cuda_keyring or ()).get(os_id.lower() + os_version.replace(".", ""))

    def mofed_url_for(self, os_id: str, os_version: str, mofed_version: str) -> str:
        """MLNX_OFED tarballs are named per distro as ubuntu20.04, ubuntu22.04, debian12."""
        return self.mofed_tarball.url.format(version=mofed_version, distro=mofed_distro(os_id, os_version))

    def mofed_sha256_for(self, os_id: str, os_version: str) -> str | None:
        """The pin of the node's distro's tarball (each distro's is another file)."""
        return self.mofed_tarball.pin_for(mofed_distro(os_id, os_version))

    def determined_url(self, kind: str, version: str) -> str:
        if kind not in ARTIFACT_KINDS:
            raise ValueError(f"kind must be one of {ARTIFACT_KINDS}, not {kind!r}")
        artifact = self.determined_master if kind == "master" else self.determined_agent
        return artifact.url.format(version=version)
