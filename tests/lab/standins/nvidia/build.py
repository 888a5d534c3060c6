# Builds stand-ins for NVIDIA's driver packages (cuda-drivers-515 ...), cuda-keyring and the Container Toolkit.
"""NVIDIA packages for the lab's CUDA repository (`cuda/repos/<distro>/x86_64/`).

Driver branches, with NVIDIA's package structure:
  cuda-drivers (V-1) -> cuda-drivers-<B> (= V-1) -> exact (= V-0ubuntu1) versions of
  nvidia-driver-<B>, nvidia-dkms-<B>, libnvidia-compute-<B>, nvidia-utils-<B>,
  nvidia-kernel-source-<B>, nvidia-modprobe; and nvidia-driver-<B> -> the rest of the
  branch's package set (EMPTY_DRIVER_PACKAGES, build_driver_release).
515.65.01 is the pinned target, 515.48.07 the older one for the upgrade path, 515.86.01 and
515.105.01 the newer builds of the same branch (apt's candidates for any package of the branch
left unpinned), and 520.61.05 the newer branch an unpinned `apt-get install cuda-drivers` (or
cuda-11-7) would pull in. Branch packages provide and conflict with a branch-less virtual name,
so two branches cannot be installed side by side (as with NVIDIA's and Ubuntu's packages).

Where the relations come from: NVIDIA's repo carries the driver as Ubuntu packages it builds
from Ubuntu's nvidia-graphics-drivers-<B> source (hence the `0ubuntu1` revision). The names,
architectures and Depends/Recommends/Provides/Conflicts below are that source's
debian/templates/control.in, as kept in github.com/canonical/nvidia-graphics-drivers (the
515-era template: it lists libcuda-11.7-1 and the -open packages), cross-checked with the
rendered debian/control of nvidia-graphics-drivers-515 515.48.07 in
github.com/pop-os/nvidia-graphics-drivers (commit dd969cd0). #DEBIAN_VERSION# is the upstream
version (the rendered file has 515.48.07 there), ${binary:Version} the package version.
Inferred or left out, and why:
- ${shlibs:Depends}/${misc:Depends}/${nvidia:xorgDepends}: what the build computes from the
  binaries (libc6, the X server's ABI ...); the stand-ins ship no binaries of NVIDIA's.
- nvidia-dkms' `dkms`: the stand-in builds nothing, and real dkms pulls a compiler in.
- the `:i386` Recommends of nvidia-driver-<B>: only with i386 enabled; the lab is amd64 only.
- cuda-drivers-<B>'s own Depends (NVIDIA's packaging, not Ubuntu's): not found in a public
  source; kept as the lab had them (exact versions of the packages it names).
- nvidia-modprobe and nvidia-settings are sources of their own in NVIDIA's repo, versioned
  like the driver (V-0ubuntu1).
"""

from __future__ import annotations

import hashlib

from tests.lab.debs import Symlink
from tests.lab.standins import compile_shared_library, render, render_from, source

DRIVER_RELEASES = (
    # (branch, driver version, CUDA version reported by nvidia-smi: the branch's, 11.7 for
    # every 515 build, as NVIDIA's release notes list them)
    ("515", "515.48.07", "11.7"),
    ("515", "515.65.01", "11.7"),
    ("515", "515.86.01", "11.7"),
    ("515", "515.105.01", "11.7"),
    ("520", "520.61.05", "11.8"),
)
TOOLKIT_VERSION = "1.13.5"
TOOLKIT_DEB_VERSION = "1.13.5-1"
KEYRING_VERSION = "1.1-1"
MODULE_UNIT = "nvidia-module-load.service"

STANDIN_NOTE = "\n This is a lab stand-in built by tests/lab; it contains no NVIDIA software."
TOOLKIT_MAINTAINER = "NVIDIA CORPORATION <cudatools@nvidia.com>"

CUDA_REPO_PIN = """Package: nsight-compute
Pin: origin *ubuntu.com*
Pin-Priority: -1

Package: nsight-systems
Pin: origin *ubuntu.com*
Pin-Priority: -1

Package: *
Pin: release l=NVIDIA CUDA
Pin-Priority: 600
"""


