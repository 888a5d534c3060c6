"""The pinned GPU and fabric stack on the lab: upgrade path, reboots, idempotency, bad tarball.

Reboots are counted from the lab's side: each boot of a node is one "supervise: boot N" line
in its console log (tests/lab/supervise.py), so a test sees every reboot, not just the last.
"""

import re
import shlex
import time

import pytest
import yaml

from deploy.pins import PinSet, driver_pins, ofed_release
from roles.apt.cuda_repo import sources_list, sources_list_path
from roles.apt.pinsets import preferences_path, render_preferences
from roles.fabric import mofed
from roles.shared import kernel

from .paths import LOGS

pytestmark = pytest.mark.lab

OLD_DRIVER = "515.48.07"


def boots(hostname: str) -> int:
    log = LOGS / f"{hostname}.console.log"
    if not log.exists():
        return 0
    return sum(
        1 for line in log.read_text(errors="replace").splitlines() if line.startswith("supervise: boot ")
    )


def all_boots(cluster) -> dict[str, int]:
    return {n.hostname: boots(n.hostname) for n in cluster.nodes}


def boot_id(lab_ssh, hostname: str) -> str:
    return lab_ssh(hostname, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def reboot_and_wait(lab_ssh, hostname: str, timeout: float = 120) -> None:
    before = boot_id(lab_ssh, hostname)
    lab_ssh(hostname, "systemctl reboot", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        probe = lab_ssh(
            hostname,
            "systemctl is-system-running --wait >/dev/null; cat /proc/sys/kernel/random/boot_id",
            check=False,
            timeout=60,
        )
        if probe.returncode == 0 and probe.stdout.strip() and probe.stdout.strip() != before:
            return
        time.sleep(2)
    raise AssertionError(f"{hostname} did not come back from its reboot")


def preseed_old_driver(lab_ssh, hostname: str, cluster) -> None:
    """What an operator's node might look like: an older driver from NVIDIA's repo, held."""
    os_id, os_version = lab_ssh(hostname, ". /etc/os-release; echo $ID $VERSION_ID").stdout.split()
    url = cluster.sources.cuda_repo_for(os_id, os_version)
    listing = sources_list_path(os_id, os_version)
    old = driver_pins(OLD_DRIVER)
    names = " ".join(p for p, _ in old.packages)
    fetch = "import urllib.request, sys; urllib.request.urlretrieve(sys.argv[1], '/tmp/cuda-keyring.deb')"
    script = "; ".join(
        [
            "set -e",
            f"python3 -c {shlex.quote(fetch)} {shlex.quote(url + 'cuda-keyring_1.1-1_all.deb')}",
            "dpkg --force-confdef --force-confold -i /tmp/cuda-keyring.deb",
            f"printf %s {shlex.quote(sources_list(url))} > {listing}",
            # Only the CUDA repo: the node's own Debian sources may be unreachable from here.
            (
                f"apt-get update -o Dir::Etc::sourcelist={listing} -o Dir::Etc::sourceparts=- "
                "-o APT::Get::List-Cleanup=0"
            ),
            f"apt-mark unhold {names} >/dev/null",
            (
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
                "--allow-change-held-packages " + " ".join(old.install_args())
            ),
            f"apt-mark hold {names}",
        ]
    )
    lab_ssh(hostname, f"sh -c {shlex.quote(script)}", timeout=600)


def smi_versions(lab_ssh, hostname: str) -> set[str]:
    out = lab_ssh(
        hostname, "nvidia-smi --query-gpu=driver_version --format=csv,noheader,nounits", check=False
    )
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def test_old_driver_moves_to_the_pin_with_exactly_one_reboot(deployed, deploy, lab, lab_ssh):
    node = lab.agents[0].hostname
    preseed_old_driver(lab_ssh, node, lab)
    reboot_and_wait(lab_ssh, node)  # the old kernel module is now the loaded one
    assert smi_versions(lab_ssh, node) == {OLD_DRIVER}

    before = all_boots(lab)
    run = deploy()
    assert run.returncode == 0, run.stderr[-4000:]
    after = all_boots(lab)

    assert after[node] - before[node] == 1, "the driver change must cost exactly one reboot"
    assert {h: after[h] - before[h] for h in after if h != node} == {h: 0 for h in after if h != node}
    assert smi_versions(lab_ssh, node) == {lab.versions.nvidia_driver}
    pins = driver_pins(lab.versions.nvidia_driver)
    installed = lab_ssh(
        node, "dpkg-query -W -f='${Package} ${Version}\\n' " + " ".join(p for p, _ in pins.packages)
    ).stdout.split("\n")
    assert sorted(filter(None, installed)) == sorted(f"{p} {v}" for p, v in pins.packages)
    held = set(lab_ssh(node, "apt-mark showhold").stdout.split())
    assert {p for p, _ in pins.packages} <= held
    reboots = [op for op in run.results["operations"] if "Reboot into the new NVIDIA driver" in op["name"]]
    assert [op["success"] for op in reboots] == [[node]], reboots


def test_second_run_changes_nothing_and_reboots_nothing(deployed, deploy, lab, lab_ssh):
    ids = {n.hostname: boot_id(lab_ssh, n.hostname) for n in lab.nodes}
    before = all_boots(lab)
    run = deploy()
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.results["totals"]["success"] == 0, run.changed_operations()
    assert all_boots(lab) == before
    assert {n.hostname: boot_id(lab_ssh, n.hostname) for n in lab.nodes} == ids


# apt-daily.service and unattended-upgrades hold dpkg's lock for minutes after a boot (their
# timers fire at boot when a run was missed; the 32-node bench met it, and `apt-mark hold`
# failed at once). A process holding dpkg's frontend lock the way dpkg does (fcntl) stands in.
HOLD_DPKG_LOCK = (
    "import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'w'); "
    "fcntl.lockf(f, fcntl.LOCK_EX); open('/run/dtlab-dpkg-locked', 'w').close(); time.sleep(25)"
)


def test_holds_wait_while_another_process_has_dpkgs_lock(deployed, deploy, lab, lab_ssh):
    node = lab.agents[0].hostname
    package = driver_pins(lab.versions.nvidia_driver).packages[0][0]
    lab_ssh(node, f"apt-mark unhold {package} && rm -f /run/dtlab-dpkg-locked")
    lab_ssh(node, f"systemd-run --collect --unit=dtlab-dpkg-lock python3 -c {shlex.quote(HOLD_DPKG_LOCK)}")
    lab_ssh(node, "for i in $(seq 50); do [ -e /run/dtlab-dpkg-locked ] && exit 0; sleep 0.1; done; exit 1")
    run = deploy(limit=node)
    locked = lab_ssh(node, "systemctl is-active dtlab-dpkg-lock", check=False).stdout.strip()
    assert run.returncode == 0, run.stderr[-4000:]
    assert package in lab_ssh(node, "apt-mark showhold").stdout.split()
    # The hold waited for the lock rather than failing: the holder was gone when the deploy ended.
    assert locked != "active"
    changed = run.changed_operations()
    assert changed and all("Hold " in name for name in changed), changed


# openibd failed as it did at boot on 2 of 31 agents of the 32-node bench (219/CGROUP): its
# unit refuses a manual stop (RefuseManualStop=true), so a runtime drop-in lifts that and makes
# its next start fail, and goes again once the unit is failed.
FAIL_OPENIBD = (
    "d=/run/systemd/system/openibd.service.d && mkdir -p $d && "
    "printf '[Unit]\\nRefuseManualStop=false\\n[Service]\\nExecStartPre=/bin/false\\n' "
    "> $d/dtlab-fail.conf && "
    "systemctl daemon-reload && systemctl stop openibd.service && ! systemctl start openibd.service; "
    "rm -f $d/dtlab-fail.conf && systemctl daemon-reload && systemctl is-failed openibd.service"
)


def test_a_redeploy_starts_a_failed_openibd(deployed, deploy, lab, lab_ssh):
    node = lab.agents[0].hostname
    try:
        assert lab_ssh(node, FAIL_OPENIBD).stdout.strip() == "failed"
        assert lab_ssh(node, "test -e /dev/infiniband/uverbs0", check=False).returncode != 0
        run = deploy(limit=node)
        assert run.returncode == 0, run.stderr[-4000:]
        assert lab_ssh(node, "systemctl is-active openibd.service").stdout.strip() == "active"
        lab_ssh(node, "test -e /dev/infiniband/uverbs0")
        changed = run.changed_operations()
        assert changed and all("openibd is active" in name for name in changed), changed
    finally:
        restore = "systemctl is-active --quiet openibd.service || systemctl start openibd.service"
        lab_ssh(node, restore, check=False)


@pytest.fixture
def wrong_ofed_sha_inventory(lab, tmp_path):
    raw = yaml.safe_load(lab.path.read_text())
    raw["sources"]["mofed_tarball"]["sha256"] = "0" * 64
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(raw, sort_keys=False))
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(cluster)!r}))\n")
    return inventory


