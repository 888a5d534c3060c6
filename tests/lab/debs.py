"""Deterministic .deb and .tar.gz builder in pure Python.

The lab mirror must produce byte-identical artifacts from identical sources, on any machine,
because cluster.yaml pins non-apt artifacts by sha256. So every timestamp is a constant, owners
are root, entries are sorted, and gzip headers carry neither a name nor a time.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# Like SOURCE_DATE_EPOCH: the one time stamp every artifact carries (2022-08-08, around the
# release of driver 515.65.01). A constant rather than "now" so rebuilds are byte-identical.
SOURCE_DATE_EPOCH = 1659916800

DEFAULT_MAINTAINER = "cudatools <cudatools@nvidia.com>"

MAINTAINER_SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "config", "triggers")


@dataclass(frozen=True)
class Symlink:
    """A symbolic link entry; `target` is stored verbatim (relative or absolute)."""

    target: str


@dataclass(frozen=True)
class Directory:
    """An explicit directory entry (parents of files are added automatically)."""

    mode: int = 0o755


Entry = tuple[bytes, int] | Symlink | Directory


def _normalise(path: str) -> str:
    """'/usr/bin/x' or 'usr/bin/x' -> 'usr/bin/x'; rejects '..' and empty names."""
    parts = PurePosixPath("/" + path.lstrip("/")).parts[1:]
    if not parts or any(p in ("..", ".") for p in parts):
        raise ValueError(f"bad archive path {path!r}")
    return "/".join(parts)


def _expand(entries: Mapping[str, Entry]) -> dict[str, Entry]:
    """Normalise names and add every missing parent directory (mode 0755)."""
    out: dict[str, Entry] = {}
    for raw, entry in entries.items():
        name = _normalise(raw)
        if name in out:
            raise ValueError(f"duplicate archive path {raw!r}")
        if isinstance(entry, tuple):
            data, mode = entry
            if not isinstance(data, (bytes, bytearray)):
                raise TypeError(f"{raw}: content must be bytes, got {type(data).__name__}")
            out[name] = (bytes(data), int(mode))
        elif not isinstance(entry, (Symlink, Directory)):
            raise TypeError(f"{raw}: entry must be (bytes, mode), Symlink or Directory")
        else:
            out[name] = entry
    for name in list(out):
        parent = PurePosixPath(name).parent
        while str(parent) != ".":
            key = str(parent)
            existing = out.get(key)
            if existing is None:
                out[key] = Directory()
            elif not isinstance(existing, Directory):
                raise ValueError(f"{key!r} is both a directory and a file")
            parent = parent.parent
    return out


def _tar_bytes(entries: Mapping[str, Entry], *, prefix: str, root_dir: bool) -> bytes:
    """An uncompressed GNU tar of `entries`, sorted, owned by root, constant mtime."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:

        def info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.mode = mode
            ti.mtime = SOURCE_DATE_EPOCH
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            return ti

        if root_dir:
            tar.addfile(info(prefix or ".", tarfile.DIRTYPE, 0o755))
        for name in sorted(entries):
            entry = entries[name]
            full = f"{prefix}{name}"
            if isinstance(entry, Directory):
                tar.addfile(info(full + "/", tarfile.DIRTYPE, entry.mode))
            elif isinstance(entry, Symlink):
                ti = info(full, tarfile.SYMTYPE, 0o777)
                ti.linkname = entry.target
                tar.addfile(ti)
            else:
                data, mode = entry
                ti = info(full, tarfile.REGTYPE, mode)
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _gzip(data: bytes) -> bytes:
    # mtime=0 and no file name in the header: otherwise every build differs.
    return gzip.compress(data, compresslevel=9, mtime=0)


def _ar(members: Sequence[tuple[str, bytes]]) -> bytes:
    """A System V ar archive as dpkg-deb writes it (names without the GNU '/' suffix)."""
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        if len(name) > 16:
            raise ValueError(f"ar member name too long: {name}")
        header = (f"{name:<16}{SOURCE_DATE_EPOCH:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n").encode(
            "ascii"
        )
        assert len(header) == 60
        out += header + data
        if len(data) % 2:
            out += b"\n"
    return bytes(out)


def deb_filename(package: str, version: str, arch: str) -> str:
    """`<package>_<version>_<arch>.deb`, the epoch dropped as `dpkg-deb --build` does."""
    if ":" in version:
        version = version.split(":", 1)[1]
    return f"{package}_{version}_{arch}.deb"