def _exclusive(virtual: str) -> dict[str, str]:
    """Control fields making branch packages mutually exclusive through a virtual name."""
    return {"Provides": virtual, "Conflicts": virtual, "Replaces": virtual}


def _sh(text: str) -> bytes:
    return text.encode()


def _conflicting(provides: str, conflicts: str | None = None) -> dict[str, str]:
    """Provides/Conflicts/Replaces as control.in writes them when they differ (Provides lists
    more virtual names than the package conflicts with)."""
    conflicts = conflicts or provides
    return {"Provides": provides, "Conflicts": conflicts, "Replaces": conflicts}


def _within(package: str, version: str) -> list[str]:
    """control.in's `P (<= #DEBIAN_VERSION#-1), P (>= #DEBIAN_VERSION#)`: a range that only
    the driver's own builds of P (V-0ubuntu1, V-1) fall in; apt, like an `=`, then accepts no
    other candidate."""
    return [f"{package} (<= {version}-1)", f"{package} (>= {version})"]


# The rest of a branch's package set, empty here (a README only): the graphics, video and X
# packages nvidia-driver-<B> depends on. (name, Architecture, Depends, other control fields,
# description) as in control.in; {B} is the branch, {exact} `(= V-0ubuntu1)`.
EMPTY_DRIVER_PACKAGES: tuple[tuple[str, str, tuple[str, ...], dict[str, str], str], ...] = (
    (
        "nvidia-kernel-common-{B}",
        "amd64",
        (),
        _exclusive("nvidia-kernel-common"),
        "Shared files used with the kernel module",
    ),
    (
        "libnvidia-gl-{B}",
        "amd64",
        ("libnvidia-common-{B}",),
        {"Multi-Arch": "same", **_conflicting("libnvidia-gl, libglx-vendor, libegl-vendor", "libnvidia-gl")},
        "NVIDIA OpenGL/GLX/EGL/GLES GLVND libraries and Vulkan ICD",
    ),
    (
        "libnvidia-common-{B}",
        "all",
        (),
        {"Multi-Arch": "foreign", **_exclusive("libnvidia-common")},
        "Shared files used by the NVIDIA libraries",
    ),
    (
        "libnvidia-extra-{B}",
        "amd64",
        (),
        {"Multi-Arch": "same", **_exclusive("libnvidia-extra")},
        "Extra libraries for the NVIDIA driver",
    ),
    (
        "libnvidia-decode-{B}",
        "amd64",
        ("libnvidia-compute-{B} {exact}",),
        {"Multi-Arch": "same", **_exclusive("libnvidia-decode")},
        "NVIDIA Video Decoding runtime libraries",
    ),
    (
        "libnvidia-encode-{B}",
        "amd64",
        (),
        {"Multi-Arch": "same", **_exclusive("libnvidia-encode")},
        "NVENC Video Encoding runtime library",
    ),
    (
        "libnvidia-fbc1-{B}",
        "amd64",
        (),
        {"Multi-Arch": "same", **_exclusive("libnvidia-fbc1")},
        "NVIDIA OpenGL-based Framebuffer Capture runtime library",
    ),
    (
        "libnvidia-cfg1-{B}",
        "amd64",
        (),
        {"Multi-Arch": "same", **_exclusive("libnvidia-cfg1-any")},
        "NVIDIA binary OpenGL/GLX configuration library",
    ),
    (
        "xserver-xorg-video-nvidia-{B}",
        "amd64",
        ("libnvidia-cfg1-{B} {exact}",),
        {"Section": "non-free/x11", **_exclusive("xorg-driver-binary, nvidia-driver-binary")},
        "NVIDIA binary Xorg driver",
    ),
)


def _build_empty(ctx, name: str, version: str, arch: str, depends, control, description: str) -> None:
    ctx.build_deb(
        ctx.cuda_pool,
        name,
        version,
        {
            f"/usr/share/doc/{name}/README.lab": (
                f"Stand-in for {name} {version} (lab only): NVIDIA's package relations, no files of its own.\n".encode(),
                0o644,
            )
        },
        arch=arch,
        depends=list(depends),
        description=f"{description}{STANDIN_NOTE}",
        extra_control={"Section": "non-free/libs", **control},
    )