def test_wrong_ofed_sha_stops_that_host_only(deployed, deploy, lab, lab_ssh, wrong_ofed_sha_inventory):
    node = lab.nodes[-1].hostname
    others = [n.hostname for n in lab.nodes if n.hostname != node]
    lab_ssh(node, "/usr/sbin/ofed_uninstall.sh --force")
    os_id, os_version = lab_ssh(node, ". /etc/os-release; echo $ID $VERSION_ID").stdout.split()
    tarball = mofed.tarball_name(lab.sources.mofed_url_for(os_id, os_version, lab.versions.mofed))
    try:
        run = deploy(inventory=wrong_ofed_sha_inventory)
        assert run.returncode == 1, run.stderr[-4000:]
        assert run.results["failed_hosts"] == [node]
        assert f"{tarball}: sha256 mismatch" in run.stderr
        left = lab_ssh(node, f"find / -xdev -name '{tarball}*' 2>/dev/null", check=False)
        assert left.stdout.strip() == "", left.stdout
        for other in others:
            assert lab_ssh(other, "ofed_info -s").stdout.strip() == (ofed_release(lab.versions.mofed) + ":")
    finally:
        restored = deploy()
    assert restored.returncode == 0, restored.stderr[-4000:]
    assert lab_ssh(node, "ofed_info -s").stdout.strip() == ofed_release(lab.versions.mofed) + ":"


