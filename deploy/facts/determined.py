"""The per-domain Determined agents on a node (roles/determined/domains.py)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase


@dataclass(frozen=True)
class Instance:
    config: bool = False  # <config_dir>/agent-<i>.yaml exists
    enabled: bool = False  # a *.wants/determined-agent@<i>.service link exists
    active: str = "inactive"  # systemd ActiveState ("active", "activating", "failed", ...)


_CONFIG_LINE = re.compile(r"^config .*/agent-([0-9]+)\.yaml$")
_WANTS_LINE = re.compile(r"^enabled determined-agent@([0-9]+)\.service$")
_UNIT_LINE = re.compile(r"^unit determined-agent@([0-9]+)\.service \S+ (\S+)")


class DomainAgents(FactBase):
    """{"0": Instance(...), ...}: every per-domain agent a node has, by instance index.

    From three places, so that nothing half-removed is missed: the configs, the enablement
    links, and the units systemd has loaded (running, restarting or failed).
    """

    # One command for all three: pyinfra's FindFiles/FindLinks/SystemdStatus would be three
    # reads, and SystemdStatus cannot tell a failed unit (to reset) from an inactive one.
    def command(self, config_dir: str):
        return (
            f'for f in {shlex.quote(config_dir)}/agent-*.yaml; do [ -e "$f" ] && echo "config $f"; done; '
            "for f in /etc/systemd/system/*.wants/determined-agent@*.service; do "
            '[ -L "$f" ] || [ -e "$f" ] && echo "enabled ${f##*/}"; done; '
            "systemctl list-units --all --plain --no-legend --no-pager "
            "'determined-agent@*.service' 2>/dev/null | sed 's/^/unit /'; true"
        )

    @staticmethod
    def default():
        return {}

    def process(self, output):
        found: dict[str, dict] = {}
        for raw in output:
            line = raw.strip()
            for pattern, key in ((_CONFIG_LINE, "config"), (_WANTS_LINE, "enabled"), (_UNIT_LINE, "active")):
                m = pattern.match(line)
                if m:
                    value = m.group(2) if key == "active" else True
                    found.setdefault(m.group(1), {})[key] = value
        return {index: Instance(**fields) for index, fields in found.items()}
