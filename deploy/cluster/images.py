"""Trial images: the reference check of `determined.task_image.*` and the table of the CUDA
versions known images need, against the CUDA version the pinned driver supports.

Two ways an image too new for the driver fails. An image whose NVIDIA_REQUIRE_CUDA asks for
more than the driver's CUDA (nvidia/cuda's own images: `cuda>=12.4 brand=tesla,driver>=470,
driver<471 ...`, space-separated alternatives, comma-separated conjunctions) is refused by
libnvidia-container before it starts ("requirement error: unsatisfied condition: cuda>=12.4,
please update your driver to a newer version, or use an earlier cuda container"). NGC images
declare only `cuda>=9.0` and carry CUDA's forward-compatibility libraries instead: they start,
and on a data-center GPU their CUDA works on the driver branches their release notes list;
on any other branch every CUDA call fails (cudaErrorInsufficientDriver / 804). Driver 515 runs
CUDA 11.x natively, CUDA 12.0 through forward compatibility, CUDA 12.4 not at all. An image
this table does not know passes; verify reads the truth on each agent (the image's
NVIDIA_REQUIRE_CUDA and CUDA_VERSION against the driver, and cuInit in a GPU container).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.cluster.checks import check, control_character
from deploy.cluster.reader import Reader
from deploy.cluster.storage_tls import parse_certificates
from deploy.secrets import FileProblem, read_local_file

if TYPE_CHECKING:  # model.py imports this module
    from deploy.cluster.model import Cluster

# name[:tag]@sha256:<64 hex>: Docker's reference grammar (distribution/reference), lower-case
# repository path components, an optional registry host[:port] first.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_REGISTRY = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::\d{{1,5}})?/)"
_NAME = rf"(?:{_REGISTRY}?{_COMPONENT}(?:/{_COMPONENT})*)"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
IMAGE_REF = re.compile(
    rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?", re.ASCII
)

# Determined's defaults before its move to CUDA 12 (determined-ai/determined commit 55b7fd9b97,
# master/pkg/schemas/expconf/const.go, April 2024): built FROM nvidia/cuda:11.3.1-cudnn8-devel
# (determined-ai/environments, Makefile build-cuda-113-base). No public source states their
# digests: they are pinned by tag until cluster.yaml names them with one.
DEFAULT_GPU_IMAGE = "determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4"
DEFAULT_CPU_IMAGE = "determinedai/environments:py-3.9-pytorch-1.12-tf-2.11-cpu-748dda4"

# (repository, tag pattern, the CUDA version the image's runtime is, the driver branches older
# than that CUDA's own minimum on which the image still runs through CUDA forward compatibility
# (data-center GPUs such as A100 and V100 only), where that is stated).
KNOWN_CUDA: tuple[tuple[str, str, tuple[int, int], frozenset[int], str], ...] = (
    # Determined 0.38.0's default image (master/pkg/schemas/expconf/const.go at v0.38.0), built
    # FROM nvcr.io/nvidia/pytorch:24.03-py3 (determined-ai/environments Makefile,
    # NGC_PYTORCH_VERSION := 24.03-py3); 24.03's forward compatibility as for NGC 24.03 below.
    (
        "determinedai/pytorch-ngc",
        r"0\.38\.0",
        (12, 4),
        frozenset({470, 525, 535, 545}),
        "Determined 0.38's default, on NGC PyTorch 24.03",
    ),
    # determined-ai/environments Makefile: build-cuda-113-base / build-cuda-118-base.
    ("determinedai/environments", r"cuda-11\.3-.*", (11, 3), frozenset(), "FROM nvidia/cuda:11.3.1"),
    ("determinedai/environments", r"cuda-11\.8-.*", (11, 8), frozenset(), "FROM nvidia/cuda:11.8.0"),
    # NVIDIA's Frameworks Support Matrix (docs.nvidia.com/deeplearning/frameworks/
    # support-matrix/) and each release's notes (pytorch-release-notes/rel-YY-MM.html,
    # "Release YY.MM is based on CUDA ...", and "if you are running on a data center GPU ... you
    # can use NVIDIA driver release ..."): 23.01 lists R450, R470, R510 and R515 (515.65 or
    # later); 24.03 lists R470, R525, R535 and R545, not R515. nvidia/cuda's own images say the
    # same in NVIDIA_REQUIRE_CUDA (gitlab.com/nvidia/container-images/cuda, dist/12.0.0/*/base/
    # Dockerfile: `brand=tesla,driver>=515,driver<516`; dist/12.4.1: no 515 clause).
    # Re-read them before adding a row; when in doubt leave an image out (it then passes).
    ("nvcr.io/nvidia/pytorch", r"22\.08-py3", (11, 7), frozenset(), "NGC PyTorch 22.08: CUDA 11.7.1"),
    (
        "nvcr.io/nvidia/pytorch",
        r"23\.01-py3",
        (12, 0),
        frozenset({450, 470, 510, 515}),
        "NGC PyTorch 23.01: CUDA 12.0.1",
    ),
    (
        "nvcr.io/nvidia/pytorch",
        r"24\.03-py3",
        (12, 4),
        frozenset({470, 525, 535, 545}),
        "NGC PyTorch 24.03: CUDA 12.4.0",
    ),
)

# Driver branch -> the newest CUDA it runs natively (CUDA Toolkit release notes, Table 3: CUDA
# 11.7 Update 1 ships 515.65.01; 12.0 GA needs >= 525.60.13). Within CUDA 11 minor version
# compatibility runs any 11.x runtime on >= 450.80.02, so only a newer major is refused, and
# only where the image's forward compatibility does not cover the branch.
DRIVER_CUDA: dict[str, tuple[int, int]] = {"515": (11, 7)}


@check("`name[:tag]@sha256:<64 hex>`")
def image_ref(r: Reader, path: str, v: Any) -> str | None:
    """A Docker image reference pinned by digest: a tag alone can be moved to another image."""
    m = IMAGE_REF.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        r.bad(path, v, "must be a Docker image reference like 'repo/name:tag@sha256:<64 hex digits>'")
        return None
    if m["digest"] is None:
        r.bad(
            path,
            v,
            "has no digest: write name:tag@sha256:<digest> (`docker buildx imagetools inspect "
            f"{v}` or `skopeo inspect docker://{v}` prints it)",
        )
        return None
    return str(v)


def required_cuda(ref: str) -> tuple[tuple[int, int], frozenset[int], str] | None:
    """(the CUDA version `ref` runs, the driver branches its forward compatibility covers, the
    table row's source), or None if the table has no row for it."""
    m = IMAGE_REF.fullmatch(ref)
    if m is None:
        return None
    name, tag = m["name"], m["tag"] or "latest"
    for repo, tag_pattern, cuda, forward, source in KNOWN_CUDA:
        if (name == repo or name == f"docker.io/{repo}" or name.endswith(f"/{repo}")) and re.fullmatch(
            tag_pattern, tag
        ):
            return cuda, forward, source
    return None


def too_new(ref: str, driver_version: str) -> str | None:
    """Why `ref` cannot run on `driver_version`, or None (also for unknown images or drivers)."""
    branch = driver_version.split(".")[0]
    supported = DRIVER_CUDA.get(branch)
    known = required_cuda(ref)
    if supported is None or known is None:
        return None
    (major, minor), forward, source = known
    if major <= supported[0] or int(branch) in forward:
        return None
    covered = ", ".join(f"R{b}" for b in sorted(forward)) or "no older branch"
    return (
        f"needs CUDA {major}.{minor} ({source}); driver {driver_version} runs CUDA up to "
        f"{supported[0]}.{supported[1]} and this image's forward compatibility covers {covered}, "
        f"not R{branch}: its CUDA calls fail in the container (or nvidia-container-cli refuses it)"
    )


# --- the site registry (sources.registry, sources.registry_ca) -------------------------------

_HOST = re.compile(
    r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*)"
    r"(?::(?P<port>[0-9]{1,5}))?",
    re.ASCII,
)


