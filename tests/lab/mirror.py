"""The lab mirror: builds vendor stand-ins into the vendors' own layout and serves it over HTTP.

Layout under mirror_dir (docs/architecture.md):
  cuda/repos/<distro>/x86_64/   flat apt repo signed by the lab key, for debian12, ubuntu2004
                                and ubuntu2204 (cuda-keyring_1.1-1_all.deb differs per folder)
  mofed/MLNX_OFED_LINUX-5.8-3.0.7.0-<distro>-x86_64.tgz
  kernel/                       flat apt repo: linux-headers-<the controller's uname -r>, which
                                the lab adds to every node's apt sources before boot
  minio/minio                   from the MinIO builder, when present
  determined-ai/determined/releases/download/v<version>/determined-{master,agent}_<version>_linux_amd64.deb
                                from the Determined builder: GitHub's release path, tag v<version>
  artifacts.sha256              sha256 of every artifact fetched outside apt (cluster.yaml pins)

Builders are callables `(ctx) -> None`; ctx carries mirror_dir, base_url, work_dir, build_deb,
build_tgz, keyring (the lab archive key, binary), cuda_pool (a folder whose .debs go into every
CUDA repo) and cuda_repo_dir(distro). The mirror is rebuilt only when the stand-in sources,
this builder, the base URL, the signing key or the compiler changed.

CLI:
  python -m tests.lab.mirror build --mirror-dir DIR --base-url URL --gpg-home DIR
  python -m tests.lab.mirror serve --mirror-dir DIR [--bind ADDR] [--port 8077]
  (--dir is accepted as a synonym of --mirror-dir)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.lab import aptrepo, debs
from tests.lab.standins import STANDINS_DIR, StandinBuildError

CUDA_DISTROS = ("debian12", "ubuntu2004", "ubuntu2204")
CUDA_ORIGIN = "NVIDIA"
CUDA_LABEL = "NVIDIA CUDA"
HASH_FILE = ".dtlab-build-hash"
SUMS_FILE = "artifacts.sha256"
ACCESS_LOG = "mirror-access.log"
DEFAULT_PORT = 8077

LAB_DIR = Path(__file__).resolve().parent
# Builders outside this helper's ownership, plugged in when their modules exist.
OPTIONAL_BUILDERS = ("tests.lab.standins.minio.build", "tests.lab.standins.determined.build")


class MirrorError(RuntimeError):
    pass


@dataclass
class BuildContext:
    mirror_dir: Path
    base_url: str
    work_dir: Path
    keyring: bytes
    cuda_pool: Path
    cuda_distros: tuple[str, ...] = CUDA_DISTROS
    # Other flat repos a builder filled: (folder, Origin, Label), signed with the lab key.
    flat_repos: list[tuple[Path, str, str]] = field(default_factory=list)
    build_deb: Callable[..., Path] = field(default=debs.build_deb)
    build_tgz: Callable[..., Path] = field(default=debs.build_tgz)

    def cuda_repo_dir(self, distro: str) -> Path:
        path = self.mirror_dir / "cuda" / "repos" / distro / "x86_64"
        path.mkdir(parents=True, exist_ok=True)
        return path


def core_builders() -> list[Callable]:
    from tests.lab.standins.cuda import build as cuda
    from tests.lab.standins.kernel import build as kernel
    from tests.lab.standins.mofed import build as mofed
    from tests.lab.standins.nccl import build as nccl
    from tests.lab.standins.nvidia import build as nvidia

    return [nvidia.build, cuda.build, nccl.build, mofed.build, kernel.build]


def optional_builders() -> list[Callable]:
    found = []
    for name in OPTIONAL_BUILDERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Only "that builder does not exist yet" is tolerated, not a broken import inside it.
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                continue
            raise
        if not callable(getattr(module, "build", None)):
            raise MirrorError(f"{name} has no build(ctx) function")
        found.append(module.build)
    return found


# Builders run in this order; other modules may append to it before build_mirror runs.
BUILDERS: list[Callable] = []


def all_builders() -> list[Callable]:
    return core_builders() + optional_builders() + list(BUILDERS)


def _tool_version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return "missing"


def source_hash(base_url: str, fingerprint: str) -> str:
    """Hash of everything that determines the mirror's content."""
    h = hashlib.sha256()
    files = [LAB_DIR / "debs.py", LAB_DIR / "aptrepo.py", LAB_DIR / "mirror.py"]
    files += sorted(
        p
        for p in STANDINS_DIR.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    for path in files:
        h.update(str(path.relative_to(LAB_DIR)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    h.update(f"base_url={base_url}\0key={fingerprint}\0".encode())
    h.update(_tool_version(["gcc", "--version"]).encode())
    h.update(f"kernel={os.uname().release}\0".encode())  # the headers stand-in is for it
    return h.hexdigest()


def non_apt_artifacts(mirror_dir: Path) -> list[Path]:
    """Artifacts fetched by URL rather than through apt: pinned by sha256 in cluster.yaml."""
    out = []
    for path in sorted(mirror_dir.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(mirror_dir)
        if rel.name in (HASH_FILE, SUMS_FILE):
            continue
        if rel.parts[0] == "cuda" and not rel.name.startswith("cuda-keyring_"):
            continue  # apt verifies these through the signed Release
        if rel.parts[0] == "kernel":
            continue  # the same: the lab's kernel-headers repo, set up before boot
        out.append(path)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_sums(mirror_dir: Path) -> str:
    lines = [f"{_sha256(p)}  {p.relative_to(mirror_dir).as_posix()}\n" for p in non_apt_artifacts(mirror_dir)]
    text = "".join(lines)
    (mirror_dir / SUMS_FILE).write_text(text)
    return text


def build_mirror(
    mirror_dir: Path | str,
    base_url: str,
    gpg_home: Path | str,
    *,
    force: bool = False,
    out=sys.stdout,
) -> bool:
    """Build (or keep, when unchanged) the mirror. Returns True when it was rebuilt.

    The new tree is built beside mirror_dir and swapped in at the end, so a server running on
    mirror_dir keeps serving a complete tree while a rebuild runs.
    """
    mirror = Path(mirror_dir).resolve()
    if not base_url.startswith(("http://", "https://")):
        raise MirrorError(f"base_url must be an http(s) URL, got {base_url!r}")
    base_url = base_url.rstrip("/")
    fingerprint = aptrepo.ensure_signing_key(gpg_home)
    digest = source_hash(base_url, fingerprint)
    hash_file = mirror / HASH_FILE
    if not force and hash_file.exists() and hash_file.read_text().strip() == digest:
        out.write(f"mirror {mirror} is up to date\n")
        out.write((mirror / SUMS_FILE).read_text())
        return False

    mirror.parent.mkdir(parents=True, exist_ok=True)
    staging = mirror.with_name(mirror.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="dtlab-mirror-") as tmp:
            work = Path(tmp)
            ctx = BuildContext(
                mirror_dir=staging,
                base_url=base_url,
                work_dir=work,
                keyring=aptrepo.export_public_keyring(gpg_home),
                cuda_pool=work / "cuda-pool",
            )
            ctx.cuda_pool.mkdir()
            for builder in all_builders():
                builder(ctx)
            pool = sorted(ctx.cuda_pool.glob("*.deb"))
            for distro in ctx.cuda_distros:
                repo = ctx.cuda_repo_dir(distro)
                for deb in pool:
                    shutil.copyfile(deb, repo / deb.name)
                aptrepo.build_flat_repo(repo, gpg_home, CUDA_ORIGIN, CUDA_LABEL)
            for repo, origin, label in ctx.flat_repos:
                aptrepo.build_flat_repo(repo, gpg_home, origin, label)
        sums = write_sums(staging)
        (staging / HASH_FILE).write_text(digest + "\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        aptrepo.stop_gpg_agent(gpg_home)

    old = mirror.with_name(mirror.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if mirror.exists():
        mirror.rename(old)
    staging.rename(mirror)
    shutil.rmtree(old, ignore_errors=True)
    out.write(f"built mirror {mirror} in {time.monotonic() - started:.1f}s\n")
    out.write(sums)
    return True


class MirrorRequestHandler(SimpleHTTPRequestHandler):
    """Static files from the mirror, with one access-log line per request (bytes sent)."""

    server_version = "dtlab-mirror/1"
    log_lock = threading.Lock()
    log_path: Path  # set by serve()

    def send_response(self, code, message=None):
        self._status = code
        super().send_response(code, message)

    def log_request(self, code="-", size="-"):
        pass  # logged after the body is sent, with the byte count

    def log_message(self, format, *args):
        pass  # errors show up as status codes in the access log

    def copyfile(self, source, outputfile):
        while True:
            chunk = source.read(1 << 16)
            if not chunk:
                break
            outputfile.write(chunk)
            self._sent += len(chunk)

    def _handle(self, method):
        self._sent = 0
        self._status = 0
        try:
            method()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self._access_log()

    def do_GET(self):
        self._handle(super().do_GET)

    def do_HEAD(self):
        self._handle(super().do_HEAD)

    def _access_log(self):
        stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime())
        line = (
            f'{self.client_address[0]} - - [{stamp}] "{self.requestline}" '
            f"{self._status or '-'} {self._sent}\n"
        )
        with self.log_lock, open(self.log_path, "a") as f:
            f.write(line)


def make_server(mirror_dir: Path | str, bind_address: str, port: int) -> ThreadingHTTPServer:
    mirror = Path(mirror_dir).resolve()
    if not mirror.is_dir():
        raise MirrorError(f"{mirror}: no mirror built there (run `build` first)")
    log_path = mirror.parent / ACCESS_LOG

    class Handler(MirrorRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(mirror), **kwargs)

    Handler.log_path = log_path
    server = ThreadingHTTPServer((bind_address, port), Handler)
    server.daemon_threads = True
    return server


def serve(mirror_dir: Path | str, bind_address: str, port: int = DEFAULT_PORT) -> None:
    """Serve mirror_dir until interrupted; requests are logged to mirror_dir/../mirror-access.log."""
    server = make_server(mirror_dir, bind_address, port)
    host, real_port = server.server_address[:2]
    print(f"serving {Path(mirror_dir).resolve()} on http://{host}:{real_port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab.mirror", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the mirror (kept when unchanged)")
    b.add_argument("--mirror-dir", "--dir", dest="mirror_dir", required=True, type=Path)
    b.add_argument("--base-url", required=True, help="URL nodes use, e.g. http://10.77.0.1:8077")
    b.add_argument("--gpg-home", required=True, type=Path, help="lab archive key home (created)")
    b.add_argument("--force", action="store_true", help="rebuild even when unchanged")
    s = sub.add_parser("serve", help="serve a built mirror over HTTP")
    s.add_argument("--mirror-dir", "--dir", dest="mirror_dir", required=True, type=Path)
    s.add_argument("--bind", default="127.0.0.1")
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build_mirror(args.mirror_dir, args.base_url, args.gpg_home, force=args.force)
        else:
            serve(args.mirror_dir, args.bind, args.port)
    except (MirrorError, aptrepo.RepoError, StandinBuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
