#!/usr/bin/python3
# Stands in for ibstat/ibstatus/iblinkinfo of infiniband-diags @DIAGS_VERSION@ (MLNX_OFED @OFED_VERSION@); lab only.
"""InfiniBand diagnostics for a lab node whose 'HCA' is the veth link ib0.

One HCA, mlx5_0 (ConnectX-6, MT4123), one port, HDR 200 Gb/s. Port state follows the node's
real ib0 link: operstate "up" -> State Active / Physical state LinkUp; an administratively
down link -> Down / Disabled; any other state (no carrier) -> Down / Polling. GUIDs and LID
derive from ib0's MAC address, so they are stable per node. Installed three times, as
/usr/sbin/ibstat, /usr/sbin/ibstatus and /usr/sbin/iblinkinfo; argv[0] picks the tool.

Test-only environment override (never set on a node): DTLAB_STANDIN_SYSFS_NET (for
/sys/class/net), DTLAB_STANDIN_HOSTNAME.
"""

import os
import socket
import sys

SYSFS_NET = os.environ.get("DTLAB_STANDIN_SYSFS_NET", "/sys/class/net")
CA = "mlx5_0"
NETDEV = "ib0"
FIRMWARE = "20.35.2000"
IFF_UP = 0x1


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
    return {
        "guid": guid,
        "state": state,
        "phys": phys,
        "state_no": state_no,
        "phys_no": phys_no,
        "rate": 200 if active else 10,
        "lid": (tail[2] % 250) + 2 if active else 0,
        "sm_lid": 1 if active else 0,
    }


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
    p = port()
    if p is None:
        return no_device("ibstatus")
    if args and args[0] != CA:
        sys.stderr.write(
            f"Fatal error:  device '{args[0]}': sys files not found (/sys/class/infiniband/{args[0]}/ports)\n"
        )
        return 1
    rate = "200 Gb/sec (4X HDR)" if p["state"] == "Active" else "10 Gb/sec (4X SDR)"
    print(f"Infiniband device '{CA}' port 1 status:")
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
            f"      {p['guid']} {p['lid']:>6}    1[  ] ==( 4X      50.0 Gbps Active/  LinkUp)==>"
            '       1    1[  ] "MF0;lab-ib-switch:MQM8700/U1" ( )'
        )
    else:
        print(
            f"      {p['guid']} {p['lid']:>6}    1[  ] ==(                "
            f'Down/{p["phys"]:>8})==>             [  ] "" ( )'
        )
    return 0


TOOLS = {"ibstat": ibstat, "ibstatus": ibstatus, "iblinkinfo": iblinkinfo}


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
