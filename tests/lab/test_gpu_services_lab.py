"""Persistence mode, nvidia-persistenced and nvidia-peermem on the lab's agents.

Persistence mode switched off by hand on one agent turns exactly that node's persistence cell
red in verify; a deploy turns it on again and a second deploy changes nothing. The fabric
manager is installed exactly where the node's PCI bus shows NVSwitches: the nodes whose
lab-hardware.yaml preset has them (tests/lab/hardware.py pci_devices); the others see the
controller's PCI bus, which has none.
"""

from .conftest import LAB_CLUSTER, failing_cells, run_verify
from .hardware import pci_devices

PERSISTENCE_CELL = "test_gpu_stack::test_persistence_mode_on_every_gpu"


def test_persistenced_runs_with_persistence_mode(deployed, lab, lab_ssh):
    switched = set(pci_devices(LAB_CLUSTER))
    assert switched, "lab-hardware.yaml names no node with NVSwitches"
    for agent in lab.agents:
        h = agent.hostname
        assert lab_ssh(h, "systemctl is-active nvidia-persistenced").stdout.strip() == "active"
        modes = lab_ssh(h, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout.split()
        assert modes and set(modes) == {"Enabled"}, (h, modes)
        fm = lab_ssh(h, "dpkg-query -W -f='${Status}' nvidia-fabricmanager-515", check=False)
        if h in switched:
            assert fm.stdout == "hold ok installed", (h, fm.stdout)
            assert lab_ssh(h, "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
        else:
            assert fm.returncode != 0 or "not-installed" in fm.stdout, (h, fm.stdout)


def test_persistence_off_turns_its_cell_red_and_a_deploy_repairs_it(deployed, lab, lab_ssh, deploy, tmp_path):
    node = "lab-gpu2"
    lab_ssh(node, "nvidia-smi -pm 0 >/dev/null")
    junit = tmp_path / "verify.xml"
    result = run_verify("-n", "4", f"--junitxml={junit}")
    assert result.returncode != 0
    assert failing_cells(junit) == {f"{PERSISTENCE_CELL}[{node}]"}, result.stdout[-4000:]

    repair = deploy()
    assert repair.returncode == 0, repair.stderr[-3000:]
    assert any("Persistence mode on" in op for op in repair.changed_operations()), repair.changed_operations()
    again = deploy()
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.results["totals"]["success"] == 0, again.changed_operations()
    assert run_verify("-n", "4").returncode == 0
