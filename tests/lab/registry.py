"""The lab's image registry: Debian's docker-registry (the Distribution registry 2.8, as an
air-gapped site runs one) on the lab bridge, 10.77.0.1:5000, with TLS from a lab CA, serving
stand-ins for Determined's task images under their real names.

The controller has no Docker daemon, so the images are built here: one layer with the lab's
cached base root filesystem (Debian 12 with python3 and openssh-server/-client), one with
Determined's harness (`determined` 0.38.0 and what it Requires, boto3 among them: pinned wheels,
sha256-checked by pip; tests/lab/task_wheels.py), one with Debian's
Open MPI and mpi4py (DEB_PACKAGES: the smoke experiment's distributed trial,
deploy/experiment/smoke.py), each image a Docker image manifest v2
schema 2 with its image config, pushed through the registry's HTTP API v2 (blob uploads, then
the manifest). Everything is deterministic (sorted tar entries, fixed mtimes, no owner names,
gzip mtime 0, sorted JSON), so the same base and wheels give the same digests; the base is
built by debootstrap and differs between machines, so `lab up` writes this machine's digests
into cluster.yaml's task_image lines (update_cluster_yaml).

State under /var/lib/dtlab/registry: ca.{key,crt} (the lab CA: sources.registry_ca),
server.{key,crt}, config.yml, storage/ (the registry's), layers/ (built layers, reused while
their inputs are unchanged), wheels/, debs/ (the Debian packages and the apt state that
resolved them).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import ssl
import stat
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .paths import APT_PROXY_PORT, BASE_ROOTFS, RUN, STATE
from .shell import LabError, run
from .task_wheels import WHEELS_PINNED

DIR = STATE / "registry"
CA_KEY, CA_CRT = DIR / "ca.key", DIR / "ca.crt"
SERVER_KEY, SERVER_CRT = DIR / "server.key", DIR / "server.crt"
CONFIG = DIR / "config.yml"
STORAGE, LAYERS, WHEELS = DIR / "storage", DIR / "layers", DIR / "wheels"
DEBS = DIR / "debs"
ADDRESS, PORT = "10.77.0.1", 5000
HOST = f"{ADDRESS}:{PORT}"
BINARY = "/usr/bin/docker-registry"
# Bump when the layer format below changes: cached layers are keyed by it.
BUILD_FORMAT = "1"
MTIME = 0
# Not part of an image (they are mounts at run time); the directories stay, empty.
EMPTY_DIRS = ("dev", "proc", "sys", "run", "tmp")
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"  # Debian 12's python3 reads it
DATA_PREFIX = "usr/local"  # where Debian's pip puts a wheel's .data/data (its posix_local scheme)


# Determined's images (determined-ai/environments Dockerfile-base-cpu/-cuda, Dockerfile-pytorch-ngc).
_DETERMINED_ENV = ["PYTHONUNBUFFERED=1", "PYTHONFAULTHANDLER=1", "PYTHONHASHSEED=0"]
_BASE_ENV = ["LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PIP_NO_CACHE_DIR=1", *_DETERMINED_ENV]
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Image:
    name: str  # repository path, as cluster.yaml names it
    tag: str
    env: tuple[str, ...]

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


IMAGES = (
    # FROM nvidia/cuda:11.3.1-cudnn8-devel-ubuntu20.04 (environments Makefile build-cuda-113-base);
    # its Env from NVIDIA's dist/11.3.1/ubuntu2004/base/Dockerfile (gitlab.com/nvidia/container-
    # images/cuda): the requirement libnvidia-container checks, and CUDA 11.3 runs on R515.
    Image(
        "determinedai/environments",
        "cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4",
        (
            f"PATH=/opt/conda/bin:/usr/local/nvidia/bin:/usr/local/cuda/bin:{_SYSTEM_PATH}",
            "NVARCH=x86_64",
            "NVIDIA_REQUIRE_CUDA=cuda>=11.3 brand=tesla,driver>=418,driver<419 "
            "brand=tesla,driver>=440,driver<441 driver>=450",
            "NV_CUDA_CUDART_VERSION=11.3.109-1",
            "NV_CUDA_COMPAT_PACKAGE=cuda-compat-11-3",
            "CUDA_VERSION=11.3.1",
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            *_BASE_ENV,
        ),
    ),
    # FROM ubuntu:20.04 (environments Makefile UBUNTU_IMAGE_TAG): no CUDA, no NVIDIA variables.
    Image(
        "determinedai/environments",
        "py-3.9-pytorch-1.12-tf-2.11-cpu-748dda4",
        (f"PATH=/opt/conda/bin:{_SYSTEM_PATH}", *_BASE_ENV),
    ),
    # Determined 0.38.0's default, FROM nvcr.io/nvidia/pytorch:24.03-py3 (CUDA 12.4.0). NGC's
    # framework images do not carry nvidia/cuda's requirement: they declare
    # NVIDIA_REQUIRE_CUDA=cuda>=9.0 (the Env of NGC PyTorch 20.06 and 23.10 as `env` prints it)
    # and check the driver in their own entrypoint against CUDA_DRIVER_VERSION, so
    # libnvidia-container starts this image on any driver and CUDA 12.4 fails inside it.
    Image(
        "determinedai/pytorch-ngc",
        "0.38.0",
        (
            f"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/mpi/bin:{_SYSTEM_PATH}",
            "NVIDIA_REQUIRE_CUDA=cuda>=9.0",
            "CUDA_VERSION=12.4.0.041",
            "CUDA_DRIVER_VERSION=550.54.14",
            "_CUDA_COMPAT_PATH=/usr/local/cuda/compat",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video",
            "NVIDIA_PRODUCT_NAME=PyTorch",
            "NVIDIA_PYTORCH_VERSION=24.03",
            *_DETERMINED_ENV,
        ),
    ),
)

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"


# --- TLS and the daemon ---------------------------------------------------------------------

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")


def ensure_ca() -> Path:
    """The lab CA (sources.registry_ca names it), made once: cluster.yaml is checked against it."""
    DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    DIR.chmod(0o755)  # the CA certificate is public; the keys below are 0600
    if not (CA_CRT.exists() and CA_KEY.exists()):
        ca = ["-keyout", CA_KEY, "-out", CA_CRT, "-days", "3650", "-subj", "/CN=dtlab registry CA"]
        ca += ["-addext", "basicConstraints=critical,CA:TRUE"]
        ca += ["-addext", "keyUsage=critical,keyCertSign,cRLSign"]
        run("openssl", "req", "-x509", *EC_KEY, *ca)
        CA_KEY.chmod(0o600)
        SERVER_CRT.unlink(missing_ok=True)  # signed by a CA that is gone
    CA_CRT.chmod(0o644)
    return CA_CRT


# Every lab's controller address: the default lab's 10.77.0.1 and the bench's and the lab
# tests' clusters on 10.77.<n>.0/24 (tests/lab/bench.py). Go's TLS, Docker's, checks the IP
# SAN, not the CN.
SERVED_ADDRESSES = [f"10.77.{n}.1" for n in range(256)]
# The controller's own pushes and checks go over loopback: the registry serves every address,
# and the default lab's bridge (10.77.0.1) need not exist while another lab is up.
LOCAL = "127.0.0.1"


def ensure_server_cert() -> None:
    """A certificate for every lab's controller address (made again when that list changes)."""
    ext = DIR / "server.ext"
    wanted = (
        "subjectAltName=" + ",".join(f"IP:{a}" for a in [LOCAL, *SERVED_ADDRESSES]) + "\n"
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    if SERVER_CRT.exists() and SERVER_KEY.exists() and ext.exists() and ext.read_text() == wanted:
        return
    csr = DIR / "server.csr"
    ext.write_text(wanted)
    run("openssl", "req", "-new", *EC_KEY, "-keyout", SERVER_KEY, "-out", csr, "-subj", f"/CN={ADDRESS}")
    serial = str(int.from_bytes(os.urandom(8), "big"))
    signing = ["-CA", CA_CRT, "-CAkey", CA_KEY, "-set_serial", serial, "-days", "825", "-extfile", ext]
    run("openssl", "x509", "-req", "-in", csr, *signing, "-out", SERVER_CRT)
    SERVER_KEY.chmod(0o600)
    csr.unlink()


def config_text(title: str, storage: Path, port: int, extra: str = "") -> str:
    """A Distribution 2.8 configuration serving `storage` with TLS on `port` of every address:
    as the lab mirror (tests/lab/services.py), each lab's nodes reach it on their own controller
    address (10.77.<n>.1)."""
    return (
        f"# {title} (tests/lab/registry.py): Distribution 2.8's configuration format.\n"
        "version: 0.1\n"
        "log:\n  level: info\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  cache:\n    blobdescriptor: inmemory\n"
        f"http:\n  addr: 0.0.0.0:{port}\n  tls:\n    certificate: {SERVER_CRT}\n    key: {SERVER_KEY}\n"
        f"{extra}"
    )


def write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def write_config() -> None:
    write_if_changed(CONFIG, config_text("The lab registry", STORAGE, PORT))


def ensure_daemon() -> None:
    from . import services

    if not Path(BINARY).exists():
        raise LabError(f"{BINARY} is missing: apt-get install -y docker-registry")
    ensure_ca()
    ensure_server_cert()
    STORAGE.mkdir(parents=True, exist_ok=True)
    write_config()
    if services._listening(PORT, LOCAL) and not services._pid_alive(RUN / "registry.pid", BINARY):
        # Debian's package enables docker-registry.service (:5000 on every address) where
        # systemd runs: two registries cannot share the port.
        raise LabError(
            f"port {PORT} is taken by another process (Debian's docker-registry service?): "
            "systemctl disable --now docker-registry, or free the port"
        )
    services._daemon("registry", [BINARY, "serve", str(CONFIG)], PORT, BINARY, host=LOCAL)


# A pull-through cache in front of the lab registry, as docs/site-setup.md puts one in front of
# Docker Hub at a site: the same Distribution binary with `proxy.remoteurl`, on CACHE_PORT of
# every controller address, with the same certificate. The bench's clusters pull through it
# (sources.registry = <controller>:5001): the lab registry then serves each layer to the cache,
# not to each node. Distribution checks the remote's certificate with Go's TLS, which reads the
# lab CA from SSL_CERT_FILE.
CACHE_PORT = 5001
CACHE_CONFIG, CACHE_STORAGE = DIR / "cache-config.yml", DIR / "cache-storage"


def ensure_cache() -> None:
    """The pull-through cache, running (the lab registry too)."""
    from . import services

    ensure_daemon()
    CACHE_STORAGE.mkdir(parents=True, exist_ok=True)
    proxy = f"proxy:\n  remoteurl: https://{LOCAL}:{PORT}\n"
    text = config_text("The lab registry's pull-through cache", CACHE_STORAGE, CACHE_PORT, proxy)
    if write_if_changed(CACHE_CONFIG, text):
        services.stop_service("registry-cache", BINARY)  # it reads its configuration at start
    env = {**os.environ, "SSL_CERT_FILE": str(CA_CRT)}
    services._daemon(
        "registry-cache", [BINARY, "serve", str(CACHE_CONFIG)], CACHE_PORT, BINARY, host=LOCAL, env=env
    )


def clear_cache() -> None:
    """The pull-through cache with nothing in it: a site's new cache before its first deploy."""
    from . import services

    services.stop_service("registry-cache", BINARY)
    shutil.rmtree(CACHE_STORAGE, ignore_errors=True)
    ensure_cache()


def fill_cache(refs: list[str], timeout: float = 300) -> None:
    """Pull each `name@sha256:...` through the pull-through cache once, from the controller, and
    wait until the cache has stored every blob: what docs/site-setup.md asks a site to do before
    its first cold deploy. Distribution 2.8 (registry/proxy/proxyblobstore.go ServeBlob) fetches
    a blob it does not have twice from the remote (once for the client, once in the background
    to store it), and once more for every request that arrives while that store is in flight:
    N agents pulling into an empty cache at once cost the uplink N + 1 copies of each layer."""
    cache = f"https://{LOCAL}:{CACHE_PORT}"
    blobs = CACHE_STORAGE / "docker" / "registry" / "v2" / "blobs" / "sha256"
    for ref in refs:
        name, _, digest = ref.partition("@")
        name = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        status, _, body = _request(
            "GET", f"{cache}/v2/{name}/manifests/{digest}", headers={"Accept": MANIFEST_TYPE}
        )
        _expect(status, (200,), f"manifest {ref} through the cache", body)
        manifest = json.loads(body)
        for blob in [manifest["config"], *manifest["layers"]]:
            status, _, body = _request("GET", f"{cache}/v2/{name}/blobs/{blob['digest']}")
            _expect(status, (200,), f"blob {blob['digest']} of {ref} through the cache", body)
            stored = blobs / blob["digest"][7:9] / blob["digest"][7:] / "data"
            deadline = time.monotonic() + timeout
            while not (stored.exists() and stored.stat().st_size == blob["size"]):
                if time.monotonic() > deadline:
                    raise LabError(f"the registry cache did not store {blob['digest']} within {timeout:.0f}s")
                time.sleep(0.2)


# --- the registry's HTTP API v2 -------------------------------------------------------------


def _request(method: str, url: str, data=None, headers=None, length=None) -> tuple[int, dict, bytes]:
    if not url.startswith("https://"):
        url = f"https://{LOCAL}:{PORT}{url}"
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if length is not None:
        req.add_header("Content-Length", str(length))
    context = ssl.create_default_context(cafile=str(CA_CRT))
    try:
        with urllib.request.urlopen(req, context=context, timeout=600) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _expect(status: int, wanted: tuple[int, ...], what: str, body: bytes) -> None:
    if status not in wanted:
        raise LabError(f"registry {HOST}: {what}: HTTP {status}: {body[:300]!r}")


def _has_blob(name: str, digest: str) -> bool:
    return _request("HEAD", f"/v2/{name}/blobs/{digest}")[0] == 200


def push_blob(name: str, digest: str, path: Path | None = None, data: bytes | None = None) -> None:
    """A blob into repository `name`: mounted from another repository when the registry has
    it, uploaded whole (POST, then one PUT with the digest) otherwise."""
    if _has_blob(name, digest):
        return
    for other in sorted({i.name for i in IMAGES} - {name}):
        status, headers, body = _request(
            "POST", f"/v2/{name}/blobs/uploads/?mount={digest}&from={other}", b""
        )
        if status == 201:
            return
        if status == 202:  # not mountable from there: an upload session was opened instead
            break
    else:
        status, headers, body = _request("POST", f"/v2/{name}/blobs/uploads/", b"")
    _expect(status, (202,), f"start upload to {name}", body)
    location = headers["Location"]
    sep = "&" if "?" in location else "?"
    size = path.stat().st_size if path is not None else len(data or b"")
    with open(path, "rb") if path is not None else contextlib.nullcontext(data or b"") as body_file:
        status, _, body = _request(
            "PUT",
            f"{location}{sep}digest={digest}",
            data=body_file,
            headers={"Content-Type": "application/octet-stream"},
            length=size,
        )
    _expect(status, (201,), f"upload {digest} to {name}", body)


def manifest_digest(name: str, tag: str) -> str | None:
    status, headers, _ = _request("HEAD", f"/v2/{name}/manifests/{tag}", headers={"Accept": MANIFEST_TYPE})
    return headers.get("Docker-Content-Digest") if status == 200 else None


def wait_ready(timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            status, _, body = _request("GET", "/v2/")
            if status == 200:
                return
        except OSError as e:
            body = str(e).encode()
        if time.monotonic() > deadline:
            raise LabError(
                f"registry {HOST} does not answer /v2/: {body[:200]!r}; see {STATE}/logs/registry.log"
            )
        time.sleep(0.2)


# --- building the layers --------------------------------------------------------------------


class _Hashing:
    """A write-only stream that hashes and counts what passes through to `out`."""

    def __init__(self, out):
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha.hexdigest()}"


@dataclass(frozen=True)
class Layer:
    path: Path  # the gzipped tar
    digest: str  # sha256 of the gzipped tar: the blob
    size: int
    diff_id: str  # sha256 of the tar: the image config's rootfs.diff_ids

    def descriptor(self) -> dict:
        return {"mediaType": LAYER_TYPE, "size": self.size, "digest": self.digest}


def _fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Same metadata on every machine: fixed mtime, numeric owners only (the ids are part of
    the root filesystem; the names come from the machine that builds it)."""
    info.mtime = MTIME
    info.uname = info.gname = ""
    return info


def write_layer(key: str, fill) -> Layer:
    """The layer `fill(tar)` writes, cached under `key` (same key: the same inputs)."""
    LAYERS.mkdir(parents=True, exist_ok=True)
    path, meta = LAYERS / f"{key}.tar.gz", LAYERS / f"{key}.json"
    if path.exists() and meta.exists():
        m = json.loads(meta.read_text())
        return Layer(path, m["digest"], m["size"], m["diff_id"])
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as raw:
        blob = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=blob, mtime=0, compresslevel=6) as gz:
            tar_stream = _Hashing(gz)
            with tarfile.open(fileobj=tar_stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                fill(tar)
    layer = Layer(path, blob.digest, blob.size, tar_stream.digest)
    meta.write_text(json.dumps({"digest": layer.digest, "size": layer.size, "diff_id": layer.diff_id}))
    tmp.rename(path)
    return layer


def _walk(root: Path):
    """Every path under `root`, relative, in a fixed order; the contents of EMPTY_DIRS left out."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel in EMPTY_DIRS:
            dirnames[:] = []
            continue
        dirnames.sort()
        # os.walk lists a symlink to a directory as a directory and does not descend into it.
        for name in sorted(filenames + dirnames):
            yield os.path.normpath(os.path.join(rel, name))


def rootfs_key(root: Path = BASE_ROOTFS) -> str:
    """A cache key of the root filesystem: every path's type, mode, owner, size and mtime."""
    h = hashlib.sha256(f"rootfs {BUILD_FORMAT}\n".encode())
    for rel in sorted(_walk(root)):
        st = os.lstat(root / rel)
        h.update(f"{rel}\0{st.st_mode}\0{st.st_uid}\0{st.st_gid}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "rootfs-" + h.hexdigest()[:32]


def fill_rootfs(root: Path):
    def fill(tar: tarfile.TarFile) -> None:
        for rel in sorted(_walk(root)):
            full = root / rel
            mode = os.lstat(full).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                continue  # device nodes, sockets, FIFOs: nothing an image carries
            info = _fixed(tar.gettarinfo(str(full), rel))
            if info.isreg():
                with open(full, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)

    return fill


def fetch_wheels() -> list[Path]:
    """The pinned wheels, downloaded once; pip checks every sha256 (--require-hashes)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    wanted = [WHEELS / name for name in sorted(WHEELS_PINNED)]
    if all(
        p.exists() and hashlib.sha256(p.read_bytes()).hexdigest() == WHEELS_PINNED[p.name] for p in wanted
    ):
        return wanted
    requirements = WHEELS / "requirements.txt"
    lines = []
    for name, sha in sorted(WHEELS_PINNED.items()):
        project, version = name.split("-")[:2]
        lines.append(f"{project}=={version} --hash=sha256:{sha}")
    requirements.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        # The running interpreter's tags (CPython 3.11 on Debian 12, as in the images: README):
        # pip's --platform cannot name the legacy manylinux2014 aliases some wheels carry.
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
         "--only-binary=:all:", "--require-hashes", "-d", str(WHEELS), "-r", str(requirements)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise LabError(f"pip download of the task images' wheels failed: {proc.stderr.strip()[-2000:]}")
    return wanted


def wheels_key(wheels: list[Path]) -> str:
    h = hashlib.sha256(f"wheels {BUILD_FORMAT} {SITE_PACKAGES}\n".encode())
    for p in wheels:
        h.update(f"{p.name} {WHEELS_PINNED[p.name]}\n".encode())
    return "wheels-" + h.hexdigest()[:32]


def fill_wheels(wheels: list[Path]):
    """The wheels unpacked into SITE_PACKAGES, as pip installs their files, without the
    command-line scripts (what a trial needs is `import determined` and `import boto3`)."""

    def fill(tar: tarfile.TarFile) -> None:
        entries: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]] = {}
        zips = [zipfile.ZipFile(p) for p in wheels]
        for z in zips:
            for item in z.infolist():
                if item.is_dir():
                    continue
                top, _, rest = item.filename.partition("/")
                if top.endswith(".data"):
                    kind, _, rest = rest.partition("/")
                    if kind == "scripts":
                        continue  # command-line entry points (jmespath's jp.py): not for `import`
                    if kind == "data":  # under the scheme's prefix (fonttools' man page)
                        target = f"{DATA_PREFIX}/{rest}"
                    elif kind in ("purelib", "platlib"):
                        target = f"{SITE_PACKAGES}/{rest}"
                    else:
                        raise LabError(f"{z.filename}: {item.filename}: not unpacked here")
                else:
                    target = f"{SITE_PACKAGES}/{item.filename}"
                if target in entries:
                    raise LabError(f"{item.filename} is in two wheels")
                entries[target] = (z, item)
        dirs = {str(Path(t).parent) for t in entries}
        dirs |= {str(p) for d in list(dirs) for p in Path(d).parents if str(p) != "."}
        for d in sorted(dirs):
            info = _fixed(tarfile.TarInfo(d))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for target in sorted(entries):
            z, item = entries[target]
            data = z.read(item)
            info = _fixed(tarfile.TarInfo(target))
            info.size = len(data)
            info.mode = 0o755 if (item.external_attr >> 16) & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
        for z in zips:
            z.close()

    return fill


# --- Debian's Open MPI and mpi4py -----------------------------------------------------------

# What the smoke experiment's two-agent trial runs (deploy/experiment/smoke.py): mpirun over
# ssh, an mpi4py allreduce. sshd and ssh come with the base (rootfs.BASE_PACKAGES has
# openssh-server, which depends on openssh-client).
DEB_PACKAGES = ("openmpi-bin", "python3-mpi4py")
# The base is merged-/usr (Debian 12): a package's /lib/... lands in /usr/lib/...; a layer entry
# "lib/" would replace the base's lib -> usr/lib symlink with a directory and break the image.
_MERGED = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
# What openmpi-bin's postinst registers with update-alternatives (mpi-default-bin points there
# too): maintainer scripts do not run here, so the layer carries the links they would make.
_ALTERNATIVES = {"mpirun": "/usr/bin/mpirun.openmpi", "mpiexec": "/usr/bin/mpiexec.openmpi"}


def _apt_options() -> list[str]:
    """apt-get on the controller with its own state under DEBS, resolving against the base's
    dpkg status (only what the base lacks is fetched), through the lab's apt-cacher-ng; the
    archive's signature checked with the base's own Debian keyring."""
    from .rootfs import DEBIAN_MIRROR

    etc, state = DEBS / "etc", DEBS / "state"
    for d in (
        etc / "preferences.d",
        etc / "apt.conf.d",
        state / "lists/partial",
        DEBS / "cache/archives/partial",
    ):
        d.mkdir(parents=True, exist_ok=True)
    keyring = BASE_ROOTFS / "usr/share/keyrings/debian-archive-keyring.gpg"
    (etc / "sources.list").write_text(f"deb [signed-by={keyring}] {DEBIAN_MIRROR} bookworm main\n")
    (state / "status").write_bytes((BASE_ROOTFS / "var/lib/dpkg/status").read_bytes())
    return [
        "-q", "-o", f"Dir::Etc={etc}", "-o", f"Dir::State={state}",
        "-o", f"Dir::State::status={state}/status",
        "-o", f"Dir::Cache={DEBS}/cache", "-o", "Debug::NoLocking=1", "-o", "APT::Architecture=amd64",
        "-o", f"Acquire::http::Proxy=http://127.0.0.1:{APT_PROXY_PORT}",
    ]  # fmt: skip


def fetch_debs() -> list[Path]:
    """DEB_PACKAGES and what they need beyond the base, resolved once per base (the resolution
    is remembered in debs/resolved.json, keyed by the base's dpkg status and DEB_PACKAGES)."""
    status = (BASE_ROOTFS / "var/lib/dpkg/status").read_bytes()
    key = hashlib.sha256(status + " ".join(DEB_PACKAGES).encode()).hexdigest()
    resolved = DEBS / "resolved.json"
    archives = DEBS / "cache/archives"
    with contextlib.suppress(OSError, ValueError, KeyError):
        known = json.loads(resolved.read_text())
        paths = [archives / name for name in known["debs"]]
        if known["key"] == key and all(p.exists() for p in paths):
            return paths
    options = _apt_options()
    for old in archives.glob("*.deb"):
        old.unlink()
    for command in (["update"], ["install", "-d", "-y", "--no-install-recommends", *DEB_PACKAGES]):
        proc = subprocess.run(["apt-get", *options, *command], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise LabError(f"apt-get {command[0]} for the task images' {' '.join(DEB_PACKAGES)} failed: "
                           f"{(proc.stderr or proc.stdout).strip()[-1500:]}")  # fmt: skip
    paths = sorted(archives.glob("*.deb"))
    if not paths:
        raise LabError(f"apt-get fetched none of {' '.join(DEB_PACKAGES)} (already in the base?)")
    resolved.write_text(json.dumps({"key": key, "debs": [p.name for p in paths]}, indent=1) + "\n")
    return paths


def debs_key(debs: list[Path]) -> str:
    h = hashlib.sha256(
        f"debs {BUILD_FORMAT} {sorted(_MERGED.items())} {sorted(_ALTERNATIVES.items())}\n".encode()
    )
    for p in debs:
        h.update(f"{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode())
    return "debs-" + h.hexdigest()[:32]


def _merged(name: str) -> str:
    """A package path as it lands in the merged-/usr base ('./lib/x' -> 'usr/lib/x')."""
    name = os.path.normpath(name.removeprefix("./")).lstrip("/")
    top, sep, rest = name.partition("/")
    return _MERGED[top] + sep + rest if top in _MERGED else name


def deb_entries(deb: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The files of one .deb (dpkg-deb --fsys-tarfile), paths merged into /usr."""
    proc = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"dpkg-deb --fsys-tarfile {deb.name}: {proc.stderr.decode(errors='replace')[-300:]}")
    entries = []
    with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
        for info in tar:
            info.name = _merged(info.name)
            if info.islnk():
                info.linkname = _merged(info.linkname)
            data = tar.extractfile(info).read() if info.isreg() else None  # type: ignore[union-attr]
            entries.append((info, data))
    return entries


def fill_debs(debs: list[Path]):
    """The packages' files as dpkg would unpack them (no maintainer scripts: the alternatives
    their postinst registers are links here; the base's dpkg database does not list them)."""

    def fill(tar: tarfile.TarFile) -> None:
        entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
        for deb in debs:
            for info, data in deb_entries(deb):
                if info.name in (".", *_MERGED, *_MERGED.values()) or info.name.startswith("../"):
                    continue
                if info.name in entries and not (info.isdir() and entries[info.name][0].isdir()):
                    raise LabError(f"{info.name} is in two packages ({deb.name})")
                entries.setdefault(info.name, (info, data))
        for name, target in _ALTERNATIVES.items():
            for path, to in (
                (f"usr/bin/{name}", f"/etc/alternatives/{name}"),
                (f"etc/alternatives/{name}", target),
            ):
                link = tarfile.TarInfo(path)
                link.type, link.linkname, link.mode = tarfile.SYMTYPE, to, 0o777
                entries[path] = (link, None)
        for name in sorted(entries):
            info, data = entries[name]
            tar.addfile(_fixed(info), io.BytesIO(data) if data is not None else None)

    return fill


LAYER_HISTORY = (
    "the lab's base root filesystem (Debian 12)",
    "boto3 and its dependencies",
    f"Debian's {', '.join(DEB_PACKAGES)}",
)


# --- images ---------------------------------------------------------------------------------


def image_config(image: Image, layers: list[Layer]) -> bytes:
    """The image config (Docker image spec v1.2): no creation time, so it is reproducible."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": list(image.env), "Cmd": ["/bin/bash"]},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        # One entry per layer (Docker counts the non-empty ones against rootfs.diff_ids).
        "history": [
            {"created_by": f"tests/lab/registry.py: {what}"}
            for what, _ in zip(LAYER_HISTORY, layers, strict=False)
        ],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def manifest(config: bytes, layers: list[Layer]) -> bytes:
    doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": _sha(config)},
        "layers": [layer.descriptor() for layer in layers],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def build_layers(log=print) -> list[Layer]:
    import time

    t0 = time.monotonic()
    base_key = rootfs_key()
    cached = (LAYERS / f"{base_key}.tar.gz").exists()
    base = write_layer(base_key, fill_rootfs(BASE_ROOTFS))
    wheels = fetch_wheels()
    python = write_layer(wheels_key(wheels), fill_wheels(wheels))
    debs = fetch_debs()
    mpi = write_layer(debs_key(debs), fill_debs(debs))
    if not cached:
        log(f"task image layers built ({time.monotonic() - t0:.1f}s)")
    return [base, python, mpi]


def push_images(layers: list[Layer]) -> dict[str, str]:
    """Every image of IMAGES in the registry; image ref (name:tag) -> manifest digest."""
    digests = {}
    for image in IMAGES:
        config = image_config(image, layers)
        body = manifest(config, layers)
        digest = _sha(body)
        if manifest_digest(image.name, image.tag) != digest:
            for layer in layers:
                push_blob(image.name, layer.digest, path=layer.path)
            push_blob(image.name, _sha(config), data=config)
            status, headers, answer = _request(
                "PUT",
                f"/v2/{image.name}/manifests/{image.tag}",
                data=body,
                headers={"Content-Type": MANIFEST_TYPE},
            )
            _expect(status, (201,), f"push manifest {image.ref}", answer)
            if headers.get("Docker-Content-Digest") != digest:
                raise LabError(
                    f"{image.ref}: the registry stored {headers.get('Docker-Content-Digest')}, not {digest}"
                )
        digests[image.ref] = digest
    return digests


def ensure(log=print) -> dict[str, str]:
    """The registry running with every lab image; name:tag -> name:tag@digest."""
    ensure_daemon()
    wait_ready()
    digests = push_images(build_layers(log))
    return {ref: f"{ref}@{digest}" for ref, digest in digests.items()}


# --- cluster.yaml's task_image lines ---------------------------------------------------------

_TASK_IMAGE_LINE = re.compile(r"(?m)^(    (?:gpu|cpu): )(\S+)$")


def rewrite_task_images(text: str, pinned: dict[str, str]) -> tuple[str, list[str]]:
    """`text` with each determined.task_image line that names a lab image (name:tag) pinned
    to `pinned[name:tag]`; only those lines change. Returns the text and the keys changed."""
    start = text.find("\n  task_image:\n")
    if start < 0:
        return text, []
    end = start + len("\n  task_image:\n")
    while True:  # the block: the lines indented deeper than `task_image:`
        m = re.compile(r" {4}.*\n").match(text, end)
        if m is None:
            break
        end = m.end()
    changed = []

    def pin(m: re.Match) -> str:
        ref = m.group(2)
        new = pinned.get(ref.split("@", 1)[0], ref)
        if new != ref:
            changed.append(m.group(1).strip().rstrip(":"))
        return m.group(1) + new

    block = _TASK_IMAGE_LINE.sub(pin, text[start:end])
    return text[:start] + block + text[end:], changed


def update_cluster_yaml(cluster_path: Path, pinned: dict[str, str]) -> list[str]:
    text = cluster_path.read_text()
    new, changed = rewrite_task_images(text, pinned)
    if new != text:
        # Atomically: the unit tests may read the file while `python -m tests.lab warm` runs.
        temp = cluster_path.with_name(f".{cluster_path.name}.new")
        temp.write_text(new)
        os.replace(temp, cluster_path)
    return changed


def main() -> int:
    """`python -m tests.lab.registry`: the lab images' references with this machine's digests."""
    for ref in ensure().values():
        print(f"{HOST}/{ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
