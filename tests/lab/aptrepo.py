"""A flat apt repository (`deb URL /`) signed with the lab's own archive key.

NVIDIA's CUDA repositories are flat: Packages, Release, InRelease and Release.gpg sit beside
the .deb files in `.../cuda/repos/<distro>/x86_64/`. The lab mirror reproduces that layout so
that the deploy uses exactly the sources.list line, keyring path and origin pin it would use
against NVIDIA. Indexes are generated in pure Python (no apt-ftparchive needed); signing uses
gpg with a key generated once, without passphrase, in the lab's gpg home.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.lab.debs import SOURCE_DATE_EPOCH, read_control

LAB_KEY_UID = "DTLab archive signing key (lab only) <archive@dtlab.invalid>"

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class RepoError(RuntimeError):
    pass


def _gpg(gpg_home: Path, *args: str, input: bytes | None = None) -> bytes:
    cmd = [
        "gpg",
        "--homedir",
        str(gpg_home),
        "--batch",
        "--no-tty",
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
        *args,
    ]
    try:
        proc = subprocess.run(cmd, input=input, capture_output=True, check=False)
    except FileNotFoundError:
        raise RepoError("gpg not found: install Debian package 'gnupg'") from None
    if proc.returncode != 0:
        raise RepoError(
            f"{' '.join(cmd[:3])} {' '.join(args)} failed ({proc.returncode}): "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout


def ensure_signing_key(gpg_home: Path | str) -> str:
    """Create the lab archive key in gpg_home unless one exists; return its fingerprint."""
    home = Path(gpg_home)
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)  # gpg refuses to trust a group/world readable home
    fpr = _secret_fingerprint(home)
    if fpr:
        return fpr
    # ed25519: fast to generate, and gpgv in Debian 12 / Ubuntu 20.04+ verifies it.
    _gpg(home, "--quick-generate-key", LAB_KEY_UID, "ed25519", "sign", "never")
    fpr = _secret_fingerprint(home)
    if not fpr:
        raise RepoError(f"gpg created no secret key in {home}")
    return fpr


def _secret_fingerprint(home: Path) -> str | None:
    out = _gpg(home, "--with-colons", "--list-secret-keys").decode()
    want_fpr = False
    for line in out.splitlines():
        fields = line.split(":")
        if fields[0] == "sec":
            want_fpr = True
        elif fields[0] == "fpr" and want_fpr:
            return fields[9]
    return None


def export_public_keyring(gpg_home: Path | str) -> bytes:
    """The public key in binary form (`gpg --export`): the file a node's apt trusts."""
    home = Path(gpg_home)
    fpr = ensure_signing_key(home)
    data = _gpg(home, "--export", fpr)
    if not data:
        raise RepoError(f"gpg --export of {fpr} gave nothing")
    return data


def stop_gpg_agent(gpg_home: Path | str) -> None:
    """Stop the gpg-agent that signing started for this home (it would linger otherwise)."""
    if shutil.which("gpgconf"):
        subprocess.run(
            ["gpgconf", "--homedir", str(gpg_home), "--kill", "gpg-agent"],
            capture_output=True,
            check=False,
        )


def rfc2822(ts: int) -> str:
    """Release 'Date:' format, locale independent, in UTC as Debian writes it."""
    t = time.gmtime(ts)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} UTC"
    )


def packages_index(repo_dir: Path | str) -> str:
    """The text of a flat repo's Packages file for every *.deb in repo_dir."""
    repo = Path(repo_dir)
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        data = deb.read_bytes()
        control = read_control(deb).rstrip("\n")
        lines = control.split("\n")
        # Description (with its continuation lines) goes last, as apt-ftparchive writes it.
        desc_at = next((i for i, ln in enumerate(lines) if ln.startswith("Description:")), None)
        head, desc = (lines, []) if desc_at is None else (lines[:desc_at], lines[desc_at:])
        extra = [
            f"Filename: ./{deb.name}",
            f"Size: {len(data)}",
            f"MD5sum: {hashlib.md5(data).hexdigest()}",
            f"SHA1: {hashlib.sha1(data).hexdigest()}",
            f"SHA256: {hashlib.sha256(data).hexdigest()}",
        ]
        stanzas.append("\n".join(head + extra + desc) + "\n")
    return "\n".join(stanzas)


def build_flat_repo(
    repo_dir: Path | str,
    gpg_home: Path | str,
    origin: str,
    label: str,
    *,
    architectures: str = "amd64 all",
    date: int = SOURCE_DATE_EPOCH,
) -> None:
    """Write Packages, Packages.gz, Release, InRelease and Release.gpg in repo_dir.

    The Release file is deterministic (fixed Date); the signatures are not (gpg stamps them),
    which is why apt metadata is excluded from the mirror's pinned checksums.
    """
    repo = Path(repo_dir)
    if not repo.is_dir():
        raise RepoError(f"{repo}: no such repository directory")
    packages = packages_index(repo).encode()
    indexes = {
        "Packages": packages,
        "Packages.gz": gzip.compress(packages, compresslevel=9, mtime=0),
    }
    for name, data in indexes.items():
        (repo / name).write_bytes(data)

    release = [
        f"Origin: {origin}",
        f"Label: {label}",
        f"Architectures: {architectures}",
        f"Date: {rfc2822(date)}",
    ]
    for field, algo in (("MD5Sum", hashlib.md5), ("SHA1", hashlib.sha1), ("SHA256", hashlib.sha256)):
        release.append(f"{field}:")
        for name, data in indexes.items():
            release.append(f" {algo(data).hexdigest()} {len(data):>16} {name}")
    release_bytes = ("\n".join(release) + "\n").encode()
    (repo / "Release").write_bytes(release_bytes)

    home = Path(gpg_home)
    fpr = ensure_signing_key(home)
    inrelease = _gpg(
        home,
        "--local-user",
        fpr,
        "--digest-algo",
        "SHA256",
        "--clearsign",
        "--output",
        "-",
        input=release_bytes,
    )
    detached = _gpg(
        home,
        "--local-user",
        fpr,
        "--digest-algo",
        "SHA256",
        "--armor",
        "--detach-sign",
        "--output",
        "-",
        input=release_bytes,
    )
    (repo / "InRelease").write_bytes(inrelease)
    (repo / "Release.gpg").write_bytes(detached)
