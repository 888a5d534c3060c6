"""Facts the node-base roles need that pyinfra does not ship."""

from pyinfra.api import FactBase


class DiskFreeGB(FactBase):
    """Free space of the filesystem holding `path`, in GB (10^9 bytes)."""

    def command(self, path):
        return f"df -Pk {path} | tail -n 1"

    def process(self, output):
        fields = output[0].split()
        return int(fields[3]) * 1024 / 1e9


class ProcessUnit(FactBase):
    """The systemd unit a process belongs to (from its cgroup), or None."""

    def command(self, pid):
        return f"cat /proc/{int(pid)}/cgroup 2>/dev/null || true"

    def process(self, output):
        for line in output:
            for part in reversed(line.split(":", 2)[-1].split("/")):
                if part.endswith((".service", ".scope")):
                    return part
        return None


class NetDevice(FactBase):
    """State of one network interface: up flag, MTU and IPv4 addresses with prefix."""

    def command(self, interface):
        return (
            f"ip -o -4 addr show dev {interface} 2>/dev/null; "
            f"ip -o link show dev {interface} 2>/dev/null || true"
        )

    @staticmethod
    def default():
        return {"up": False, "mtu": None, "addresses": []}

    def process(self, output):
        info = {"up": False, "mtu": None, "addresses": []}
        for line in output:
            fields = line.split()
            if "inet" in fields:
                info["addresses"].append(fields[fields.index("inet") + 1])
            elif "mtu" in fields:
                flags = fields[2].strip("<>").split(",")
                info["up"] = "UP" in flags
                info["mtu"] = int(fields[fields.index("mtu") + 1])
        return info


class FirewallRules(FactBase):
    """`iptables-save` and `ip6tables-save` output ({} when iptables is absent)."""

    def command(self):
        return (
            "for t in iptables ip6tables; do "
            'if command -v $t-save >/dev/null; then echo "@@ $t"; $t-save; fi; done'
        )

    @staticmethod
    def default():
        return {}

    def process(self, output):
        dumps, current = {}, None
        for line in output:
            if line.startswith("@@ "):
                current = line[3:]
                dumps[current] = []
            elif current:
                dumps[current].append(line)
        return dumps
