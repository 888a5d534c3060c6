#!/usr/bin/python3
# Stands in for the kernel's loadable modules on a lab node (modprobe, /sys/module, systemd-modules-load); lab only.
"""The lab nodes share the controller's kernel, which loads no module for them (nspawn drops
CAP_SYS_MODULE; this kernel has no /proc/modules at all). For the modules the stand-in
packages "build", this gives each node what a real kernel shows:

- `/sys/module` is a tmpfs per node (set up at boot: `setup`), holding a link to each of the
  controller's entries (built-ins: apparmor, ...) and a directory per module loaded here, with
  the files the kernel writes for a loadable module: `initstate` ("live") and, for nvidia,
  `version` (sysfs-rules / Documentation/ABI/testing/sysfs-module; nvidia.ko's MODULE_VERSION).
- `modprobe` (this script through /usr/local/sbin/modprobe, ahead of kmod's in PATH) loads
  and unloads the modules in MODULES; any other name goes to kmod's own modprobe unchanged.
  It refuses as kmod does: a module with no .ko under /lib/modules/<release>/updates/dkms/
  is "modprobe: FATAL: Module nvidia-peermem not found in directory /lib/modules/<release>";
  one whose init fails is kmod's "could not insert 'nvidia_peermem': Invalid argument" (the
  kernel's EINVAL): a .ko built for another nvidia.ko than the one loaded ("disagrees about
  version of symbol"), and an nvidia-peermem built without MLNX_OFED's peer-memory symbols,
  whose nv_mem_client_init returns -EINVAL (NVIDIA/open-gpu-kernel-modules,
  kernel-open/nvidia-peermem/nvidia-peermem.c: without NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT).
  Dependencies load first (modules.dep: nvidia-peermem needs nvidia); `-r` of a module in use
  is "Module nvidia is in use by: nvidia_peermem".
- `modules-load` at boot does what systemd-modules-load.service does on a real node (it is
  skipped in a container: ConditionCapability=CAP_SYS_MODULE): every name in modules-load.d
  (/etc, /run, /usr/lib; modules-load.d(5)) that is in MODULES is loaded.
The .ko files are the stand-in nvidia-dkms-<branch>'s (its postinst writes them, as DKMS
installs into /lib/modules/<release>/updates/dkms/ on Ubuntu): line 1 the driver version it
was built for (MODULE_VERSION: /sys/module/<name>/version), then the build's features
(`peer-memory`: MLNX_OFED's symbols were there when nvidia-peermem was built).
"""

import glob
import os
import subprocess
import sys

SYS_MODULE = "/sys/module"
HOST_MODULE = "/run/dtlab-kmod/host-module"
REAL_MODPROBE = "/usr/sbin/modprobe"
# name -> (dependencies, hook run on load): the modules the lab's stand-ins provide.
MODULES = {
    "nvidia": ((), "/usr/lib/nvidia-standin/load-module"),
    "nvidia_uvm": (("nvidia",), None),
    "nvidia_modeset": (("nvidia",), None),
    "nvidia_drm": (("nvidia_modeset",), None),
    "nvidia_peermem": (("nvidia",), None),
}


def _release() -> str:
    return os.uname().release


def _ko(name: str) -> str | None:
    """The module's file: kmod treats '-' and '_' in a name alike."""
    for stem in (name, name.replace("_", "-")):
        path = f"/lib/modules/{_release()}/updates/dkms/{stem}.ko"
        if os.path.exists(path):
            return path
    return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _loaded(name: str) -> bool:
    return _read(f"{SYS_MODULE}/{name}/initstate") == "live"


def _holders(name: str) -> list[str]:
    return [m for m in MODULES if _loaded(m) and name in MODULES[m][0]]


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text + "\n")


