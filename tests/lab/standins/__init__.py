# Stand-ins for vendor software (NVIDIA driver/CUDA/NCCL/container toolkit, MLNX_OFED, ...)
"""Vendor stand-ins served by the lab mirror, and the helpers their builders share.

Each stand-in reproduces the real artifact's package names, versions, paths and output
formats; none of it is ever imported by deploy code. Source files are kept as real files
(scripts, C sources, unit files) so they can be read and linted; builders fill in
`@PLACEHOLDER@` tokens (versions, URLs) when they package them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

STANDINS_DIR = Path(__file__).resolve().parent

_TOKEN = re.compile(r"@([A-Z][A-Z0-9_]*)@")


class StandinBuildError(RuntimeError):
    pass


def source(rel: str) -> str:
    """The text of a stand-in source file, relative to tests/lab/standins/."""
    return (STANDINS_DIR / rel).read_text()


def render(text: str, **subs: str) -> str:
    """Replace @KEY@ tokens; every token in `text` must be given and every key used."""
    found = set(_TOKEN.findall(text))
    missing = found - subs.keys()
    unused = subs.keys() - found
    if missing or unused:
        raise StandinBuildError(f"template tokens: missing {sorted(missing)}, unused {sorted(unused)}")
    return _TOKEN.sub(lambda m: subs[m.group(1)], text)


def render_from(text: str, subs: dict[str, str]) -> str:
    """Like render(), taking from a shared table only the tokens that `text` uses."""
    used = set(_TOKEN.findall(text))
    return render(text, **{k: v for k, v in subs.items() if k in used})


def compile_shared_library(c_source: str, soname: str, *, defines: dict[str, str] | None = None) -> bytes:
    """Compile C text into a stripped shared library and return its bytes.

    Built in a throwaway directory with a fixed relative file name, stripped, and with a
    content-derived build-id, so the same compiler gives the same bytes on any machine.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise StandinBuildError("gcc not found: install Debian package 'gcc'")
    with tempfile.TemporaryDirectory(prefix="dtlab-cc-") as tmp:
        Path(tmp, "standin.c").write_text(c_source)
        cmd = [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-s",
            "-Wall",
            "-Werror",
            "-Wl,--build-id=sha1",
            f"-Wl,-soname,{soname}",
            *(f"-D{k}={v}" for k, v in sorted((defines or {}).items())),
            "-o",
            "out.so",
            "standin.c",
        ]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise StandinBuildError(f"gcc failed for {soname}:\n{proc.stderr}")
        return Path(tmp, "out.so").read_bytes()
