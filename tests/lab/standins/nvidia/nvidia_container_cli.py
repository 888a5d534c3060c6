#!/usr/bin/python3 -I
# Stands in for NVIDIA's nvidia-container-cli @VERSION@ (package libnvidia-container-tools); lab only.
"""nvidia-container-cli for lab nodes: `--version`, `info` and `configure`, as
NVIDIA/libnvidia-container's src/cli does them, over the lab's stand-in driver.

configure (src/cli/configure.c configure_command), in the real order:
1. nvc_init: the driver must be loaded and match the userspace libraries, else
   "initialization error: nvml error: driver not loaded" / "... driver/library version mismatch".
2. driver and device info: the driver version (the loaded module), its CUDA version
   (cuDriverGetVersion of the driver's libcuda, src/nvc_info.c), the GPUs.
3. select_devices (src/cli/common.c): `all`, `none`, or indexes / UUIDs / PCI bus ids;
   anything else: "device error: unknown device id: X".
4. the --require expressions (src/cli/dsl.c dsl_evaluate), per visible GPU, else globally:
   space-separated alternatives, each a comma-separated conjunction of cuda/driver/arch/brand
   comparisons; an unmet one: "requirement error: unsatisfied condition: <first alternative>",
   with ", please update your driver to a newer version, or use an earlier cuda container"
   when it starts with "cuda>=". Every error is warnx()'s "nvidia-container-cli: " line, exit 1.
5. nvc_driver_mount (src/nvc_mount.c), inside the container's mount namespace before its
   pivot_root: read-only bind mounts of the driver's binaries (utility: nvidia-smi, ...) and
   libraries (utility: libnvidia-ml.so.<version>; compute: libcuda.so.<version>) at the same
   paths in the rootfs, the persistenced socket, the driver's state (the real one mounts
   /proc/driver/nvidia; the stand-in driver's state is /run/nvidia-standin, and the GPUs it
   "has" are /etc/dtlab/gpu-topology.json), and the device nodes /dev/nvidiactl,
   /dev/nvidia-uvm, /dev/nvidia-uvm-tools and /dev/nvidia<minor> of the selected GPUs, each
   allowed in the container's device cgroup unless --no-cgroups.
6. nvc_ldcache_update (src/nvc_ldcache.c): ldconfig run for the rootfs ("@path": the host's
   binary), so libcuda.so.1 and libnvidia-ml.so.1 resolve in the container.

Test-only environment overrides (never set on a node): DTLAB_STANDIN_RUN_DIR, DTLAB_STANDIN_LIBDIR.
"""

import ctypes
import os
import re
import stat
import subprocess
import sys

RUN_DIR = os.environ.get("DTLAB_STANDIN_RUN_DIR", "/run/nvidia-standin")
TOPOLOGY = "/etc/dtlab/gpu-topology.json"
LIBDIR = os.environ.get("DTLAB_STANDIN_LIBDIR", "/usr/lib/x86_64-linux-gnu")
BINDIR = "/usr/bin"
PERSISTENCED_SOCKET = "/run/nvidia-persistenced/socket"
# src/nvc_info.c: the driver's files per capability (those the lab's driver packages ship
# are found; the rest are skipped, as the real cli skips what a driver lacks).
BINARIES = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
LIBRARIES = {
    "utility": ("libnvidia-ml.so",),
    "compute": ("libcuda.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so"),
}
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
CLONE_NEWNS = 0x00020000
UPDATE_MSG = ", please update your driver to a newer version, or use an earlier cuda container"


class CliError(Exception):
    """One warnx() line: "nvidia-container-cli: <message>", exit 1."""


# --- src/cli/dsl.c ------------------------------------------------------------------------


def compare_version(v1: str, cmp: str, v2: str) -> bool | None:
    """dsl_compare_version: numeric components left to right, trailing ".0"s ignored."""
    if not re.fullmatch(r"[0-9.]*", v1) or not re.fullmatch(r"[0-9.]*", v2):
        return None
    a = [int(x) for x in v1.split(".") if x != ""]
    b = [int(x) for x in v2.split(".") if x != ""]
    for n1, n2 in zip(a, b, strict=False):
        if n1 != n2:
            return {"=": False, "!=": True, "<": n1 < n2, "<=": n1 < n2, ">": n1 > n2, ">=": n1 > n2}[cmp]
    rest1 = any(a[len(b) :])
    rest2 = any(b[len(a) :])
    if cmp == "!=":
        return rest1 or rest2
    if not rest1 and not rest2:
        return cmp in ("=", "<=", ">=")
    if cmp in ("<", "<="):
        return not rest1 and rest2
    if cmp in (">", ">="):
        return rest1 and not rest2
    return False


