# Lab stand-in for MinIO's download folder (dl.min.io/server/minio/release/linux-amd64/).
"""Publish the MinIO stand-in into the lab mirror as `minio/minio` plus `minio/minio.sha256sum`.

The script is copied byte for byte, so the published sha256 only changes when the stand-in's
source does, and the inventory can pin it like the real binary.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("minio")


def _write(path: Path, data: bytes, mode: int) -> None:
    if not (path.exists() and path.read_bytes() == data):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    os.chmod(path, mode)


def build(ctx) -> list[Path]:
    """Write the binary (0755) and its checksum file; returns the paths written."""
    data = SOURCE.read_bytes()
    out_dir = Path(ctx.mirror_dir) / "minio"
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "minio"
    _write(binary, data, 0o755)
    # The same "<sha256>  <name>" line as `sha256sum minio`, so `sha256sum -c` accepts it.
    checksum = out_dir / "minio.sha256sum"
    _write(checksum, f"{hashlib.sha256(data).hexdigest()}  minio\n".encode(), 0o644)
    return [binary, checksum]
