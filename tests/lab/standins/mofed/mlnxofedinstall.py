#!/usr/bin/python3
# Stands in for NVIDIA's mlnxofedinstall of MLNX_OFED_LINUX-@OFED_VERSION@-@DISTRO@-x86_64; lab only.
"""mlnxofedinstall: checks like the real installer, then installs DEBS/*.deb with dpkg.

Order of checks and exit codes (MLNX_OFED user manual):
  22  unknown option / missing option value
   1  not root, tarball built for another distro (--skip-distro-check), running kernel not
      among those the tarball was built for (--add-kernel-support rebuilds for it), answer
      other than 'y' at the confirmation prompt (--force skips it), dpkg failure
  28  less than 1 GiB free on /
   1  --add-kernel-support, and what mlnx_add_kernel_support.sh checks is missing (below):
      "Failed to build MLNX_OFED_LINUX for <kernel>"
 172  required distribution packages missing (listed with an apt-get line)
   2  firmware update found no firmware for the device (--without-fw-update skips it)
   0  installed

Test-only environment overrides (never set on a node): DTLAB_STANDIN_ROOT (an alternative
root: os-release, free space and dpkg all use it; the root check is skipped) and
DTLAB_STANDIN_MIN_FREE_BYTES.
"""

import glob
import os
import shutil
import subprocess
import sys

OFED_VERSION = "@OFED_VERSION@"
DISTRO = "@DISTRO@"
SUPPORTED_KERNELS_TEXT = "@SUPPORTED_KERNELS@"  # space separated
PREREQUISITES = ("python3", "lsof", "pciutils", "ethtool")

# --add-kernel-support runs mlnx_add_kernel_support.sh, which installs nothing and exits 1 when
# a check fails (the public copies of the script, v7.1/v7.2 of MLNX_OFED 4.x/5.0; the 5.8
# tarball's copy is not published): lsb_release tells it a deb system (without it it takes the
# rpm path: "Linux Distribution () is not supported"); `which apt-ftparchive` and `which bzip2`
# ("ERROR: 'apt-utils' is not installed!" / "'bzip2' is not installed!") unless --skip-repo;
# then `install.pl --kernel-only --build-only --without-dkms --check-deps-only`, whose
# check_linux_dependencies (MLNX_OFED_SRC-5.9-0.5.6.0/install.pl) lists every missing deb of
# @required_debs, the kernel packages' build needs and linux-headers-$kernel when
# $kernel_sources/scripts (/lib/modules/$kernel/build/scripts) is missing. Its dpatch is not
# checked here: neither Debian 12 nor Ubuntu 20.04/22.04 ship it.
ADD_KERNEL_TOOLS = (("apt-ftparchive", "apt-utils"), ("bzip2", "bzip2"))
INSTALL_PL_REQUIRED = (
    "autotools-dev", "autoconf", "automake", "m4", "debhelper", "chrpath", "swig", "graphviz",
    "libltdl-dev", "build-essential",
    "libelf-dev",  # CONFIG_STACK_VALIDATION + CONFIG_UNWINDER_ORC kernels (Ubuntu's, Debian's)
    "quilt", "make", "gcc", "pkg-config", "dh-autoreconf",  # dist_req_build of *-modules
    "kmod", "perl", "procps",  # dist_req_inst of mlnx-ofed-kernel-modules
)  # fmt: skip

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_NO_FIRMWARE = 2
EXIT_BAD_PARAMETER = 22
EXIT_NO_SPACE = 28
EXIT_PREREQUISITES = 172

FLAGS = {
    "--without-fw-update",
    "--add-kernel-support",
    "--force",
    "--skip-distro-check",
    "--skip-repo",
    "--without-dkms",
    "--all",
    "--hpc",
    "--basic",
    "-q",
}
VALUE_FLAGS = {"--kernel", "-k", "--kernel-sources", "-s", "--tmpdir"}

USAGE = f"""Usage: ./mlnxofedinstall [OPTIONS]

Installation control:
    --force                 Force installation
    --tmpdir                Change tmp directory. Default: /tmp
    -k|--kernel <version>   Default on this system: {os.uname().release}
    -s|--kernel-sources <path>
    --add-kernel-support    Add kernel support (Run mlnx_add_kernel_support.sh)
    --skip-distro-check     Do not check MLNX_OFED_LINUX vs Distro matching
    --skip-repo             Do not use apt repository
    --without-dkms          Don't install kernel modules DKMS packages
    --without-fw-update     Skip firmware update
    -q                      Set quiet - no messages will be printed
Package selection:
    --all|--hpc|--basic     Install all / HPC / basic packages
"""