def evaluate_rule(expr: str, facts: dict) -> bool | None:
    m = re.fullmatch(r"([^<>=!]+)([<>=!]+)(.+)", expr)
    if m is None or m.group(2) not in ("=", "!=", "<", "<=", ">", ">="):
        return None
    name, cmp, value = m.group(1).lower(), m.group(2), m.group(3)
    if name not in ("cuda", "driver", "arch", "brand"):
        return None
    have = facts.get(name)
    if have is None:  # no device visible / unknown: the real rules assume it is fine
        return True
    if name == "brand":
        if cmp not in ("=", "!="):
            return None
        return (have.lower() == value.lower()) == (cmp == "=")
    return compare_version(have, cmp, value)


def evaluate(predicate: str, facts: dict) -> None:
    """dsl_evaluate: raises CliError when `predicate` is not met or not an expression."""
    ok = True
    for alternative in (a for a in predicate.split(" ") if a):
        ok = True
        for expr in (e for e in alternative.split(",") if e):
            result = evaluate_rule(expr, facts)
            if result is None:
                raise CliError("requirement error: invalid expression")
            if not result:
                ok = False
                break
        if ok:
            return
    if not ok:
        first = predicate.split(" ")[0]
        raise CliError(
            f"requirement error: unsatisfied condition: {first}{UPDATE_MSG if first.startswith('cuda>=') else ''}"
        )


# --- driver and devices ---------------------------------------------------------------------


def driver_state() -> str:
    """nvc_init: the loaded driver must be this userspace's (nvidia-smi's exit status tells)."""
    try:
        rc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode
    except FileNotFoundError:
        rc = 9
    if rc == 18:
        raise CliError("initialization error: nvml error: driver/library version mismatch")
    if rc != 0:
        raise CliError("initialization error: nvml error: driver not loaded")
    try:
        with open(os.path.join(RUN_DIR, "loaded-version")) as f:
            return f.read().strip()
    except OSError:
        raise CliError("initialization error: nvml error: driver not loaded") from None


def cuda_version(driver: str) -> str | None:
    """cuDriverGetVersion of the driver's own libcuda (src/nvc_info.c driver_get_cuda_version)."""
    try:
        lib = ctypes.CDLL(os.path.join(LIBDIR, f"libcuda.so.{driver}"))
    except OSError:
        return None
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def gpus() -> list[dict]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            found.append({"index": parts[0], "uuid": parts[1], "bus_id": parts[2], "name": parts[3]})
    return found


def select_devices(wanted: str, available: list[dict]) -> list[dict]:
    """src/cli/common.c select_devices."""
    if wanted in ("", "none"):
        return []
    if wanted == "all":
        return list(available)
    chosen = []
    for ident in wanted.split(","):
        match = [
            g
            for g in available
            if ident in (g["index"], g["uuid"])
            or ident.lower() in (g["bus_id"].lower(), g["bus_id"].lower().removeprefix("0000"))
        ]
        if not match:
            raise CliError(f"device error: unknown device id: {ident}")
        chosen += [g for g in match if g not in chosen]
    return chosen


# --- mounts ---------------------------------------------------------------------------------