def build_driver_release(ctx, branch: str, version: str, cuda_version: str) -> None:
    pool = ctx.cuda_pool
    sub = f"{version}-0ubuntu1"
    meta = f"{version}-1"
    exact = f"(= {sub})"

    ctx.build_deb(
        pool,
        f"nvidia-kernel-source-{branch}",
        sub,
        {
            f"/usr/src/nvidia-{version}/README.lab": (
                f"Stand-in for the NVIDIA {version} kernel module sources (lab only).\n".encode(),
                0o644,
            ),
        },
        description=f"NVIDIA kernel source package{STANDIN_NOTE}",
        extra_control={**_exclusive("nvidia-kernel-source"), "Section": "non-free/kernel"},
    )

    postinst = f"""#!/bin/sh
# Stands in for nvidia-dkms-{branch} postinst (DKMS build, module enabled for the next boot); lab only.
set -e
if [ "$1" = configure ]; then
    echo "Building initial module for $(uname -r)"
    # DKMS installs the branch's modules into updates/dkms/ (Ubuntu's dkms); the stand-in .ko
    # holds the version it was built for and, for nvidia-peermem, whether MLNX_OFED's
    # peer-memory symbols were there to build against (NVIDIA's conftest: without them its
    # init returns -EINVAL). tests/lab/standins/kernel/kmod.py "loads" them.
    dir="/lib/modules/$(uname -r)/updates/dkms"
    mkdir -p "$dir"
    for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm; do echo {version} > "$dir/$m.ko"; done
    if ls -d /usr/src/mlnx-ofed-kernel-* >/dev/null 2>&1; then
        printf '%s\npeer-memory\n' {version} > "$dir/nvidia-peermem.ko"
    else
        echo {version} > "$dir/nvidia-peermem.ko"
    fi
    echo "Done. (lab stand-in: nvidia {version} loads at the next boot)"
    if command -v systemctl >/dev/null 2>&1; then
        # --root only when dpkg runs chrootless into another root (DPKG_ROOT set)
        root_opt=${{DPKG_ROOT:+--root=$DPKG_ROOT}}
        systemctl $root_opt enable {MODULE_UNIT} >/dev/null 2>&1 \\
            || systemctl $root_opt enable {MODULE_UNIT}
    fi
fi
exit 0
"""
    prerm = f"""#!/bin/sh
# Stands in for nvidia-dkms-{branch} prerm (module removed from DKMS); lab only.
set -e
if [ "$1" = remove ] && command -v systemctl >/dev/null 2>&1; then
    systemctl ${{DPKG_ROOT:+--root=$DPKG_ROOT}} disable {MODULE_UNIT} >/dev/null 2>&1 || true
fi
if [ "$1" = remove ] || [ "$1" = upgrade ]; then
    for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
        rm -f "/lib/modules/$(uname -r)/updates/dkms/$m.ko"
    done
fi
exit 0
"""
    ctx.build_deb(
        pool,
        f"nvidia-dkms-{branch}",
        sub,
        {
            "/usr/lib/nvidia-standin/module-version": (f"{version}\n".encode(), 0o644),
            "/usr/lib/nvidia-standin/load-module": (
                _sh(render(source("nvidia/load-module.sh"), BRANCH=branch)),
                0o755,
            ),
            f"/lib/systemd/system/{MODULE_UNIT}": (
                source("nvidia/nvidia-module-load.service").encode(),
                0o644,
            ),
            f"/usr/src/nvidia-{version}/dkms.conf": (
                f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{version}"\n'
                "# lab stand-in: nothing is built\n".encode(),
                0o644,
            ),
        },
        # control.in also has `dkms`: left out, the stand-in builds no module.
        depends=[
            *_within(f"nvidia-kernel-source-{branch}", version),
            *_within(f"nvidia-kernel-common-{branch}", version),
        ],
        description=f"NVIDIA DKMS package{STANDIN_NOTE}",
        extra_control={**_exclusive("nvidia-dkms-kernel"), "Section": "non-free/kernel"},
        scripts={"postinst": postinst, "prerm": prerm},
    )

    libdir = "/usr/lib/x86_64-linux-gnu"
    major, minor = cuda_version.split(".")
    nvml = compile_shared_library(
        source("nvidia/nvml.c"), "libnvidia-ml.so.1", defines={"DRIVER_VERSION": f'"{version}"'}
    )
    libcuda = compile_shared_library(
        source("nvidia/libcuda.c"),
        "libcuda.so.1",
        defines={
            "CUDA_DRIVER_API_VERSION": str(int(major) * 1000 + int(minor) * 10),
            "DRIVER_VERSION": f'"{version}"',
        },
    )
    ctx.build_deb(
        pool,
        f"libnvidia-compute-{branch}",
        sub,
        {
            f"{libdir}/libnvidia-ml.so.{version}": (nvml, 0o644),
            f"{libdir}/libnvidia-ml.so.1": Symlink(f"libnvidia-ml.so.{version}"),
            f"{libdir}/libcuda.so.{version}": (libcuda, 0o644),
            f"{libdir}/libcuda.so.1": Symlink(f"libcuda.so.{version}"),
        },
        description=f"NVIDIA libcompute package{STANDIN_NOTE}",
        extra_control={**_exclusive("libnvidia-compute"), "Section": "non-free/libs"},
        scripts={"triggers": "activate-noawait ldconfig\n"},
    )

    ctx.build_deb(
        pool,
        f"nvidia-utils-{branch}",
        sub,
        {
            "/usr/bin/nvidia-smi": (
                _sh(
                    render(
                        source("nvidia/nvidia_smi.py"),
                        DRIVER_VERSION=version,
                        CUDA_VERSION=cuda_version,
                    )
                ),
                0o755,
            ),
        },
        # python3 runs the stand-in; NVIDIA's own Depends are only what its binaries link.
        depends=["python3"],
        description=f"NVIDIA driver support binaries{STANDIN_NOTE}",
        extra_control={**_exclusive("nvidia-utils"), "Section": "non-free/utils"},
    )

    ctx.build_deb(
        pool,
        "nvidia-modprobe",
        sub,
        {
            "/usr/bin/nvidia-modprobe": (
                _sh(render(source("nvidia/nvidia-modprobe.sh"), VERSION=version)),
                0o755,
            )
        },
        description=f"Load the NVIDIA kernel driver and create device files{STANDIN_NOTE}",
        extra_control={"Section": "utils"},
    )

    build_driver_services(ctx, branch, version)

    for name, arch, depends, control, description in EMPTY_DRIVER_PACKAGES:
        _build_empty(
            ctx,
            name.format(B=branch),
            sub,
            arch,
            [d.format(B=branch, exact=exact) for d in depends],
            control,
            description,
        )
    # Not a package of the branch: NVIDIA's repo versions it like the driver. Empty here; the
    # real one is a GTK program (X11), which a headless node does not install (Recommends).
    _build_empty(
        ctx,
        "nvidia-settings",
        sub,
        "amd64",
        [],
        {"Section": "x11"},
        "Tool for configuring the NVIDIA graphics driver",
    )

    ctx.build_deb(
        pool,
        f"nvidia-driver-{branch}",
        sub,
        {},
        # control.in's order; libnvidia-fbc1's [!ppc64el] holds on amd64.
        depends=[
            f"libnvidia-gl-{branch} {exact}",
            *_within(f"nvidia-dkms-{branch}", version),
            *_within(f"nvidia-kernel-common-{branch}", version),
            f"nvidia-kernel-source-{branch} {exact}",
            f"libnvidia-compute-{branch} {exact}",
            f"libnvidia-extra-{branch} {exact}",
            f"nvidia-compute-utils-{branch} {exact}",
            f"libnvidia-decode-{branch} {exact}",
            f"libnvidia-encode-{branch} {exact}",
            f"nvidia-utils-{branch} {exact}",
            f"xserver-xorg-video-nvidia-{branch} {exact}",
            f"libnvidia-cfg1-{branch} {exact}",
            f"libnvidia-fbc1-{branch} {exact}",
        ],
        description=f"NVIDIA driver metapackage{STANDIN_NOTE}",
        extra_control={"Recommends": "nvidia-settings, nvidia-prime (>= 0.8)", "Section": "non-free/libs"},
    )

    ctx.build_deb(
        pool,
        f"cuda-drivers-{branch}",
        meta,
        {},
        depends=[
            f"nvidia-driver-{branch} {exact}",
            f"nvidia-dkms-{branch} {exact}",
            f"libnvidia-compute-{branch} {exact}",
            f"nvidia-utils-{branch} {exact}",
            f"nvidia-kernel-source-{branch} {exact}",
            f"nvidia-modprobe {exact}",
        ],
        description=f"CUDA Driver native dependencies{STANDIN_NOTE}",
        extra_control={"Section": "multiverse/devel"},
    )
    ctx.build_deb(
        pool,
        "cuda-drivers",
        meta,
        {},
        depends=[f"cuda-drivers-{branch} (= {meta})"],
        description=f"CUDA Driver meta-package, branch-agnostic{STANDIN_NOTE}",
        extra_control={"Section": "multiverse/devel"},
    )


