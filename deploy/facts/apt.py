"""Facts about apt that pyinfra does not read: holds and the versions the sources offer."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class HeldPackages(FactBase):
    """Names of the packages `apt-mark hold` holds (a set)."""

    # pyinfra's DebPackages lists versions, not holds.

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

    # pyinfra's facts say what is installed; this says what the sources offer, and from where.

    def command(self, packages):
        names = " ".join(shlex.quote(p) for p in packages)
        return f"apt-cache madison {names} 2>/dev/null || true"

    @staticmethod
    def default():
        return {}

    def process(self, output):
        return parse_madison(output)