def enter_mount_namespace(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNS) != 0:
            raise CliError(f"mount error: setns: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    os.chdir("/")


def _target(rootfs: str, path: str, is_dir: bool) -> str:
    target = os.path.join(rootfs, path.lstrip("/"))
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            open(target, "a").close()
    return target


def bind(rootfs: str, src: str, read_only: bool = True) -> None:
    target = _target(rootfs, src, os.path.isdir(src))
    opts = ["--bind", "-o", "ro,nosuid"] if read_only else ["--bind", "-o", "nosuid"]
    proc = subprocess.run(["mount", *opts, src, target], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CliError(f"mount error: mount operation failed: {target}: {proc.stderr.strip()}")


def allow_device(pid: int, path: str) -> None:
    """The device cgroup (v1) rule the real cli writes for each device it mounts."""
    st = os.stat(path)
    rule = f"c {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} rw"
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, cgroup = line.rstrip("\n").split(":", 2)
            if "devices" in controllers.split(","):
                with open(f"/sys/fs/cgroup/devices{cgroup}/devices.allow", "w") as allow:
                    allow.write(rule)
                return


def driver_files(driver: str, caps: list[str]) -> list[str]:
    files = []
    for cap in caps:
        files += [os.path.join(BINDIR, b) for b in BINARIES.get(cap, ())]
        files += [os.path.join(LIBDIR, f"{lib}.{driver}") for lib in LIBRARIES.get(cap, ())]
    return [f for f in files if os.path.exists(f)]


def device_nodes(selected: list[dict]) -> list[str]:
    nodes = list(CONTROL_DEVICES) + [f"/dev/nvidia{g['index']}" for g in selected]
    return [n for n in nodes if os.path.exists(n)]


def configure(ctx: dict) -> None:
    driver = driver_state()
    facts = {"driver": driver, "cuda": cuda_version(driver)}
    available = gpus()
    selected = select_devices(ctx["device"], available)
    for g in selected or [None]:
        device_facts = dict(facts, arch="8.0", brand="Nvidia") if g else facts
        for req in ctx["require"]:
            evaluate(req, device_facts)

    rootfs, pid = ctx["rootfs"], ctx["pid"] or os.getppid()
    devices = device_nodes(selected) if selected else []
    enter_mount_namespace(pid)
    for path in driver_files(driver, ctx["caps"]):
        bind(rootfs, path)
    if os.path.exists(PERSISTENCED_SOCKET) and {"utility", "compute"} & set(ctx["caps"]):
        bind(rootfs, PERSISTENCED_SOCKET)
    for path in (RUN_DIR, TOPOLOGY):
        if os.path.exists(path):
            bind(rootfs, path)
    for node in devices:
        bind(rootfs, node, read_only=False)
        if not ctx["no_cgroups"] and stat.S_ISCHR(os.stat(node).st_mode):
            allow_device(pid, node)
    ldconfig = ctx["ldconfig"].removeprefix("@") or "/sbin/ldconfig"
    proc = subprocess.run(
        [ldconfig, "-r", rootfs, "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache", LIBDIR],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise CliError(f"ldcache error: process {ldconfig} failed with error code: {proc.returncode}")


# --- command line ---------------------------------------------------------------------------


def parse_configure(args: list[str]) -> dict:
    ctx = {
        "pid": 0,
        "device": "",
        "require": [],
        "ldconfig": "",
        "caps": [],
        "no_cgroups": False,
        "rootfs": None,
    }
    caps = {"--compute": "compute", "--utility": "utility", "--video": "video", "--graphics": "graphics"}
    caps |= {"--display": "display", "--compat32": "compat32"}
    for arg in args:
        name, _, value = arg.partition("=")
        if name in ("--pid", "-p"):
            if not value.isdigit():
                raise CliError(f"input error: invalid process id: {value}")
            ctx["pid"] = int(value)
        elif name in ("--device", "-d"):
            ctx["device"] = f"{ctx['device']},{value}" if ctx["device"] else value
        elif name in ("--require", "-r"):
            ctx["require"].append(value)
        elif name in ("--ldconfig", "-l"):
            ctx["ldconfig"] = value
        elif name in caps:
            ctx["caps"].append(caps[name])
        elif name == "--no-cgroups":
            ctx["no_cgroups"] = True
        elif name in ("--no-devbind", "--mig-config", "--mig-monitor", "--imex-channel"):
            pass
        elif arg.startswith("-"):
            raise CliError(f"configure: unrecognized option '{arg}'")
        elif ctx["rootfs"] is None:
            if not arg.startswith("/") or arg == "/":
                raise CliError("input error: invalid rootfs directory")
            ctx["rootfs"] = arg
    if ctx["rootfs"] is None:
        raise CliError("configure: missing ROOTFS")
    return ctx


def info() -> None:
    driver = driver_state()
    print(f"NVRM version:   {driver}")
    print(f"CUDA version:   {cuda_version(driver) or 'N/A'}")
    print()
    for g in gpus():
        print(f"Device Index:   {g['index']}")
        print(f"Device Minor:   {g['index']}")
        print(f"Model:          {g['name']}")
        print("Brand:          Nvidia")
        print(f"GPU UUID:       {g['uuid']}")
        print(f"Bus Location:   {g['bus_id']}")
        print("Architecture:   8.0")
        print()


GLOBAL_FLAGS = ("--load-kmods", "-k", "--no-pivot", "--no-create-imex-channels")
GLOBAL_VALUES = ("--root", "--debug", "--ldcache", "--user", "-r", "-d", "-l", "-u")


def main(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-V"]):
        print("cli-version: @VERSION@")
        print("lib-version: @VERSION@")
        print("build date: 2023-07-18T11:00+00:00")
        print("build revision: @COMMIT@")
        print("build platform: x86_64")
        return 0
    args = list(argv)
    while args and (args[0] in GLOBAL_FLAGS or args[0].partition("=")[0] in GLOBAL_VALUES):
        args.pop(0)  # --load-kmods: nvidia-modprobe, which has nothing to load in the lab
    try:
        if args[:1] == ["info"]:
            info()
        elif args[:1] == ["configure"]:
            configure(parse_configure(args[1:]))
        else:
            print("Usage: nvidia-container-cli [OPTION...] info|list|configure", file=sys.stderr)
            return 64
    except CliError as exc:
        print(f"nvidia-container-cli: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
