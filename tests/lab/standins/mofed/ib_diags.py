#!/usr/bin/python3
# Stands in for ibstat/ibstatus/iblinkinfo/perfquery/sminfo of infiniband-diags @DIAGS_VERSION@ (MLNX_OFED @OFED_VERSION@); lab only.
"""InfiniBand diagnostics for a lab node whose 'HCA' is the veth link ib0.

One HCA, mlx5_0 (ConnectX-6, MT4123), one port, HDR 200 Gb/s. Port state follows the node's
real ib0 link: operstate "up" -> State Active / Physical state LinkUp; an administratively
down link -> Down / Disabled; any other state (no carrier) -> Down / Polling. GUIDs and LID
derive from ib0's MAC address, so they are stable per node. Installed as /usr/sbin/ibstat,
/usr/sbin/ibstatus, /usr/sbin/iblinkinfo, /usr/sbin/perfquery and /usr/sbin/sminfo; argv[0]
picks the tool.

The subnet manager: the lab's switch runs one (SWITCH_SM: LID 1, priority 0), so an up link is
Active as on a fabric whose managed switch runs its SM. While the opensm stand-in runs on this
node (its record in /run/ib-standin/opensm.json, its pid alive), it wins the election (same
priority, lower port GUID: the IBA's SM election) and ibstat's "SM lid" and sminfo name it.
sminfo prints rdma-core infiniband-diags/sminfo.c's line; with no SM to ask (the port not
Active, so its SM lid is 0) it fails as ibexit() does: "sminfo: iberror: failed: query" on
stdout, exit status 255.

Faults (lab only): /etc/dtlab/faults.json's "ib" mapping makes the port train down or flap:
  {"ib": {"rate": 100, "width": "2X",      # an active port at 100 Gb/s over 2 lanes
          "link_downed_per_read": 1}}      # LinkDownedCounter rises by 1 on every perfquery
The counter's reads are kept in /run/ib-standin/, so it starts at 0 again after a boot, like
the HCA's own counters.

Test-only environment overrides (never set on a node): DTLAB_STANDIN_SYSFS_NET (for
/sys/class/net), DTLAB_STANDIN_ETC_DIR (for /etc/dtlab), DTLAB_STANDIN_RUN_DIR (for
/run/ib-standin), DTLAB_STANDIN_HOSTNAME.
"""

import json
import os
import socket
import sys
import time

SYSFS_NET = os.environ.get("DTLAB_STANDIN_SYSFS_NET", "/sys/class/net")
CA = "mlx5_0"
NETDEV = "ib0"
FIRMWARE = "20.35.2000"
IFF_UP = 0x1
ETC_DIR = os.environ.get("DTLAB_STANDIN_ETC_DIR", "/etc/dtlab")
RUN_DIR = os.environ.get("DTLAB_STANDIN_RUN_DIR", "/run/ib-standin")
# Gb/s per lane -> InfiniBand speed name, as ibstatus prints it ("200 Gb/sec (4X HDR)").
SPEEDS = {2.5: "SDR", 5.0: "DDR", 10.0: "QDR", 14.0: "FDR", 25.0: "EDR", 50.0: "HDR", 100.0: "NDR"}
LANES = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}
# The SM of the lab's switch ("MF0;lab-ib-switch:MQM8700/U1" in iblinkinfo): the switch's LID 1,
# a port GUID above every lab port's (0x1070fd03...), opensm's default priority.
SWITCH_SM = {"lid": 1, "guid": "0xb8599f0300a0a0a0", "priority": 0}
SWEEP_INTERVAL = 10  # opensm's sweep_interval default, seconds: one activity count per sweep
# rdma-core infiniband-diags/sminfo.c: statestr[]
SM_STATES = ("SMINFO_NOTACT", "SMINFO_DISCOVER", "SMINFO_STANDBY", "SMINFO_MASTER")


