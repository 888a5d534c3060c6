"""tests/lab/debs.py: deterministic .deb / .tar.gz output that dpkg accepts."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.lab.debs import (
    SOURCE_DATE_EPOCH,
    Directory,
    Symlink,
    build_deb,
    build_tgz,
    deb_filename,
    read_control,
)

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian)")

FILES = {
    "/usr/bin/hello": (b"#!/bin/sh\necho hello\n", 0o755),
    "/etc/hello/hello.conf": (b"greeting=hello\n", 0o644),
    "/usr/lib/x86_64-linux-gnu/libhello.so.1.2": (b"\x7fELF not really" * 100, 0o644),
    "/usr/lib/x86_64-linux-gnu/libhello.so.1": Symlink("libhello.so.1.2"),
    "/var/lib/hello": Directory(0o750),
}
POSTINST = '#!/bin/sh\nset -e\ntouch "$DPKG_ROOT/var/lib/hello/configured"\n'


def _build(out: Path) -> Path:
    return build_deb(
        out,
        "hello",
        "2:1.0-1",
        FILES,
        depends=["libc6 (>= 2.31)", "python3"],
        description="Say hello\nA longer text.\n\nSecond paragraph.",
        extra_control={"Section": "utils", "Provides": "greeter"},
        scripts={"postinst": POSTINST},
        conffiles=["/etc/hello/hello.conf"],
    )


def dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], capture_output=True, text=True, check=True).stdout


def test_same_input_gives_identical_bytes(tmp_path):
    a = _build(tmp_path / "a")
    b = _build(tmp_path / "b")
    assert a.name == b.name == "hello_1.0-1_amd64.deb"
    assert a.read_bytes() == b.read_bytes()


def test_different_content_gives_different_bytes(tmp_path):
    a = _build(tmp_path / "a")
    changed = dict(FILES)
    changed["/usr/bin/hello"] = (b"#!/bin/sh\necho bye\n", 0o755)
    b = build_deb(tmp_path / "b", "hello", "2:1.0-1", changed)
    assert hashlib.sha256(a.read_bytes()).digest() != hashlib.sha256(b.read_bytes()).digest()


def test_dpkg_deb_reads_control(tmp_path):
    deb = _build(tmp_path)
    info = dpkg_deb("--info", str(deb))
    assert "new Debian package, version 2.0." in info
    fields = {
        name: dpkg_deb("--field", str(deb), name).strip()
        for name in (
            "Package",
            "Version",
            "Architecture",
            "Maintainer",
            "Installed-Size",
            "Depends",
            "Provides",
            "Section",
        )
    }
    assert fields["Package"] == "hello"
    assert fields["Version"] == "2:1.0-1"
    assert fields["Architecture"] == "amd64"
    assert fields["Maintainer"] == "cudatools <cudatools@nvidia.com>"
    assert fields["Depends"] == "libc6 (>= 2.31), python3"
    assert fields["Provides"] == "greeter"
    assert int(fields["Installed-Size"]) >= 2
    desc = dpkg_deb("--field", str(deb), "Description")
    assert desc == "Say hello\n A longer text.\n .\n Second paragraph.\n"
    assert dpkg_deb("--info", str(deb), "conffiles") == "/etc/hello/hello.conf\n"
    assert dpkg_deb("--info", str(deb), "postinst") == POSTINST
    assert read_control(deb) == dpkg_deb("--info", str(deb), "control")


def test_dpkg_deb_lists_contents_with_parents_owner_and_modes(tmp_path):
    deb = _build(tmp_path)
    listing = {}
    for line in dpkg_deb("--contents", str(deb)).splitlines():
        perms, owner, _size, date, _time, name, *rest = line.split()
        listing[name] = (perms, owner, date, rest)
    for parent in ("./", "./usr/", "./usr/bin/", "./etc/", "./etc/hello/", "./var/", "./var/lib/"):
        assert listing[parent][0] == "drwxr-xr-x", parent
    assert listing["./var/lib/hello/"][0] == "drwxr-x---"
    assert listing["./usr/bin/hello"][0] == "-rwxr-xr-x"
    assert listing["./etc/hello/hello.conf"][0] == "-rw-r--r--"
    assert listing["./usr/lib/x86_64-linux-gnu/libhello.so.1"][3] == ["->", "libhello.so.1.2"]
    assert {owner for _, owner, _, _ in listing.values()} == {"root/root"}
    assert {date for _, _, date, _ in listing.values()} == {"2022-08-08"}
    names = [line.split()[5] for line in dpkg_deb("--contents", str(deb)).splitlines()]
    assert names == sorted(names)


def test_extracted_files_match_md5sums(tmp_path):
    deb = _build(tmp_path)
    root = tmp_path / "x"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    md5sums = dpkg_deb("--info", str(deb), "md5sums")
    assert len(md5sums.splitlines()) == 3  # regular files only
    for line in md5sums.splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.md5((root / name).read_bytes()).hexdigest() == digest
    assert os.readlink(root / "usr/lib/x86_64-linux-gnu/libhello.so.1") == "libhello.so.1.2"


@pytest.mark.skipif(os.geteuid() != 0, reason="dpkg --root installs need root")
def test_dpkg_installs_it_into_a_scratch_root(tmp_path):
    deb = _build(tmp_path)
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        "".join(
            f"Package: {p}\nStatus: install ok installed\nArchitecture: amd64\nVersion: 9\n"
            f"Maintainer: t <t@t>\nDescription: t\n\n"
            for p in ("libc6", "python3")
        )
    )
    proc = subprocess.run(
        ["dpkg", f"--root={root}", "--force-script-chrootless", "-i", str(deb)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (root / "var/lib/hello/configured").exists()  # postinst ran
    status = subprocess.run(
        ["dpkg-query", f"--root={root}", "-W", "-f=${Version} ${db:Status-Abbrev}", "hello"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert status.strip() == "2:1.0-1 ii"


def test_filename_drops_epoch():
    assert deb_filename("cuda-drivers", "515.65.01-1", "amd64") == "cuda-drivers_515.65.01-1_amd64.deb"
    assert deb_filename("x", "1:2.0-3", "all") == "x_2.0-3_all.deb"


@pytest.mark.parametrize(
    "files, kwargs, error",
    [
        ({"/usr/../etc/x": (b"", 0o644)}, {}, ValueError),
        ({"/usr/bin/x": ("text", 0o755)}, {}, TypeError),
        ({"/etc/x": (b"", 0o644), "/etc/x/y": (b"", 0o644)}, {}, ValueError),
        ({"/etc/x": (b"", 0o644)}, {"conffiles": ["/etc/missing"]}, TypeError),
        ({}, {"scripts": {"postinstall": "#!/bin/sh\n"}}, ValueError),
        ({}, {"extra_control": {"Section": "two\nlines"}}, ValueError),
    ],
)
def test_rejects_bad_input(tmp_path, files, kwargs, error):
    with pytest.raises(error):
        build_deb(tmp_path, "bad", "1.0", files, **kwargs)


def test_tgz_is_deterministic_and_complete(tmp_path):
    members = {
        "top/run.sh": (b"#!/bin/sh\n", 0o755),
        "top/DEBS/a.deb": (b"data", 0o644),
        "top/link": Symlink("run.sh"),
    }
    a = build_tgz(tmp_path / "a.tgz", members)
    b = build_tgz(tmp_path / "b.tgz", dict(reversed(list(members.items()))))
    assert a.read_bytes() == b.read_bytes()
    raw = a.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip header mtime 0
    assert gzip.decompress(raw)  # valid gzip
    with tarfile.open(a) as tar:
        infos = {m.name: m for m in tar.getmembers()}
    assert list(infos) == ["top", "top/DEBS", "top/DEBS/a.deb", "top/link", "top/run.sh"]
    assert infos["top/DEBS"].isdir()
    assert infos["top/run.sh"].mode == 0o755
    assert infos["top/link"].issym() and infos["top/link"].linkname == "run.sh"
    assert {m.mtime for m in infos.values()} == {SOURCE_DATE_EPOCH}
    assert {(m.uid, m.gid, m.uname) for m in infos.values()} == {(0, 0, "root")}