def registry_of(name: str) -> tuple[str | None, str]:
    """(registry, path) of an image name, the way Docker splits it (distribution/reference,
    normalize.go splitDockerDomain): the first component names a registry only when it holds
    a '.' or a ':', is `localhost`, or has upper-case letters; otherwise the image is on
    Docker Hub and the whole name is its path."""
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        return first, rest
    return None, name


@check("`host[:port]`: a hostname or IPv4 address, optional port")
def registry_host(r: Reader, path: str, v: Any) -> str | None:
    """A site registry as image references name it: it becomes the first component of every
    task image the agents pull and the directory name under /etc/docker/certs.d/."""
    m = _HOST.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        scheme = isinstance(v, str) and "://" in v
        r.bad(
            path,
            v,
            "must be a registry's host[:port] like 'registry.example.com:5000' or '10.0.0.5:5000'"
            + (" (no scheme: image references name the host only)" if scheme else " (nothing else)"),
        )
        return None
    host, port = m["host"], m["port"]
    if port is not None and not 1 <= int(port) <= 65535:
        r.bad(path, v, "port must be from 1 to 65535")
        return None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            r.bad(path, v, f"{host!r} is neither a hostname nor an IPv4 address")
            return None
    elif "." not in host and port is None and host != "localhost":
        # Docker would read 'mirror/determinedai/...' as Docker Hub's 'mirror' namespace.
        r.bad(
            path,
            v,
            "a one-label name without a port: Docker reads it as a Docker Hub namespace, not a "
            "registry; write its full name (with a '.') or add the port",
        )
        return None
    return str(v)