def load(name: str, quiet: bool = False) -> int:
    if _loaded(name):
        return 0
    ko = _ko(name)
    if ko is None:
        if not quiet:
            shown = name.replace("_", "-")
            print(
                f"modprobe: FATAL: Module {shown} not found in directory /lib/modules/{_release()}",
                file=sys.stderr,
            )
        return 1
    deps, hook = MODULES[name]
    for dep in deps:
        if load(dep, quiet) != 0:
            return 1
    built_for, *features = _read(ko).split("\n") or [""]
    running = _read(f"{SYS_MODULE}/nvidia/version")
    # The kernel logs "<module>: disagrees about version of symbol nvidia_p2p_get_pages", or
    # nvidia-peermem's init fails without peer-memory symbols; kmod prints the errno.
    mismatch = name != "nvidia" and running and built_for != running
    if mismatch or (name == "nvidia_peermem" and "peer-memory" not in features):
        if not quiet:
            print(f"modprobe: ERROR: could not insert '{name}': Invalid argument", file=sys.stderr)
        return 1
    if hook and os.access(hook, os.X_OK):
        subprocess.run([hook], check=True)
    os.makedirs(f"{SYS_MODULE}/{name}", exist_ok=True)
    loaded_version = _read("/run/nvidia-standin/loaded-version") if name == "nvidia" else ""
    _write(f"{SYS_MODULE}/{name}/version", loaded_version or built_for)
    _write(f"{SYS_MODULE}/{name}/refcnt", "0")
    _write(f"{SYS_MODULE}/{name}/initstate", "live")
    return 0


def unload(name: str) -> int:
    if not _loaded(name):
        return 0
    holders = _holders(name)
    if holders:
        print(f"modprobe: FATAL: Module {name} is in use by: {' '.join(holders)}", file=sys.stderr)
        return 1
    for entry in os.listdir(f"{SYS_MODULE}/{name}"):
        os.unlink(f"{SYS_MODULE}/{name}/{entry}")
    os.rmdir(f"{SYS_MODULE}/{name}")
    return 0


def modprobe(argv: list[str]) -> int:
    flags = [a for a in argv if a.startswith("-")]
    names = [a.replace("-", "_") for a in argv if not a.startswith("-")]
    if not names or any(n not in MODULES for n in names):
        os.execv(REAL_MODPROBE, [REAL_MODPROBE, *argv])
    remove = any(f in ("-r", "--remove") or (f[1:2] != "-" and "r" in f) for f in flags)
    quiet = any(f in ("-q", "--quiet") for f in flags)
    many = remove or any(f in ("-a", "--all") or (f[1:2] != "-" and "a" in f) for f in flags)
    targets = names if many else names[:1]  # modprobe NAME [PARAMS]: the rest are parameters
    status = 0
    for name in targets:
        status |= unload(name) if remove else load(name, quiet)
    return status


def setup() -> int:
    """At boot: /sys/module as this node's own, the controller's entries linked in. Each step
    is skipped once done: the unit may be started again after a failed start."""
    os.makedirs(HOST_MODULE, exist_ok=True)
    if not os.path.ismount(HOST_MODULE):
        subprocess.run(["mount", "--bind", SYS_MODULE, HOST_MODULE], check=True)
        # Out of /sys's peer group (systemd makes / shared): else the tmpfs below would be
        # propagated onto this copy as well, hiding the controller's entries.
        subprocess.run(["mount", "--make-private", HOST_MODULE], check=True)
    if not os.path.ismount(SYS_MODULE):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "dtlab-sysmodule", SYS_MODULE], check=True)
    for entry in os.listdir(HOST_MODULE):
        if not os.path.lexists(f"{SYS_MODULE}/{entry}"):
            os.symlink(f"{HOST_MODULE}/{entry}", f"{SYS_MODULE}/{entry}")
    return 0


def modules_load() -> int:
    names: list[str] = []
    for directory in ("/etc/modules-load.d", "/run/modules-load.d", "/usr/lib/modules-load.d"):
        for conf in sorted(glob.glob(f"{directory}/*.conf")):
            for raw in _read(conf).splitlines():
                line = raw.strip()
                if line and line[0] not in "#;":
                    names.append(line.replace("-", "_"))
    status = 0
    for name in names:
        if name in MODULES:
            status |= load(name)
    return status


if __name__ == "__main__":
    verb, args = sys.argv[1], sys.argv[2:]
    sys.exit({"modprobe": lambda: modprobe(args), "setup": setup, "modules-load": modules_load}[verb]())