def test_ofed_installer_refuses_without_prerequisites_until_the_role_installs_them(deploy, lab, lab_ssh):
    """The stand-in stops where mlnx_add_kernel_support.sh stops; the deploy gets it through.

    One node, deployed on its own (--limit): MLNX_OFED and the kernel hold are per node."""
    node = lab.nodes[0].hostname
    assert lab_ssh(node, "ofed_info -s").stdout.strip() == ofed_release(lab.versions.mofed) + ":"
    release = lab_ssh(node, "uname -r").stdout.strip()
    headers = kernel.headers_package(release)
    os_id, os_version = lab_ssh(node, ". /etc/os-release; echo $ID $VERSION_ID").stdout.split()
    url = lab.sources.mofed_url_for(os_id, os_version, lab.versions.mofed)
    top = mofed.unpacked_dir(mofed.tarball_name(url))
    fetch = "import urllib.request, sys; urllib.request.urlretrieve(sys.argv[1], '/tmp/ofed.tgz')"
    setup = "; ".join(
        [
            "set -e",
            "/usr/sbin/ofed_uninstall.sh --force >/dev/null",
            f"apt-mark unhold {headers} >/dev/null",
            f"DEBIAN_FRONTEND=noninteractive apt-get purge -y -q {headers} apt-utils quilt >/dev/null",
            f"python3 -c {shlex.quote(fetch)} {shlex.quote(url)}",
            "rm -rf /tmp/ofed && mkdir /tmp/ofed && tar -xzf /tmp/ofed.tgz -C /tmp/ofed",
        ]
    )
    lab_ssh(node, f"sh -c {shlex.quote(setup)}", timeout=600)
    try:
        refused = lab_ssh(
            node,
            f"cd /tmp/ofed/{top} && ./mlnxofedinstall --without-fw-update --add-kernel-support --force",
            check=False,
            timeout=300,
        )
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "ERROR: 'apt-utils' is not installed!" in refused.stdout
        assert f"/lib/modules/{release}/build/scripts is required for the Installation." in refused.stdout
        wanted = next(line for line in refused.stdout.splitlines() if line.startswith("apt-get install "))
        assert set(wanted.split()[2:]) == {"quilt", headers}, wanted
        assert f"Failed to build MLNX_OFED_LINUX for {release}" in refused.stderr
        assert lab_ssh(node, "ofed_info -s", check=False).returncode != 0
    finally:
        lab_ssh(node, "rm -rf /tmp/ofed /tmp/ofed.tgz", check=False)
        run = deploy(limit=node)
    assert run.returncode == 0, run.stderr[-4000:]
    assert lab_ssh(node, "ofed_info -s").stdout.strip() == ofed_release(lab.versions.mofed) + ":"
    assert headers in lab_ssh(node, "apt-mark showhold").stdout.split()
    blacklist = lab_ssh(node, "apt-config dump Unattended-Upgrade::Package-Blacklist").stdout
    assert f'"{kernel.uu_blacklist_entries(release)[1]}"' in blacklist


