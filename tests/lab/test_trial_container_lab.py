"""Trial containers on the lab's agents, through the NVIDIA container stand-ins.

A `docker run --gpus all` container sees the node's GPUs at the pinned driver and cuInit
succeeds in it; nvidia-container-cli refuses an image needing a newer CUDA with
libnvidia-container's message; the NVSwitch node (lab-hardware.yaml: a100-nvswitch-8, whose
PCI bus shows six NVSwitches) alone has the fabric manager, ordered before the agent.

Then three breaks at once: the GPU image in master.yaml set to the CUDA 12.4 stand-in
(determinedai/pytorch-ngc:0.38.0), the fabric manager stopped on the NVSwitch node, and the
endpoint trials get set to the storage node's hostname (a bridge container cannot resolve it).
Exactly their cells turn red; one deploy repairs them all, a second changes nothing, verify is
green again.
"""

import shlex

from deploy.cluster.images import site_ref
from roles.determined.master import MASTER_YAML

from .conftest import LAB_CLUSTER, failing_cells, run_verify
from .hardware import pci_devices

REFUSAL = (
    "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update "
    "your driver to a newer version, or use an earlier cuda container"
)
# NVIDIA's nvidia/cuda:12.4 images declare this (alternatives for older drivers included).
CUDA_124_REQUIRE = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"
CUINIT = "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"
CUDA_124_IMAGE = "determinedai/pytorch-ngc:0.38.0"  # the lab registry's stand-in, CUDA 12.4


def nvswitch_nodes() -> list[str]:
    return sorted(pci_devices(LAB_CLUSTER))


def gpu_run(image: str, *args: str) -> str:
    return f"docker run --rm --gpus all {' '.join(shlex.quote(a) for a in args)} {shlex.quote(image)} "


def test_gpu_containers_and_the_fabric_manager(deployed, lab, lab_ssh):
    image = lab.task_refs.gpu
    switched = nvswitch_nodes()
    assert switched, "lab-hardware.yaml names no node with NVSwitches"
    for agent in lab.agents:
        h = agent.hostname
        listed = lab_ssh(h, gpu_run(image) + "nvidia-smi -L").stdout.splitlines()
        assert len(listed) == 8 and all(line.startswith("GPU ") for line in listed), listed
        assert lab_ssh(h, gpu_run(image) + "python3 -c " + shlex.quote(CUINIT)).stdout.strip() == "0"
        refused = lab_ssh(
            h, gpu_run(image, f"--env=NVIDIA_REQUIRE_CUDA={CUDA_124_REQUIRE}") + "true", check=False
        )
        assert refused.returncode != 0 and REFUSAL in refused.stderr, refused.stderr
        fm = lab_ssh(h, "dpkg-query -W -f='${Status}' nvidia-fabricmanager-515", check=False)
        if h in switched:
            assert fm.stdout == "hold ok installed", fm.stdout
            assert lab_ssh(h, "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
            after = lab_ssh(h, "systemctl show -p After determined-agent.service").stdout
            assert "nvidia-fabricmanager.service" in after, after
        else:
            assert fm.returncode != 0 or "not-installed" in fm.stdout, fm.stdout


def test_breaks_turn_exactly_their_cells_red_and_a_deploy_repairs_them(
    deployed, lab, lab_ssh, deploy, tmp_path
):
    master = lab.master_node.hostname
    storage = lab.storage_node
    switched = nvswitch_nodes()
    image = lab.task_refs.gpu
    unresolvable = f"http://{storage.hostname}:{lab.storage.port}"
    ngc = site_ref(lab, CUDA_124_IMAGE)
    edit = (
        f"sed -i -e 's|^    cuda: .*|    cuda: {ngc}|' "
        f"-e 's|^  endpoint_url: .*|  endpoint_url: {unresolvable}|' {MASTER_YAML}"
    )
    try:
        lab_ssh(master, edit)
        for h in switched:
            lab_ssh(h, "systemctl stop nvidia-fabricmanager")
            out = lab_ssh(h, gpu_run(image) + "python3 -c " + shlex.quote(CUINIT)).stdout.strip()
            assert out == "802", out  # CUDA_ERROR_SYSTEM_NOT_READY

        junit = tmp_path / "verify.xml"
        result = run_verify("-n", "4", f"--junitxml={junit}")
        assert result.returncode != 0
        expected = {f"test_determined::test_master_yaml[{master}]"}
        for agent in lab.agents:
            expected.add(f"test_trial_container::test_trial_image_cuda_within_driver[{agent.hostname}]")
            expected.add(f"test_trial_container::test_s3_round_trip_from_bridge_container[{agent.hostname}]")
        for h in switched:
            expected.add(f"test_gpu_stack::test_fabric_manager_matches_nvswitches[{h}]")
            expected.add(f"test_trial_container::test_gpu_container_sees_gpus_and_cuda_initialises[{h}]")
        assert failing_cells(junit) == expected, result.stdout[-6000:]

    except BaseException:
        deploy()  # the lab is shared: leave it repaired for the tests after this one
        raise

    repair = deploy()
    assert repair.returncode == 0, repair.stderr[-3000:]
    changed = repair.changed_operations()
    assert any("Fabric manager enabled and running" in op for op in changed), changed
    assert any(MASTER_YAML in op for op in changed), changed
    again = deploy()
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.results["totals"]["success"] == 0, again.changed_operations()
    final = run_verify("-n", "4")
    assert final.returncode == 0, final.stdout[-6000:]
