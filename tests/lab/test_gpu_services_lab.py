"""Persistence mode, nvidia-persistenced and nvidia-peermem on the lab's agents.

Persistence mode switched off by hand on one agent, and nvidia-peermem unloaded on another
(`modprobe -r`: the lab's modprobe, tests/lab/standins/kernel/kmod.py), turn exactly those
two cells red in verify; a deploy turns both on again and a second deploy changes nothing. The fabric
manager is installed exactly where the node's PCI bus shows NVSwitches: the nodes whose
lab-hardware.yaml preset has them (tests/lab/hardware.py pci_devices); the others see the
controller's PCI bus, which has none.
"""

from .conftest import LAB_CLUSTER, failing_cells, run_verify
from .hardware import pci_devices

PERSISTENCE_CELL = "test_gpu_stack::test_persistence_mode_on_every_gpu"
PEERMEM_CELL = "test_gpu_stack::test_nvidia_peermem_loaded"


def test_persistenced_runs_with_persistence_mode(deployed, lab, lab_ssh):
    switched = set(pci_devices(LAB_CLUSTER))
    assert switched, "lab-hardware.yaml names no node with NVSwitches"
    for agent in lab.agents:
        h = agent.hostname
        assert lab_ssh(h, "systemctl is-active nvidia-persistenced").stdout.strip() == "active"
        modes = lab_ssh(h, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout.split()
        assert modes and set(modes) == {"Enabled"}, (h, modes)
        peermem = lab_ssh(h, "cat /sys/module/nvidia_peermem/initstate /sys/module/nvidia_peermem/version")
        assert peermem.stdout.split() == ["live", lab.versions.nvidia_driver], (h, peermem.stdout)
        fm = lab_ssh(h, "dpkg-query -W -f='${Status}' nvidia-fabricmanager-515", check=False)
        if h in switched:
            assert fm.stdout == "hold ok installed", (h, fm.stdout)
            assert lab_ssh(h, "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
        else:
            assert fm.returncode != 0 or "not-installed" in fm.stdout, (h, fm.stdout)


def test_persistence_off_and_peermem_unloaded_turn_their_cells_red_and_a_deploy_repairs_them(
    deployed, lab, lab_ssh, deploy, tmp_path
):
    node, other = "lab-gpu2", "lab-gpu3"
    lab_ssh(node, "nvidia-smi -pm 0 >/dev/null")
    lab_ssh(other, "modprobe -r nvidia-peermem")
    junit = tmp_path / "verify.xml"
    result = run_verify("-n", "4", f"--junitxml={junit}")
    assert result.returncode != 0
    expected = {f"{PERSISTENCE_CELL}[{node}]", f"{PEERMEM_CELL}[{other}]"}
    assert failing_cells(junit) == expected, result.stdout[-4000:]

    repair = deploy()
    assert repair.returncode == 0, repair.stderr[-3000:]
    changed = repair.changed_operations()
    assert any("Persistence mode on" in op and node in op for op in changed), changed
    assert any("nvidia-peermem loaded" in op and op.endswith(other) for op in changed), changed
    again = deploy()
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.results["totals"]["success"] == 0, again.changed_operations()
    assert run_verify("-n", "4").returncode == 0
