"""Facts the GPU and fabric roles need that pyinfra does not ship.

Every command here exits 0 even when the thing it asks about is absent: pyinfra marks a
host failed when a fact's command fails.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class HeldPackages(FactBase):
    """Names of the packages `apt-mark hold` holds (a set)."""

    def command(self):
        return "apt-mark showhold 2>/dev/null || true"

    @staticmethod
    def default():
        return set()

    def process(self, output):
        return {line.strip() for line in output if line.strip()}


def parse_madison(lines) -> dict[str, set[tuple[str, str]]]:
    """`apt-cache madison` lines -> {package: {(version, repo URL without trailing /)}}.

    A line is `  pkg | version | URL [suite/component] Packages`; a flat repo (`deb URL /`)
    shows the URL alone before `Packages`.
    """
    found: dict[str, set[tuple[str, str]]] = {}
    for line in lines:
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3 or not parts[0] or not parts[1]:
            continue
        source = parts[2].split()
        if not source:
            continue
        found.setdefault(parts[0], set()).add((parts[1], source[0].rstrip("/")))
    return found


class AptRepoVersions(FactBase):
    """Versions apt's cache offers for `packages`, with the repo each comes from.

    {package: {(version, repo_url)}}; packages apt does not know are absent.
    """

    def command(self, packages):
        names = " ".join(shlex.quote(p) for p in packages)
        return f"apt-cache madison {names} 2>/dev/null || true"

    @staticmethod
    def default():
        return {}

    def process(self, output):
        return parse_madison(output)


def parse_ofed_info(lines) -> str | None:
    """`ofed_info -s` -> "MLNX_OFED_LINUX-5.8-3.0.7.0" (the trailing colon dropped)."""
    for line in lines:
        line = line.strip()
        if line.startswith("MLNX_OFED_LINUX-"):
            return line.rstrip(":")
    return None


class OfedRelease(FactBase):
    """The installed MLNX_OFED release as `ofed_info -s` names it, or None."""

    def command(self):
        return "ofed_info -s 2>/dev/null || true"

    def process(self, output):
        return parse_ofed_info(output)


class ResolvedPath(FactBase):
    """Where `path` leads after following every symlink, or None if it does not exist."""

    def command(self, path):
        return f"readlink -e -- {shlex.quote(path)} || true"

    def process(self, output):
        return output[0].strip() if output and output[0].strip() else None


class RebootRequiredPackages(FactBase):
    """Packages listed in /run/reboot-required.pkgs (Debian's "reboot needed" note), a set.

    /run is a tmpfs: the list is empty again after a reboot.
    """

    def command(self):
        return "cat /run/reboot-required.pkgs 2>/dev/null || true"

    @staticmethod
    def default():
        return set()

    def process(self, output):
        return {line.strip() for line in output if line.strip()}


def parse_ibstat(lines) -> dict[tuple[str, int], dict[str, str]]:
    """`ibstat` -> {(ca, port): {"State": "Active", "Physical state": "LinkUp", ...}}.

    ibstat indents a CA's fields and its "Port N:" lines once, a port's fields twice.
    """
    ports: dict[tuple[str, int], dict[str, str]] = {}
    ca: str | None = None
    port: tuple[str, int] | None = None
    port_indent = 0
    for raw in lines:
        text = raw.expandtabs(8)
        line = text.strip()
        if not line:
            continue
        indent = len(text) - len(text.lstrip())
        if line.startswith("CA '") and line.endswith("'"):
            ca, port = line[4:-1], None
        elif ca is not None and line.startswith("Port ") and line.endswith(":") and line[5:-1].isdigit():
            port, port_indent = (ca, int(line[5:-1])), indent
            ports[port] = {}
        elif port is not None and indent > port_indent and ":" in line:
            key, _, value = line.partition(":")
            ports[port][key.strip()] = value.strip()
        else:
            port = None
    return ports
