"""The pinned GPU and fabric stack: driver, CUDA, NCCL on agents; MLNX_OFED on every node.

Every expected value comes from cluster.yaml through deploy/pins.py, the same mapping the
deploy installs from.
"""

import shlex

import pytest

from deploy import gpu_node
from deploy.fabric_node import OPENSMD_UNIT
from deploy.facts.fabric import no_linked_port, parse_ibstat, parse_sminfo
from deploy.facts.gpu import nvswitch_command, parse_nvswitches
from deploy.pins import (
    CUDA_LINK,
    all_pins,
    cuda_home,
    cuda_major_minor,
    driver_pins,
    fabricmanager_pins,
    nccl_library,
    nccl_version_code,
    ofed_release,
)

BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"

NCCL_VERSION = (
    "import ctypes; lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int(); "
    "rc = lib.ncclGetVersion(ctypes.byref(v)); print(rc, v.value)"
)


def test_driver_version_on_every_gpu(agent, host_of, cluster):
    out = host_of(agent).check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader,nounits")
    versions = [line.strip() for line in out.splitlines() if line.strip()]
    assert versions, "nvidia-smi lists no GPU"
    assert set(versions) == {cluster.versions.nvidia_driver}, versions


def test_no_driver_reboot_pending(agent, host_of, cluster):
    pending = host_of(agent).run("cat /run/reboot-required.pkgs 2>/dev/null").stdout.split()
    driver = [p for p, _ in driver_pins(cluster.versions.nvidia_driver).packages]
    assert not set(pending) & set(driver), f"reboot pending for {sorted(set(pending) & set(driver))}"


def test_nouveau_blacklisted(agent, host_of):
    conf = host_of(agent).file(BLACKLIST)
    assert conf.is_file
    lines = [line.strip() for line in conf.content_string.splitlines()]
    assert "blacklist nouveau" in lines
    assert "options nouveau modeset=0" in lines


def test_persistence_mode_on_every_gpu(agent, host_of):
    out = host_of(agent).check_output("nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader")
    modes = dict(line.split(", ", 1) for line in out.splitlines() if line.strip())
    assert modes, "nvidia-smi lists no GPU"
    off = sorted(i for i, mode in modes.items() if mode != "Enabled")
    assert not off, f"persistence mode off on GPU {', '.join(off)}"


def test_fabric_manager_matches_nvswitches(agent, host_of, cluster):
    # Active at the driver's exact version where NVSwitches are, absent elsewhere (there it
    # can only fail: NV_WARN_NOTHING_TO_DO).
    h = host_of(agent)
    switches = parse_nvswitches(h.check_output(nvswitch_command()).splitlines())
    ((package, version),) = fabricmanager_pins(cluster.versions.nvidia_driver).packages
    pkg = h.package(package)
    if not switches:
        assert not pkg.is_installed, f"{package} installed on a node without NVSwitches"
        return
    assert pkg.is_installed and pkg.version == version, f"{package} {pkg.version} (pinned {version})"
    service = h.service(gpu_node.FABRICMANAGER)
    assert service.is_running, f"{gpu_node.FABRICMANAGER} is not active ({len(switches)} NVSwitches)"
    assert service.is_enabled, f"{gpu_node.FABRICMANAGER} is not enabled"


def test_nvidia_peermem_loads_at_boot(agent, host_of):
    conf = host_of(agent).file(gpu_node.PEERMEM)
    assert conf.is_file, f"{gpu_node.PEERMEM} is missing"
    assert "nvidia-peermem" in [line.strip() for line in conf.content_string.splitlines()]


def test_nvidia_peermem_loaded(agent, host_of, cluster):
    # The kernel's own entry for the running module (sysfs-module ABI): initstate "live", and
    # version the driver's (nvidia-peermem.c: MODULE_VERSION(NV_VERSION_STRING)).
    entry = f"/sys/module/{gpu_node.PEERMEM_MODULE}"
    h = host_of(agent)
    state = h.file(f"{entry}/initstate")
    assert state.exists, f"{entry} is missing: nvidia-peermem is not loaded"
    assert state.content_string.strip() == "live", f"{entry}/initstate: {state.content_string.strip()}"
    version = h.file(f"{entry}/version").content_string.strip()
    assert version == cluster.versions.nvidia_driver, f"{entry}/version: {version}"


def test_cuda_link_resolves_to_pinned_toolkit(agent, host_of, cluster):
    resolved = host_of(agent).check_output(f"readlink -e {CUDA_LINK}")
    assert resolved == cuda_home(cluster.versions.cuda)


def test_nvcc_release(agent, host_of, cluster):
    out = host_of(agent).check_output(f"{CUDA_LINK}/bin/nvcc --version")
    assert f"release {cuda_major_minor(cluster.versions.cuda)}," in out, out


def test_login_shell_finds_cuda(agent, host_of, cluster):
    home = cuda_home(cluster.versions.cuda)
    out = (
        host_of(agent)
        .check_output("bash -lc " + shlex.quote('command -v nvcc; echo "$LD_LIBRARY_PATH"'))
        .splitlines()
    )
    assert out[0] == f"{home}/bin/nvcc"
    assert f"{home}/lib64" in out[1].split(":")