def build_driver_services(ctx, branch: str, version: str) -> None:
    """nvidia-compute-utils-<B> (nvidia-persistenced, Ubuntu's unit: persistence mode off) at
    the driver's sub-package version, and nvidia-fabricmanager-<B> at <version>-1 (NVIDIA's
    repo: nvidia-fabricmanager-515_515.65.01-1_amd64.deb), which refuses another driver."""
    subs = {"VERSION": version, "BRANCH": branch}
    postinst = """#!/bin/sh
# Stands in for nvidia-compute-utils' postinst: the daemon's system user; lab only.
set -e
if [ "$1" = configure ] && ! getent passwd nvidia-persistenced >/dev/null; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nvidia-persistenced
fi
exit 0
"""
    ctx.build_deb(
        ctx.cuda_pool,
        f"nvidia-compute-utils-{branch}",
        f"{version}-0ubuntu1",
        {
            "/usr/bin/nvidia-persistenced": (
                _sh(render_from(source("nvidia/nvidia-persistenced.sh"), subs)),
                0o755,
            ),
            "/lib/systemd/system/nvidia-persistenced.service": (
                render_from(source("nvidia/nvidia-persistenced.service"), subs).encode(),
                0o644,
            ),
        },
        # control.in: `libnvidia-compute-<B>, adduser` (unversioned); adduser left out, the
        # postinst below uses useradd (passwd, Priority: required).
        depends=[f"libnvidia-compute-{branch}"],
        description=f"NVIDIA compute utilities{STANDIN_NOTE}",
        extra_control={**_exclusive("nvidia-compute-utils"), "Section": "non-free/libs"},
        scripts={"postinst": postinst},
    )
    ctx.build_deb(
        ctx.cuda_pool,
        f"nvidia-fabricmanager-{branch}",
        f"{version}-1",
        {
            "/usr/bin/nv-fabricmanager": (
                _sh(render_from(source("nvidia/nv-fabricmanager.sh"), subs)),
                0o755,
            ),
            "/lib/systemd/system/nvidia-fabricmanager.service": (
                render_from(source("nvidia/nvidia-fabricmanager.service"), subs).encode(),
                0o644,
            ),
            "/usr/share/nvidia/nvswitch/fabricmanager.cfg": (
                b"# lab stand-in: the real file configures logging, ports and fabric mode\n"
                b"LOG_LEVEL=4\nFABRIC_MODE=0\n",
                0o644,
            ),
        },
        description=f"Fabric Manager for NVSwitch based systems{STANDIN_NOTE}",
        extra_control={**_exclusive("nvidia-fabricmanager"), "Section": "multiverse/devel"},
    )


