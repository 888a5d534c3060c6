"""Facts about the node itself: disk, network, firewall, paths and systemd units."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class DiskFreeGB(FactBase):
    """Free space of the filesystem holding `path`, in GB (10^9 bytes)."""

    # pyinfra's Mounts lists filesystems without their free space.
    def command(self, path):
        return f"df -Pk {path} | tail -n 1"

    def process(self, output):
        fields = output[0].split()
        return int(fields[3]) * 1024 / 1e9


class NetDevice(FactBase):
    """State of one network interface: up flag, MTU and IPv4 addresses with prefix."""

    # pyinfra's NetworkDevices reports the operational state (UNKNOWN on a link without
    # carrier detection), not the administrative UP flag, and reads every interface.
    def command(self, interface):
        return (
            f"ip -o -4 addr show dev {interface} 2>/dev/null; "
            f"ip -o link show dev {interface} 2>/dev/null || true"
        )

    @staticmethod
    def default():
        return {"up": False, "mtu": None, "addresses": []}

    def process(self, output):
        up, mtu, addresses = False, None, []
        for line in output:
            fields = line.split()
            if "inet" in fields:
                addresses.append(fields[fields.index("inet") + 1])
            elif "mtu" in fields:
                up = "UP" in fields[2].strip("<>").split(",")
                mtu = int(fields[fields.index("mtu") + 1])
        return {"up": up, "mtu": mtu, "addresses": addresses}


class FirewallRules(FactBase):
    """`iptables-save` and `ip6tables-save` output ({} when iptables is absent)."""

    # pyinfra's IptablesRules reads one table of one tool and fails without iptables.
    def command(self):
        return (
            "for t in iptables ip6tables; do "
            'if command -v $t-save >/dev/null; then echo "@@ $t"; $t-save; fi; done'
        )

    @staticmethod
    def default():
        return {}

    def process(self, output):
        dumps: dict[str, list[str]] = {}
        current = None
        for line in output:
            if line.startswith("@@ "):
                current = line[3:]
                dumps[current] = []
            elif current:
                dumps[current].append(line)
        return dumps


class ResolvedPath(FactBase):
    """Where `path` leads after following every symlink, or None if it does not exist."""

    # pyinfra's Link gives one link's target; /usr/local/cuda is a chain of two.
    def command(self, path):
        return f"readlink -e -- {shlex.quote(path)} || true"

    def process(self, output):
        return output[0].strip() if output and output[0].strip() else None


class UnitState(FactBase):
    """(ActiveState, UnitFileState) of one unit: ("active", "enabled"), ("inactive", "disabled"),
    ("activating", ...) while Restart= waits; ("inactive", "") when the unit does not exist."""

    # pyinfra's SystemdStatus says running or not: "failed" and "activating" look alike there.
    def command(self, unit: str):
        return (
            f"systemctl show --property ActiveState --property UnitFileState "
            f"{shlex.quote(unit)} 2>/dev/null; true"
        )

    @staticmethod
    def default():
        return ("inactive", "")

    def process(self, output):
        values = dict(line.strip().partition("=")[::2] for line in output if "=" in line)
        return values.get("ActiveState") or "inactive", values.get("UnitFileState", "")