ROOT = os.environ.get("DTLAB_STANDIN_ROOT", "/")
MIN_FREE = int(os.environ.get("DTLAB_STANDIN_MIN_FREE_BYTES", str(1024**3)))
HERE = os.path.dirname(os.path.realpath(__file__))


def say(opts, text=""):
    if "-q" not in opts:
        print(text, flush=True)


def parse(argv):
    opts = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            opts["help"] = True
        elif arg in FLAGS:
            opts[arg] = True
        elif arg.split("=", 1)[0] in VALUE_FLAGS:
            name, eq, value = arg.partition("=")
            if not eq:
                if not args:
                    print(f"Option {name} requires an argument", file=sys.stderr)
                    return None
                value = args.pop(0)
            opts[name] = value
        else:
            print(f"Unsupported option: {arg}", file=sys.stderr)
            print("Run ./mlnxofedinstall --help for the list of options.", file=sys.stderr)
            return None
    return opts


def host_distro():
    info = {}
    try:
        with open(os.path.join(ROOT, "etc/os-release")) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                info[key] = value.strip('"')
    except OSError:
        return "unknown"
    os_id, version = info.get("ID", "unknown"), info.get("VERSION_ID", "")
    if os_id == "debian":
        version = version.split(".")[0]
    return f"{os_id}{version}"


def dpkg_args():
    return [] if ROOT == "/" else [f"--root={ROOT}"]


