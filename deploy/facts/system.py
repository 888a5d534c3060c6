"""Facts about the node itself: disk, network, firewall, paths and systemd units."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase


class DiskFreeGB(FactBase):
    """Free space of the filesystem holding `path`, in GB (10^9 bytes)."""

    # pyinfra's Mounts lists filesystems without their free space.
    def command(self, path):
        return f"df -Pk -- {shlex.quote(path)} | tail -n 1"

    def process(self, output):
        fields = output[0].split()
        return int(fields[3]) * 1024 / 1e9


class IsMountPoint(FactBase):
    """True when `path` is a mount point of its own (a missing path is not one)."""

    # pyinfra's Mounts keeps state between its command() and process() (the kernel name),
    # which a fact read from the fact cache's batch does not have; `mountpoint -q` answers for
    # one path as systemd's ConditionPathIsMountPoint= does (a bind mount counts).
    def command(self, path):
        return f"if mountpoint -q -- {shlex.quote(path)}; then echo yes; else echo no; fi"

    @staticmethod
    def default():
        return False

    def process(self, output):
        return bool(output) and output[0].strip() == "yes"


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


class NetLinkTypes(FactBase):
    """{interface: ARP hardware type} from /sys/class/net/*/type (32 is ARPHRD_INFINIBAND)."""

    # pyinfra's NetworkDevices does not read the link type, which tells IPoIB from Ethernet.
    def command(self):
        return (
            'for d in /sys/class/net/*; do [ -r "$d/type" ] && echo "${d##*/} $(cat "$d/type")"; done; true'
        )

    @staticmethod
    def default():
        return {}

    def process(self, output):
        return {f[0]: int(f[1]) for f in (line.split() for line in output) if len(f) == 2 and f[1].isdigit()}


class ManagedFiles(FactBase):
    """Files in `directory` whose first line is `header`: what the toolkit wrote there."""

    # pyinfra's FindInFile reads one file; this finds ours among files named after anything.
    def command(self, directory: str, header: str):
        return (
            f'for f in {shlex.quote(directory)}/*; do [ -f "$f" ] && '
            f'head -n 1 "$f" | grep -qxF {shlex.quote(header)} && echo "$f"; done; true'
        )

    @staticmethod
    def default():
        return []

    def process(self, output):
        return sorted(line.strip() for line in output if line.strip())


class NetplanFeatures(FactBase):
    """The feature flags of the node's netplan (`netplan info`), or None without netplan."""

    # netplan rejects a key it does not know ("unknown key"), and 0.104 (Ubuntu 22.04 GA) does
    # not know infiniband-mode (feature "infiniband", since 0.105): ask before writing it.
    def command(self):
        return "command -v netplan >/dev/null && { echo netplan; netplan info --json 2>/dev/null; }; true"

    @staticmethod
    def default():
        return None

    def process(self, output):
        if not output or output[0].strip() != "netplan":
            return None
        try:
            info = json.loads("\n".join(output[1:]))
            return sorted(info["netplan.io"]["features"])
        except (ValueError, KeyError, TypeError):
            return []  # a netplan without `info --json`: no optional feature is known


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


# EFI global-variable GUID of SecureBoot and SetupMode (UEFI spec 2.x, 3.3 "Globally Defined
# Variables"); efivarfs files hold 4 attribute bytes, then the value.
EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"


class SecureBootState(FactBase):
    """ "enabled", "disabled" or "unknown" (with what was read), as the kernel will enforce it.

    `mokutil --sb-state` where it is installed (Ubuntu's shim-signed pulls it in); without it,
    a machine without /sys/firmware/efi booted through BIOS (no Secure Boot), and otherwise the
    efivars mokutil itself reads.
    """

    # pyinfra has no fact for it.
    def command(self):
        efivars = "/sys/firmware/efi/efivars"
        return (
            "if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state 2>&1; "
            "elif [ ! -d /sys/firmware/efi ]; then echo 'dtfact: no EFI'; "
            f"else echo dtfact: efivars "
            f"$(od -An -tu1 -j4 -N1 {efivars}/SecureBoot-{EFI_GLOBAL} 2>/dev/null || echo -) "
            f"$(od -An -tu1 -j4 -N1 {efivars}/SetupMode-{EFI_GLOBAL} 2>/dev/null || echo -); fi"
        )

    @staticmethod
    def default():
        return ("unknown", "no output")

    def process(self, output):
        return secure_boot_state(output)


def secure_boot_state(lines: list[str]) -> tuple[str, str]:
    """(state, what was read) from SecureBootState's output lines.

    mokutil's own words (src/mokutil.c, sb_state_internal, 0.3.0 in 20.04 to 0.6.0 in 22.04):
    "SecureBoot enabled" (plus "SecureBoot validation is disabled in shim" after
    `mokutil --disable-validation`), "SecureBoot disabled" (plus "Platform is in Setup Mode"),
    "Cannot determine secure boot state.", and on stderr "EFI variables are not supported on
    this system" (BIOS boot) or "This system doesn't support Secure Boot".
    """
    text = [line.strip() for line in lines if line.strip()]
    said = "; ".join(text) or "no output"
    if "SecureBoot validation is disabled in shim" in text:
        # shim sets MokSBStateRT and the kernel then treats Secure Boot as off
        # (drivers/firmware/efi/libstub/secureboot.c): unsigned modules load.
        return "disabled", said
    if "SecureBoot enabled" in text:
        return "enabled", said
    if (
        "SecureBoot disabled" in text
        or "EFI variables are not supported on this system" in text
        or "This system doesn't support Secure Boot" in text
        or "dtfact: no EFI" in text
    ):
        return "disabled", said
    efivars = next((line.split()[2:] for line in text if line.startswith("dtfact: efivars")), None)
    if efivars is not None and len(efivars) == 2:
        # mokutil's rule: enabled when SecureBoot is 1 and SetupMode 0.
        if efivars == ["1", "0"]:
            return "enabled", said
        if "-" not in efivars:
            return "disabled", said
    return "unknown", said