# The install the driver role runs, simulated (`apt-get install -s`) on a deployed GPU node
# against the lab's NVIDIA repo (its real lists), as if the driver were not installed: a copy
# of dpkg's status without the driver's packages (and what depends on them), and a
# preferences directory of its own. Nothing on the node changes.
SIMULATE = r"""
import os, re, shutil, subprocess, sys, tempfile
pins_file, drop = sys.argv[1], set(sys.argv[2].split())
stanzas = open("/var/lib/dpkg/status").read().strip().split("\n\n")
def name(s): return re.search(r"^Package: (\S+)", s, re.M).group(1)
def deps(s):
    m = re.search(r"^(?:Pre-)?Depends: (.*)$", s, re.M)
    return set(re.findall(r"([a-z0-9][a-z0-9+.-]+)", re.sub(r"\([^)]*\)", "", m.group(1)))) if m else set()
while True:  # what depends on a dropped package goes too (the container toolkit does not)
    more = {name(s) for s in stanzas if name(s) not in drop and deps(s) & drop}
    if not more:
        break
    drop |= more
root = tempfile.mkdtemp(prefix="dtlab-pins-")
status = os.path.join(root, "status")
open(status, "w").write("\n\n".join(s for s in stanzas if name(s) not in drop) + "\n")
parts = os.path.join(root, "preferences.d")
shutil.copytree("/etc/apt/preferences.d", parts)
if pins_file != "-":  # the driver's preferences replaced by the ones given on stdin
    open(os.path.join(parts, pins_file), "w").write(sys.stdin.read())
proc = subprocess.run(
    ["apt-get", "-o", f"Dir::State::status={status}", "-o", f"Dir::Etc::PreferencesParts={parts}",
     "-o", "Dir::Etc::Preferences=/dev/null", "-o", "Debug::NoLocking=1", "install", "-s", "-y",
     "--no-install-recommends", *sys.argv[3:]],
    capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
)
shutil.rmtree(root)
sys.stdout.write(proc.stdout + proc.stderr)
sys.exit(proc.returncode)
"""

# What deploy/pins.py pinned before it pinned the driver's whole graph.
EIGHT_PINS = (
    "cuda-drivers-515",
    "nvidia-driver-515",
    "nvidia-dkms-515",
    "libnvidia-compute-515",
    "nvidia-compute-utils-515",
    "nvidia-utils-515",
    "nvidia-kernel-source-515",
    "nvidia-modprobe",
)


def test_the_old_eight_driver_pins_fail_on_the_labs_repo_and_the_whole_set_installs(deployed, lab, lab_ssh):
    """The driver role's install with the 8 pins of before (#31) against the lab's NVIDIA repo,
    which has the branch's newer builds of every sub-package as NVIDIA's repo has: apt refuses
    with NVIDIA's repo's words; with the deploy's own preferences file the same install takes
    exactly the pinned set."""
    node = lab.agents[-1].hostname
    pins = driver_pins(lab.versions.nvidia_driver)
    eight = PinSet(name=pins.name, packages=tuple(p for p in pins.packages if p[0] in EIGHT_PINS))
    assert len(eight.packages) == 8
    drop = " ".join(p for p, _ in pins.packages)
    pref_name = preferences_path(pins).rsplit("/", 1)[1]

    def simulate(pref: str, pinset: PinSet, stdin: str = ""):
        args = " ".join(shlex.quote(a) for a in [pref, drop, *pinset.install_args()])
        return lab_ssh(node, f"python3 -c {shlex.quote(SIMULATE)} {args} <<'EOF'\n{stdin}EOF", check=False)

    old = simulate(pref_name, eight, render_preferences(eight))
    assert old.returncode == 100, old.stdout[-3000:]
    driver = lab.versions.nvidia_driver
    assert re.search(
        rf"Depends: libnvidia-\S+-515 \(= {re.escape(driver)}-0ubuntu1\) but 515\.105\.01-0ubuntu1 is to be "
        "installed",
        old.stdout,
    ), old.stdout[-3000:]
    assert "E: Unable to correct problems, you have held broken packages." in old.stdout, old.stdout[-3000:]

    new = simulate("-", pins)
    assert new.returncode == 0, new.stdout[-3000:]
    assert dict(re.findall(r"^Inst (\S+) \((\S+) ", new.stdout, re.M)) == pins.as_dict(), new.stdout[-3000:]