def faults():
    """The "ib" faults of /etc/dtlab/faults.json, {} without the file or the key."""
    try:
        with open(os.path.join(ETC_DIR, "faults.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return {}
    ib = raw.get("ib") if isinstance(raw, dict) else None
    return ib if isinstance(ib, dict) else {}


def speed(rate, width):
    return SPEEDS.get(round(rate / LANES.get(width, 4), 1), "HDR")


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def port():
    base = os.path.join(SYSFS_NET, NETDEV)
    if not os.path.isdir(base):
        return None
    mac = read(os.path.join(base, "address"), "00:00:00:00:00:00").split(":")
    tail = [int(x, 16) for x in (mac + ["0"] * 6)[3:6]]
    guid = "0x1070fd0300" + "".join(f"{b:02x}" for b in tail)
    operstate = read(os.path.join(base, "operstate"), "down")
    try:
        admin_up = int(read(os.path.join(base, "flags"), "0x0"), 16) & IFF_UP
    except ValueError:
        admin_up = 0
    if operstate == "up":
        state, phys, state_no, phys_no = "Active", "LinkUp", 4, 5
    elif not admin_up:
        state, phys, state_no, phys_no = "Down", "Disabled", 1, 3
    else:
        state, phys, state_no, phys_no = "Down", "Polling", 1, 2
    active = state == "Active"
    fault = faults()
    return {
        "width": fault.get("width", "4X") if active else "4X",
        "guid": guid,
        "state": state,
        "phys": phys,
        "state_no": state_no,
        "phys_no": phys_no,
        "rate": fault.get("rate", 200) if active else 10,
        "lid": (tail[2] % 250) + 2 if active else 0,
        "sm_lid": 0,
    } | ({"sm_lid": master_sm(guid, (tail[2] % 250) + 2)["lid"]} if active else {})


def local_sm():
    """The opensm stand-in's record if its process runs: {"pid", "started", "priority"}."""
    try:
        with open(os.path.join(RUN_DIR, "opensm.json")) as f:
            record = json.load(f)
        with open(f"/proc/{int(record['pid'])}/cmdline", "rb") as f:
            if b"opensm" not in f.read():
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record


def uptime():
    try:
        return float(read("/proc/uptime", "0").split()[0])
    except (ValueError, IndexError):
        return 0.0


def sms(guid, lid):
    """The SMs this node's port sees, master first (higher priority, then the lower GUID)."""
    found = [dict(SWITCH_SM, activity=int(uptime()) // SWEEP_INTERVAL)]
    record = local_sm()
    if record is not None:
        since = max(0.0, time.time() - float(record.get("started", time.time())))
        found.append(
            {"lid": lid, "guid": guid, "priority": int(record.get("priority", 0)),
             "activity": int(since) // SWEEP_INTERVAL}
        )  # fmt: skip
    return sorted(found, key=lambda sm: (-sm["priority"], int(sm["guid"], 16)))


def master_sm(guid, lid):
    return sms(guid, lid)[0]


def no_device(prog):
    sys.stderr.write(
        f"ibpanic: [{os.getpid()}] main: stat of IB device '{CA}' failed: No such file or directory\n"
    )
    return 255


def ibstat(args):
    p = port()
    if p is None:
        return no_device("ibstat")
    if args and args[0] in ("-l", "--list_of_cas"):
        print(CA)
        return 0
    if args and args[0] in ("-p", "--port_list"):
        print(p["guid"])
        return 0
    short = bool(args) and args[0] in ("-s", "--short")
    if short:
        args = args[1:]
    if args and args[0].startswith("-"):
        sys.stderr.write(f"ibstat: unrecognized option '{args[0]}'\n")
        return 255
    if args and args[0] != CA:
        sys.stderr.write(
            f"ibpanic: [{os.getpid()}] main: '{args[0]}' IB device can't be found: "
            "No such file or directory\n"
        )
        return 255
    if len(args) > 1 and args[1] != "1":
        sys.stderr.write(f"ibpanic: [{os.getpid()}] main: {CA}: can't find port {args[1]}\n")
        return 255
    out = [
        f"CA '{CA}'",
        "\tCA type: MT4123",
        "\tNumber of ports: 1",
        f"\tFirmware version: {FIRMWARE}",
        "\tHardware version: 0",
        f"\tNode GUID: {p['guid']}",
        f"\tSystem image GUID: {p['guid']}",
    ]
    if short:
        out = out[:4]
    port_lines = [
        "\tPort 1:",
        f"\t\tState: {p['state']}",
        f"\t\tPhysical state: {p['phys']}",
        f"\t\tRate: {p['rate']}",
        f"\t\tBase lid: {p['lid']}",
        "\t\tLMC: 0",
        f"\t\tSM lid: {p['sm_lid']}",
        "\t\tCapability mask: 0xa651e848",
        f"\t\tPort GUID: {p['guid']}",
        "\t\tLink layer: InfiniBand",
    ]
    if len(args) > 1:  # ibstat mlx5_0 1: only the port, without the CA header
        out = [line.lstrip("\t") for line in port_lines[1:]]
    elif not short:
        out += port_lines
    print("\n".join(out))
    return 0


def gid(guid):
    g = guid[2:]
    return "fe80:0000:0000:0000:" + ":".join(g[i : i + 4] for i in range(0, 16, 4))


def ibstatus(args):
    """rdma-core infiniband-diags/scripts/ibstatus: `ibstatus [devname[:portnum]]`; a missing
    device is `fatal` (exit 255), a missing port prints its fields as "unknown"."""
    p = port()
    if p is None:
        return no_device("ibstatus")
    device, _, port_no = args[0].partition(":") if args else (CA, "", "")
    if device != CA:
        sys.stderr.write(
            f"Fatal error:  device '{device}': sys files not found (/sys/class/infiniband/{device}/ports)\n"
        )
        return 255
    port_no = port_no or "1"
    print(f"Infiniband device '{CA}' port {port_no} status:")
    if port_no != "1":
        for field in (
            "default gid:\t",
            "base lid:\t",
            "sm lid:\t\t",
            "state:\t\t",
            "phys state:\t",
            "rate:\t\t",
        ):
            print(f"\t{field} unknown")
        print("\tlink_layer:\t IB")
        print()
        return 0
    rate = f"{p['rate']} Gb/sec ({p['width']} {speed(p['rate'], p['width'])})"
    print(f"\tdefault gid:\t {gid(p['guid'])}")
    print(f"\tbase lid:\t 0x{p['lid']:x}")
    print(f"\tsm lid:\t\t 0x{p['sm_lid']:x}")
    print(f"\tstate:\t\t {p['state_no']}: {p['state'].upper()}")
    print(f"\tphys state:\t {p['phys_no']}: {p['phys']}")
    print(f"\trate:\t\t {rate}")
    print("\tlink_layer:\t InfiniBand")
    print()
    return 0


def hostname():
    name = os.environ.get("DTLAB_STANDIN_HOSTNAME") or read("/etc/hostname")
    return name or socket.gethostname()


def iblinkinfo(args):
    p = port()
    if p is None:
        return no_device("iblinkinfo")
    print(f"CA: {hostname()} {CA}:")
    if p["state"] == "Active":
        print(
            f"      {p['guid']} {p['lid']:>6}    1[  ] ==( {p['width']:<3} "
            f"{p['rate'] / LANES.get(p['width'], 4):>9.1f} Gbps Active/  LinkUp)==>"
            '       1    1[  ] "MF0;lab-ib-switch:MQM8700/U1" ( )'
        )
    else:
        print(
            f"      {p['guid']} {p['lid']:>6}    1[  ] ==(                "
            f'Down/{p["phys"]:>8})==>             [  ] "" ( )'
        )
    return 0


def link_downed():
    """LinkDownedCounter: rises by the fault's link_downed_per_read on every read (a flapping
    link), kept in /run so that it restarts at 0 with the node."""
    per_read = faults().get("link_downed_per_read", 0)
    path = os.path.join(RUN_DIR, "link-downed")
    try:
        with open(path) as f:
            count = int(f.read().strip() or 0)
    except (OSError, ValueError):
        count = 0
    if per_read:
        count += int(per_read)
        os.makedirs(RUN_DIR, exist_ok=True)
        with open(path, "w") as f:
            f.write(f"{count}\n")
    return count


def perfquery(args):
    """perfquery [-x] [lid|-C ca] [port]: the local port's counters (PortCounters attribute)."""
    p = port()
    if p is None:
        return no_device("perfquery")
    counters = [
        ("PortSelect", "1"),
        ("CounterSelect", "0x0000"),
        ("SymbolErrorCounter", "0"),
        ("LinkErrorRecoveryCounter", "0"),
        ("LinkDownedCounter", str(link_downed())),
        ("PortRcvErrors", "0"),
        ("PortRcvRemotePhysicalErrors", "0"),
        ("PortRcvSwitchRelayErrors", "0"),
        ("PortXmitDiscards", "0"),
        ("PortXmitConstraintErrors", "0"),
        ("PortRcvConstraintErrors", "0"),
        ("CounterSelect2", "0x00"),
        ("LocalLinkIntegrityErrors", "0"),
        ("ExcessiveBufferOverrunErrors", "0"),
        ("QP1Dropped", "0"),
        ("VL15Dropped", "0"),
        ("PortXmitData", "0"),
        ("PortRcvData", "0"),
        ("PortXmitPkts", "0"),
        ("PortRcvPkts", "0"),
        ("PortXmitWait", "0"),
    ]
    # infiniband-diags' dump format: the field name and ':' padded with dots to 33 columns.
    print(f"# Port counters: Lid {p['lid']} port 1 (CapMask: 0x5A00)")
    for name, value in counters:
        print(f"{name + ':':.<33}{value}")
    return 0


def sminfo(args):
    """sminfo [sm_lid]: the SMInfo of the SM the local port names (its SM lid), or of `sm_lid`
    (rdma-core infiniband-diags/sminfo.c; its output line and ibexit()'s failures)."""
    p = port()
    if p is None:  # mad_rpc_open_port() failed: no umad device
        sys.stderr.write(f"ibwarn: [{os.getpid()}] mad_rpc_open_port: can't open UMAD port ((null):0)\n")
        print("sminfo: iberror: failed: Failed to open '(null)' port '0'")
        return 255
    wanted = [a for a in args if not a.startswith("-")]
    if p["state"] != "Active":  # SM lid 0: nobody answers the query
        print("sminfo: iberror: failed: query")
        return 255
    found = sms(p["guid"], p["lid"])
    lid = int(wanted[0], 0) if wanted and wanted[0].isdigit() else found[0]["lid"]
    for i, sm in enumerate(found):
        if sm["lid"] == lid:
            state = 3 if i == 0 else 2
            print(
                f"sminfo: sm lid {sm['lid']} sm guid {sm['guid']}, activity count {sm['activity']} "
                f"priority {sm['priority']} state {state} {SM_STATES[state]}"
            )
            return 0
    print("sminfo: iberror: failed: query")
    return 255


TOOLS = {
    "ibstat": ibstat,
    "ibstatus": ibstatus,
    "iblinkinfo": iblinkinfo,
    "perfquery": perfquery,
    "sminfo": sminfo,
}


def main(argv):
    prog = os.path.basename(argv[0])
    tool = TOOLS.get(prog)
    if tool is None:  # run by path from the source tree: the tool name comes first
        if len(argv) > 1 and argv[1] in TOOLS:
            return TOOLS[argv[1]](argv[2:])
        sys.stderr.write(f"{prog}: run as one of {', '.join(TOOLS)}\n")
        return 2
    return tool(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
