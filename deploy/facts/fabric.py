"""The InfiniBand fabric: the installed MLNX_OFED release and `ibstat` output."""

from __future__ import annotations

import re

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


# rdma-core infiniband-diags/sminfo.c: on success one line,
#   printf("sminfo: sm lid %d sm guid 0x%" PRIx64 ", activity count %u priority %d state %d %s\n", ...)
# with the state's name from SMINFO_NOTACT, SMINFO_DISCOVER, SMINFO_STANDBY, SMINFO_MASTER; when no
# SM answers, ibexit() (infiniband-diags/ibdiag_common.c) prints "sminfo: iberror: failed: query"
# (or "... can't resolve sm port ...") on stdout and exits -1 (status 255).
SMINFO_LINE = re.compile(
    r"sminfo: sm lid (?P<lid>\d+) sm guid (?P<guid>0x[0-9a-fA-F]+), activity count (?P<activity>\d+) "
    r"priority (?P<priority>\d+) state (?P<state>\d+) (?P<name>\S+)"
)
SMINFO_FAILED = re.compile(r"^\S*sminfo: iberror: (?:\[pid \d+\] \S+: )?failed: (?P<why>.*)$", re.M)


def no_linked_port(ports: dict[tuple[str, int], dict[str, str]]) -> str | None:
    """Why no SM can be asked from this node, or None: sminfo asks over a port whose link is up
    (physical state LinkUp). An InfiniBand port that is LinkUp but not Active (Initializing) is
    what an unmanaged fabric leaves, so it is not a reason: that is the SM's row to fail."""
    ib = {k: v for k, v in ports.items() if v.get("Link layer", "InfiniBand") == "InfiniBand"}
    if not ib:
        return "no InfiniBand port"
    if any(v.get("Physical state") == "LinkUp" for v in ib.values()):
        return None
    shown = ", ".join(f"{ca}/{n} {v.get('Physical state', '?')}" for (ca, n), v in sorted(ib.items()))
    return f"no InfiniBand port is linked up ({shown})"


def parse_sminfo(output: str) -> dict[str, str | int] | None:
    """`sminfo` -> {"lid": 1, "guid": "0x...", "activity": 42, "priority": 0, "state": 3,
    "name": "SMINFO_MASTER"}; a failure -> {"failed": "query"}; anything else -> None."""
    found = SMINFO_LINE.search(output)
    if found:
        fields: dict[str, str | int] = {
            k: int(v) if k in ("lid", "activity", "priority", "state") else v
            for k, v in found.groupdict().items()
        }
        return fields
    failed = SMINFO_FAILED.search(output)
    if failed:
        return {"failed": failed["why"].strip()}
    return None