def test_nccl_library_and_version(agent, host_of, cluster):
    h = host_of(agent)
    assert h.file(nccl_library(cluster.versions.nccl)).is_file
    rc, code = h.check_output("python3 -c " + shlex.quote(NCCL_VERSION)).split()
    assert int(rc) == 0
    assert int(code) == nccl_version_code(cluster.versions.nccl)


def test_pinned_packages_installed_and_held(agent, host_of, cluster):
    # Every package of each set: the driver's whole graph (a graphics library left to apt moves
    # to the branch's newest build), the Container Toolkit with its libraries.
    h = host_of(agent)
    held = set(h.check_output("apt-mark showhold").split())
    for pinset in all_pins(cluster.versions):
        for package, version in pinset.packages:
            pkg = h.package(package)
            assert pkg.is_installed, package
            assert pkg.version == version, f"{package} {pkg.version} (pinned {version})"
            assert package in held, f"{package} is not held"


def test_apt_candidate_is_the_pin(agent, host_of, cluster):
    # The preferences are what keeps an `apt-get upgrade` (held or not) on the pinned stack.
    h = host_of(agent)
    for pinset in all_pins(cluster.versions):
        names = " ".join(p for p, _ in pinset.packages)
        policy = h.check_output(f"LC_ALL=C apt-cache policy {names}")
        candidates = [
            line.split(":", 1)[1].strip()
            for line in policy.splitlines()
            if line.strip().startswith("Candidate:")
        ]
        assert candidates == [v for _, v in pinset.packages], policy


def test_ofed_release(node, host_of, cluster):
    out = host_of(node).check_output("ofed_info -s")
    assert out.strip() == ofed_release(cluster.versions.mofed) + ":"


def test_ib_ports_active(node, host_of):
    ports = parse_ibstat(host_of(node).check_output("ibstat").splitlines())
    assert ports, "ibstat shows no port"
    # The fabric's ports only: ibstat also lists a ConnectX port in Ethernet mode (RoCE, or a
    # storage NIC; `Link layer: Ethernet`), whose state says nothing about InfiniBand.
    ports = {k: v for k, v in ports.items() if v.get("Link layer", "InfiniBand") == "InfiniBand"}
    assert ports, "ibstat shows no InfiniBand port (every port's Link layer is Ethernet)"
    for (ca, port), fields in ports.items():
        assert fields.get("State") == "Active", f"{ca} port {port}: State {fields.get('State')}"
        assert fields.get("Physical state") == "LinkUp", (
            f"{ca} port {port}: Physical state {fields.get('Physical state')}"
        )


def test_subnet_manager_master(node, host_of, cluster):
    """`sminfo` asks the SM the local port names: one must answer as master (rdma-core
    infiniband-diags/sminfo.c prints "... state 3 SMINFO_MASTER"); with network.subnet_manager,
    opensmd runs on that node. A node whose sminfo cannot run, or whose ports are all down
    (nothing to ask over), is skipped, not failed."""
    h = host_of(node)
    result = h.run("sminfo")
    found = parse_sminfo(result.stdout or "")
    if found is None or (result.rc != 0 and "failed" not in found):
        err = (result.stderr or result.stdout or "no output").strip().splitlines()
        pytest.skip(f"could not run: sminfo -> exit {result.rc}: {err[-1] if err else 'no output'}")
    if "failed" in found and str(found["failed"]).startswith("Failed to open"):
        pytest.skip(f"could not run: sminfo: {found['failed']} (no InfiniBand port to ask from)")
    if "failed" in found:
        # A port whose link is down cannot ask anyone (the IB port row says why): not the SM's.
        why = no_linked_port(parse_ibstat(h.run("ibstat").stdout.splitlines()))
        if why:
            pytest.skip(f"could not run: sminfo: {found['failed']}: {why}")
    assert "failed" not in found, f"no subnet manager answers: sminfo: {found['failed']}"
    assert found["name"] == "SMINFO_MASTER", (
        f"the SM at lid {found['lid']} ({found['guid']}) is {found['name']}, not SMINFO_MASTER"
    )
    manager = cluster.network.subnet_manager
    if manager == node.hostname:
        state = h.run(f"systemctl is-active {shlex.quote(OPENSMD_UNIT)}").stdout.strip()
        assert state == "active", f"network.subnet_manager is {manager}, but {OPENSMD_UNIT} is {state}"


def test_running_kernel_held(node, host_of):
    # MLNX_OFED's --add-kernel-support modules exist for this kernel only (no DKMS).
    h = host_of(node)
    release = h.check_output("uname -r").strip()
    candidates = gpu_node.hold_candidates(release)
    installed = {p for p in candidates if h.package(p).is_installed}
    headers = gpu_node.headers_package(release)
    assert headers in installed, f"{headers} is not installed"
    held = set(h.check_output("apt-mark showhold").split())
    unheld = [p for p in candidates if p in installed and p not in held]
    assert not unheld, f"not held: {', '.join(unheld)}"
    blacklist = h.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    missing = [e for e in gpu_node.uu_blacklist_entries(release) if f'"{e}"' not in blacklist]
    assert not missing, f"not in Unattended-Upgrade::Package-Blacklist ({gpu_node.UU_CONF}): {missing}"