def build_keyring(ctx, distro: str) -> None:
    """cuda-keyring_1.1-1_all.deb for one distro folder, trusting the lab's archive key."""
    url = f"{ctx.base_url.rstrip('/')}/cuda/repos/{distro}/x86_64/"
    keyring = "/usr/share/keyrings/cuda-archive-keyring.gpg"
    sources = f"/etc/apt/sources.list.d/cuda-{distro}-x86_64.list"
    pin = "/etc/apt/preferences.d/cuda-repository-pin-600"
    ctx.build_deb(
        ctx.cuda_repo_dir(distro),
        "cuda-keyring",
        KEYRING_VERSION,
        {
            keyring: (ctx.keyring, 0o644),
            sources: (f"deb [signed-by={keyring}] {url} /\n".encode(), 0o644),
            pin: (CUDA_REPO_PIN.encode(), 0o644),
        },
        arch="all",
        description=f"GPG keyring for the CUDA repository{STANDIN_NOTE}",
        conffiles=[sources, pin],
        extra_control={"Section": "multiverse/devel", "Priority": "optional"},
    )


def build_container_toolkit(ctx) -> None:
    pool = ctx.cuda_pool
    v = TOOLKIT_DEB_VERSION
    commit = hashlib.sha1(f"nvidia-container-toolkit {TOOLKIT_VERSION} lab".encode()).hexdigest()
    subs = {"VERSION": TOOLKIT_VERSION, "COMMIT": commit}

    def script(name: str) -> tuple[bytes, int]:
        return render(source(f"nvidia/{name}"), **subs).encode(), 0o755

    ctx.build_deb(
        pool,
        "libnvidia-container1",
        v,
        {
            "/usr/share/doc/libnvidia-container1/README.lab": (
                b"Stand-in for libnvidia-container1 (lab only): no library is shipped.\n",
                0o644,
            )
        },
        description=f"NVIDIA container runtime library{STANDIN_NOTE}",
        maintainer=TOOLKIT_MAINTAINER,
        extra_control={"Section": "libs"},
    )
    ctx.build_deb(
        pool,
        "libnvidia-container-tools",
        v,
        {"/usr/bin/nvidia-container-cli": script("nvidia_container_cli.py")},
        depends=[f"libnvidia-container1 (>= {v})", "python3"],
        description=f"NVIDIA container runtime library (command-line tools){STANDIN_NOTE}",
        maintainer=TOOLKIT_MAINTAINER,
        extra_control={"Section": "utils"},
    )
    ctx.build_deb(
        pool,
        "nvidia-container-toolkit-base",
        v,
        {
            "/usr/bin/nvidia-ctk": script("nvidia_ctk.py"),
            "/usr/bin/nvidia-container-runtime": script("nvidia-container-runtime.sh"),
            "/etc/nvidia-container-runtime/config.toml": (
                source("nvidia/config.toml").encode(),
                0o644,
            ),
        },
        depends=["python3"],
        conffiles=["/etc/nvidia-container-runtime/config.toml"],
        description=f"NVIDIA Container Toolkit Base{STANDIN_NOTE}",
        maintainer=TOOLKIT_MAINTAINER,
        extra_control={
            "Section": "utils",
            "Breaks": "nvidia-container-runtime (<= 3.5.0-1), nvidia-container-runtime-hook",
            "Replaces": "nvidia-container-runtime (<= 3.5.0-1), nvidia-container-runtime-hook",
        },
    )
    ctx.build_deb(
        pool,
        "nvidia-container-toolkit",
        v,
        {"/usr/bin/nvidia-container-runtime-hook": script("nvidia_container_runtime_hook.py")},
        depends=[
            f"libnvidia-container-tools (>= {v})",
            "libnvidia-container-tools (<< 2.0.0)",
            f"nvidia-container-toolkit-base (= {v})",
        ],
        description=f"NVIDIA Container toolkit{STANDIN_NOTE}",
        maintainer=TOOLKIT_MAINTAINER,
        extra_control={"Section": "utils"},
    )


def build(ctx) -> None:
    for branch, version, cuda_version in DRIVER_RELEASES:
        build_driver_release(ctx, branch, version, cuda_version)
    for distro in ctx.cuda_distros:
        build_keyring(ctx, distro)
    build_container_toolkit(ctx)