def installed(package):
    proc = subprocess.run(
        ["dpkg-query", *dpkg_args(), "-W", "-f=${db:Status-Abbrev}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode == 0 and proc.stdout.startswith("ii")


def on_path(tool):
    if ROOT == "/":
        return shutil.which(tool) is not None
    return any(os.access(os.path.join(ROOT, d, tool), os.X_OK) for d in ("usr/bin", "bin"))


def add_kernel_support_missing(kernel, opts):
    """What mlnx_add_kernel_support.sh would stop on, as it prints it (empty: it goes on)."""
    if not on_path("lsb_release"):
        return ["ERROR: Linux Distribution () is not supported"]
    lines = []
    if "--skip-repo" not in opts:
        for tool, package in ADD_KERNEL_TOOLS:
            if not on_path(tool):
                lines += [
                    f"ERROR: '{package}' is not installed!",
                    f"'{package}' package is needed for creating a repository from MLNX_OFED_LINUX DEBs.",
                    "",
                ]
        if lines:
            lines += [
                "Use '--skip-repo' flag if you are not going to set MLNX_OFED_LINUX as repository for",
                "installation using apt-get tool.",
                "",
            ]
    missing = [p for p in INSTALL_PL_REQUIRED if not installed(p)]
    sources = opts.get("--kernel-sources") or opts.get("-s") or f"/lib/modules/{kernel}/build"
    scripts = sources.rstrip("/") + "/scripts"
    if not os.path.isdir(os.path.join(ROOT, scripts.lstrip("/"))):
        missing.append(f"linux-headers-{kernel}")
    if missing:
        lines.append("One or more required packages for installing OFED-internal are missing.")
        if missing[-1] == f"linux-headers-{kernel}":
            lines.append(f"{scripts} is required for the Installation.")
        lines += ["Run:", "apt-get install " + " ".join(missing)]
    return lines


def main(argv):
    opts = parse(argv)
    if opts is None:
        return EXIT_BAD_PARAMETER
    if opts.get("help"):
        print(USAGE)
        return EXIT_OK
    if ROOT == "/" and os.geteuid() != 0:
        print("Only root can run ./mlnxofedinstall", file=sys.stderr)
        return EXIT_FAIL

    distro = host_distro()
    if distro != DISTRO and "--skip-distro-check" not in opts:
        print(f"Current operation system is not supported ({distro})!", file=sys.stderr)
        print(f"Error: The current MLNX_OFED_LINUX is intended for {DISTRO}", file=sys.stderr)
        return EXIT_FAIL

    kernel = opts.get("--kernel") or opts.get("-k") or os.uname().release
    rebuild = kernel not in SUPPORTED_KERNELS_TEXT.split()
    if rebuild and "--add-kernel-support" not in opts:
        print(
            f"Error: The current MLNX_OFED_LINUX does not support kernel {kernel}.\n"
            "Please use --add-kernel-support to build MLNX_OFED_LINUX for this kernel.",
            file=sys.stderr,
        )
        return EXIT_FAIL

    st = os.statvfs(ROOT)
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE:
        print(
            f"Error: Not enough free space in {ROOT}: {free // 1024**2} MB free, "
            f"at least {MIN_FREE // 1024**2} MB are required.",
            file=sys.stderr,
        )
        return EXIT_NO_SPACE

    logs = os.path.join(
        opts.get("--tmpdir", os.path.join(ROOT, "tmp")), f"MLNX_OFED_LINUX.{os.getpid()}.logs"
    )
    os.makedirs(logs, exist_ok=True)
    say(opts, f"Logs dir: {logs}")
    say(opts, f"General log file: {logs}/general.log")

    if rebuild:
        say(
            opts,
            f"Note: This program will create MLNX_OFED_LINUX TGZ for {DISTRO} under "
            f"/tmp/MLNX_OFED_LINUX-{OFED_VERSION}-{kernel} directory.",
        )
        say(opts, "Checking if all needed packages are installed...")
        problems = add_kernel_support_missing(kernel, opts)
        if problems:
            print("\n".join(problems))
            # mlnxofedinstall's line when the script fails (seen in published logs of 4.x runs).
            print(f"Failed to build MLNX_OFED_LINUX for {kernel}", file=sys.stderr)
            return EXIT_FAIL
        say(opts, "Building MLNX_OFED_LINUX DEBS . Please wait...")
        say(
            opts,
            f"Created /tmp/MLNX_OFED_LINUX-{OFED_VERSION}-{kernel}/"
            f"MLNX_OFED_LINUX-{OFED_VERSION}-{DISTRO}-ext.tgz",
        )
        say(opts, "(lab stand-in: the prebuilt DEBS are used for this kernel)")

    debs = sorted(glob.glob(os.path.join(HERE, "DEBS", "*.deb")))
    if not debs:
        print(f"Error: no packages found in {HERE}/DEBS", file=sys.stderr)
        return EXIT_FAIL
    names = [os.path.basename(d).split("_")[0] for d in debs]
    say(opts, "Below is the list of MLNX_OFED_LINUX packages that you have chosen")
    say(opts, "(some may have been added by the installer due to package dependencies):")
    say(opts)
    for name in names:
        say(opts, name)
    say(opts)

    say(opts, "Checking SW Requirements...")
    missing = [p for p in PREREQUISITES if not installed(p)]
    if missing:
        print("One or more required packages for installing MLNX_OFED_LINUX are missing.")
        print("Please install the missing packages using your Linux distribution Package Management tool.")
        print("Run:")
        print(f"apt-get install {' '.join(missing)}")
        return EXIT_PREREQUISITES

    if "--force" not in opts:
        print("This program will install the MLNX_OFED_LINUX package on your machine.")
        print("Note that all other Mellanox, OEM, OFED, RDMA or Distribution IB packages will be removed.")
        print("Those packages are removed due to conflicts with MLNX_OFED_LINUX, do not reinstall them.")
        print()
        sys.stdout.write("Do you want to continue?[y/N]:")
        sys.stdout.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("\nAborted.")
            return EXIT_FAIL

    say(opts, "Removing old packages...")
    say(opts, "Installing new packages")
    log = os.path.join(logs, "dpkg.log")
    env = dict(os.environ)
    cmd = ["dpkg", *dpkg_args(), "--force-confnew", "-i", *debs]
    if ROOT != "/":
        cmd[1:1] = ["--force-script-chrootless", "--force-not-root"]
        env["DPKG_ROOT"] = ROOT.rstrip("/")
        # A test root has no update-rc.d for systemctl's SysV sync; the unit alone is enough.
        env["SYSTEMCTL_SKIP_SYSV"] = "1"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        print(f"Failed to install MLNX_OFED_LINUX packages, see {log}", file=sys.stderr)
        return EXIT_FAIL
    for name in names:
        say(opts, f"Installing {name}...")

    if "--without-fw-update" not in opts:
        say(opts, "Attempting to perform Firmware update...")
        print("Querying Mellanox devices firmware ...")
        print()
        print("Device #1:")
        print("----------")
        print("  Device Type:      ConnectX6")
        print("  Status:           No matching image found")
        print()
        with open(os.path.join(logs, "fw_update.log"), "w") as f:
            f.write("Device #1: ConnectX6: No matching image found (lab stand-in has no firmware)\n")
        print("Failed to update Firmware.")
        print(f"See {logs}/fw_update.log")
        return EXIT_NO_FIRMWARE
    say(opts, "Skipping FW update.")

    say(opts, "Device (00:00.0):")
    say(opts, "\t00:00.0 Infiniband controller: Mellanox Technologies MT28908 Family [ConnectX-6]")
    say(opts)
    say(opts, "Installation passed successfully")
    say(opts, "To load the new driver, run:")
    say(opts, "/etc/init.d/openibd restart")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