@check("`-1` (unlimited) or an integer ≥ 65536")
def memlock(r: Reader, path: str, v: Any) -> int | None:
    """A container's locked-memory limit as Docker's ulimit takes it: bytes, -1 unlimited."""
    if isinstance(v, int) and not isinstance(v, bool) and (v == -1 or v >= 65536):
        return v
    r.bad(path, v, "must be -1 (unlimited) or a number of bytes of at least 65536 (64 KiB)")
    return None


# A CA certificate is a few KiB; a bundle of every public CA is ~200 KiB.
CA_MAX_BYTES = 1 << 20


@check("absolute path of a PEM CA certificate on the machine that runs pyinfra")
def registry_ca_file(r: Reader, path: str, v: Any) -> str | None:
    """The registry's CA, read on the machine that runs pyinfra (and uploaded to the agents).

    Like secret files, it is read when secrets are resolved: a file named but missing is a
    problem of cluster.yaml, not a failed upload halfway through a deploy.
    """
    if not isinstance(v, str) or not v.startswith("/") or v != v.strip() or control_character(v):
        r.bad(path, v, "must be an absolute path without surrounding spaces or control characters")
        return None
    if not r.resolve_secrets:
        return v
    try:
        data = read_local_file(Path(v), max_bytes=CA_MAX_BYTES)
    except FileProblem as e:
        r.bad(path, v, str(e))
        return None
    if len(data) > CA_MAX_BYTES:
        r.bad(path, v, "larger than 1 MiB: not a CA certificate")
    elif b"-----BEGIN CERTIFICATE-----" not in data:
        r.bad(path, v, "not a PEM certificate (no '-----BEGIN CERTIFICATE-----' line)")
    else:
        # Certificate blocks only, each readable, as storage.tls and determined.tls take theirs:
        # a PEM that also holds the CA's PRIVATE KEY would be copied to every agent.
        parsed = parse_certificates(data, "a CA certificate", REGISTRY_CA_CERTIFICATES_ONLY)
        if isinstance(parsed, str):
            r.bad(path, v, parsed)
            return None
        return v
    return None


REGISTRY_CA_CERTIFICATES_ONLY = (
    "the file goes to every agent as /etc/docker/certs.d/<registry>/ca.crt, readable by all"
)


@dataclass(frozen=True)
class TaskRefs:
    """determined.task_image as the agents pull it (roles/determined/task_images.py) and master.yaml names
    it: each through site_ref, once, in the model (Cluster.task_refs)."""

    gpu: str
    cpu: str

    @property
    def pulled(self) -> tuple[str, ...]:
        """The references, GPU image first, each once (both keys may name one image)."""
        return tuple(dict.fromkeys((self.gpu, self.cpu)))


def task_refs(cluster: Cluster) -> TaskRefs:
    image = cluster.determined.task_image
    return TaskRefs(gpu=site_ref(cluster, image.gpu), cpu=site_ref(cluster, image.cpu))


def site_ref(cluster: Cluster, ref: str) -> str:
    """The reference the agents pull and master.yaml names for the task image `ref`.

    With `sources.registry` set, the image's registry (Docker Hub when it names none) is
    replaced by the site registry, keeping the path, tag and digest: a site mirrors images
    with `skopeo copy` (or `docker push`), which keeps the manifest and so its digest. Docker
    Hub's official images (`ubuntu`) live under `library/` there, as Docker names them.
    Without a site registry, `ref` unchanged.
    """
    registry = cluster.sources.registry
    if registry is None:
        return ref
    m = IMAGE_REF.fullmatch(ref)
    if m is None:
        raise ValueError(f"not an image reference: {ref!r}")
    domain, image_path = registry_of(m["name"])
    if domain in (None, "docker.io", "index.docker.io") and "/" not in image_path:
        image_path = f"library/{image_path}"
    tag = f":{m['tag']}" if m["tag"] else ""
    digest = f"@{m['digest']}" if m["digest"] else ""
    return f"{registry}/{image_path}{tag}{digest}"