def _installed_size_kib(entries: Mapping[str, Entry]) -> int:
    # dpkg-gencontrol's rule: each file counts ceil(size/1024) KiB, other entries 1 KiB.
    total = 0
    for entry in entries.values():
        if isinstance(entry, tuple):
            total += (len(entry[0]) + 1023) // 1024
        else:
            total += 1
    return max(total, 1)


def _description_field(package: str, description: str) -> str:
    lines = (description.strip() or f"{package} package").splitlines()
    out = lines[0].strip()
    for line in lines[1:]:
        out += "\n " + (line.strip() or ".")
    return out


def _check_field(name: str, value: str) -> None:
    if not value or "\n" in value:
        raise ValueError(f"control field {name} must be a non-empty single line: {value!r}")


def build_deb(
    out_dir: Path | str,
    package: str,
    version: str,
    files: Mapping[str, Entry],
    *,
    arch: str = "amd64",
    depends: Sequence[str] = (),
    description: str = "",
    extra_control: Mapping[str, str] | None = None,
    scripts: Mapping[str, str] | None = None,
    conffiles: Sequence[str] = (),
    maintainer: str = DEFAULT_MAINTAINER,
) -> Path:
    """Write `<package>_<version>_<arch>.deb` into out_dir and return its path.

    files: absolute path -> (bytes, mode) | Symlink | Directory.
    scripts: maintainer script name ("postinst", ...) -> text (made executable).
    conffiles: absolute paths among `files` that dpkg must treat as configuration files.
    """
    for name, value in (("Package", package), ("Version", version), ("Architecture", arch)):
        _check_field(name, value)
    entries = _expand(files)
    for conf in conffiles:
        if not isinstance(entries.get(_normalise(conf)), tuple):
            raise TypeError(f"conffile {conf} is not a regular file of {package}")

    fields: list[tuple[str, str]] = [
        ("Package", package),
        ("Version", version),
        ("Architecture", arch),
        ("Maintainer", maintainer),
        ("Installed-Size", str(_installed_size_kib(entries))),
    ]
    if depends:
        fields.append(("Depends", ", ".join(depends)))
    for key, value in (extra_control or {}).items():
        _check_field(key, value)
        fields.append((key, value))
    fields.append(("Description", _description_field(package, description)))
    control = "".join(f"{k}: {v}\n" for k, v in fields).encode()

    md5sums = "".join(
        f"{hashlib.md5(entry[0]).hexdigest()}  {name}\n"
        for name, entry in sorted(entries.items())
        if isinstance(entry, tuple)
    ).encode()

    control_entries: dict[str, Entry] = {"control": (control, 0o644)}
    if md5sums:
        control_entries["md5sums"] = (md5sums, 0o644)
    if conffiles:
        text = "".join("/" + _normalise(c) + "\n" for c in conffiles)
        control_entries["conffiles"] = (text.encode(), 0o644)
    for name, text in (scripts or {}).items():
        if name not in MAINTAINER_SCRIPTS:
            raise ValueError(f"unknown maintainer script {name!r}")
        mode = 0o644 if name == "triggers" else 0o755
        control_entries[name] = (text.encode(), mode)

    control_tar = _gzip(_tar_bytes(control_entries, prefix="./", root_dir=True))
    data_tar = _gzip(_tar_bytes(entries, prefix="./", root_dir=True))
    deb = _ar(
        [
            ("debian-binary", b"2.0\n"),
            ("control.tar.gz", control_tar),
            ("data.tar.gz", data_tar),
        ]
    )
    out = Path(out_dir) / deb_filename(package, version, arch)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(out, deb)
    return out


def build_tgz(out_path: Path | str, members: Mapping[str, Entry]) -> Path:
    """Write a deterministic .tar.gz; member names are relative ('top/dir/file')."""
    entries = _expand(members)
    data = _gzip(_tar_bytes(entries, prefix="", root_dir=False))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(out, data)
    return out


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_control(deb: Path | str) -> str:
    """The control file text of a .deb (gzip or xz control member), for repo indexes."""
    import lzma

    raw = Path(deb).read_bytes()
    if not raw.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb}: not an ar archive")
    pos = 8
    while pos + 60 <= len(raw):
        header = raw[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = raw[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
        if name.startswith("control.tar"):
            if name.endswith(".gz"):
                body = gzip.decompress(body)
            elif name.endswith(".xz"):
                body = lzma.decompress(body)
            elif name != "control.tar":
                raise ValueError(f"{deb}: unsupported control member {name}")
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                for member in tar.getmembers():
                    if member.name.lstrip("./") == "control":
                        f = tar.extractfile(member)
                        assert f is not None
                        return f.read().decode()
            raise ValueError(f"{deb}: control member has no control file")
    raise ValueError(f"{deb}: no control.tar member")
