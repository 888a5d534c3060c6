"""The InfiniBand fabric: the installed MLNX_OFED release and `ibstat` output."""

from __future__ import annotations

from pyinfra.api import FactBase


def parse_ofed_info(lines) -> str | None:
    """`ofed_info -s` -> "MLNX_OFED_LINUX-5.8-3.0.7.0" (the trailing colon dropped)."""
    for raw in lines:
        line = raw.strip()
        if line.startswith("MLNX_OFED_LINUX-"):
            return line.rstrip(":")
    return None


class OfedRelease(FactBase):
    """The installed MLNX_OFED release as `ofed_info -s` names it, or None."""

    def command(self):
        return "ofed_info -s 2>/dev/null || true"

    def process(self, output):
        return parse_ofed_info(output)


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
