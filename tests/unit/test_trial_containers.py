"""What a trial container gets: master.yaml's task_container_defaults, the trial images and
their CUDA table, and the master stand-in's decoder for that part of master.yaml."""

from __future__ import annotations

import yaml

from deploy.cluster import images, load_cluster
from roles.determined import master as determined_master
from tests.unit.test_standin_determined import MASTER, free_port, load, run_master
from tests.unit.test_storage_roles import NASTY, write_cluster
from tests.verify.test_determined import KNOWN_MASTER, unknown_keys

DIGEST = "sha256:" + "5" * 64


def cluster_from(tmp_path, monkeypatch, edit=None):
    for key, value in NASTY.items():
        monkeypatch.setenv(key, value)
    path = write_cluster(tmp_path)
    if edit is not None:
        doc = yaml.safe_load(path.read_text())
        edit(doc)
        path.write_text(yaml.safe_dump(doc))
    return load_cluster(path)


def rendered(cluster) -> dict:
    return yaml.safe_load(determined_master.master_yaml(cluster))


# --- master.yaml ----------------------------------------------------------------------------


def test_task_container_defaults_defaults(tmp_path, monkeypatch):
    config = rendered(cluster_from(tmp_path, monkeypatch))
    assert unknown_keys(config, KNOWN_MASTER) == []
    assert config["task_container_defaults"] == {
        "image": {"cuda": images.DEFAULT_GPU_IMAGE, "cpu": images.DEFAULT_CPU_IMAGE},
        "shm_size_bytes": 4294967296,
        "dtrain_network_interface": "ib0",
        "add_capabilities": ["IPC_LOCK"],
        "devices": [{"host_path": "/dev/infiniband", "container_path": "/dev/infiniband"}],
        "environment_variables": [
            "AWS_DEFAULT_REGION=us-east-1",
        ],
    }
    # The storage node m1 by address: bridge-network containers do not read /etc/hosts.
    assert config["checkpoint_storage"]["endpoint_url"] == "http://127.0.0.1:9000"


def test_task_images_shm_and_agent_interface(tmp_path, monkeypatch):
    gpu = f"registry.site:5000/determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.11-gpu-748dda4@{DIGEST}"
    cpu = f"ubuntu:22.04@{DIGEST}"

    def edit(doc):
        doc["determined"]["task_image"] = {"gpu": gpu, "cpu": cpu}
        doc["determined"]["shm_size_bytes"] = 17179869184
        doc["nodes"][1]["ipoib_interface"] = "ibp65s0"  # the agent's; the master's differs

    cluster = cluster_from(tmp_path, monkeypatch, edit)
    tcd = rendered(cluster)["task_container_defaults"]
    assert tcd["image"] == {"cuda": gpu, "cpu": cpu}
    assert tcd["shm_size_bytes"] == 17179869184
    assert tcd["dtrain_network_interface"] == "ibp65s0"
    # No socket interface in what every trial gets: a single-agent trial runs on Docker's
    # bridge network, where a named IPoIB port does not exist and NCCL and Gloo fail on it.
    assert tcd["environment_variables"] == ["AWS_DEFAULT_REGION=us-east-1"]
    assert cluster.fabric_interfaces == ("ibp65s0",)


def test_nccl_ib_hca_reaches_every_trial_when_set(tmp_path, monkeypatch):
    def edit(doc):
        doc["network"]["nccl_ib_hca"] = "mlx5_0:1,mlx5_1:1"

    tcd = rendered(cluster_from(tmp_path, monkeypatch, edit))["task_container_defaults"]
    assert tcd["environment_variables"] == ["AWS_DEFAULT_REGION=us-east-1", "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1"]


def test_agents_with_differently_named_ports_get_every_name(tmp_path, monkeypatch):
    def edit(doc):
        agents = [n for n in doc["nodes"] if "agent" in n.get("roles", [])]
        second = {
            **agents[0],
            "hostname": "g2",
            "address": "127.0.0.3",
            "ipoib_address": "10.78.9.12",
            "ipoib_interface": "ib0",
        }
        agents[0]["ipoib_interface"] = "ibp65s0"
        doc["nodes"].append(second)

    cluster = cluster_from(tmp_path, monkeypatch, edit)
    tcd = rendered(cluster)["task_container_defaults"]
    assert "dtrain_network_interface" not in tcd  # one name only: left to Determined
    assert cluster.dtrain_interface is None
    # What `experiment new` names for a trial that spans agents: every agent's port.
    assert cluster.fabric_interfaces == ("ib0", "ibp65s0")


def test_trial_endpoint(tmp_path, monkeypatch):
    def endpoint(url):
        def edit(doc):
            doc["storage"]["endpoint_url"] = url

        (tmp_path / "cluster.yaml").unlink(missing_ok=True)
        cluster = cluster_from(tmp_path, monkeypatch, edit)
        assert cluster.storage.endpoint_url == url  # cluster.yaml's value stays as written
        return rendered(cluster)["checkpoint_storage"]["endpoint_url"]

    assert endpoint("http://M1.:9000") == "http://127.0.0.1:9000"
    assert endpoint("http://m1-ib0:9000") == "http://10.78.9.10:9000"  # the IPoIB name
    assert endpoint("http://127.0.0.1:9000") == "http://127.0.0.1:9000"
    # https (storage.tls): tests/unit/test_storage_tls.py.


# --- the image table ------------------------------------------------------------------------


def test_cuda_table():
    assert images.too_new(f"determinedai/pytorch-ngc:0.38.0@{DIGEST}", "515.65.01")
    assert images.too_new(f"mirror.site/nvcr.io/nvidia/pytorch:24.03-py3@{DIGEST}", "515.65.01")
    assert images.too_new(f"docker.io/determinedai/pytorch-ngc:0.38.0@{DIGEST}", "515.65.01")
    assert images.too_new(f"nvcr.io/nvidia/pytorch:22.08-py3@{DIGEST}", "515.65.01") is None
    # CUDA 12.0 on R515 through forward compatibility (NGC 23.01's release notes list 515.65+).
    assert images.too_new(f"nvcr.io/nvidia/pytorch:23.01-py3@{DIGEST}", "515.65.01") is None
    # Minor version compatibility: an 11.8 runtime runs on R515.
    assert images.too_new(f"determinedai/environments:cuda-11.8-x@{DIGEST}", "515.65.01") is None
    assert images.too_new(images.DEFAULT_GPU_IMAGE, "515.65.01") is None
    # Unknown images and drivers pass: verify reads NVIDIA_REQUIRE_CUDA on the agents.
    assert images.too_new(f"example/trainer:1@{DIGEST}", "515.65.01") is None
    assert images.too_new(f"determinedai/pytorch-ngc:0.38.0@{DIGEST}", "550.54.15") is None
    assert images.required_cuda("determinedai/pytorch-ngc:0.38.0") == (
        (12, 4),
        images.KNOWN_CUDA[0][3],
        images.KNOWN_CUDA[0][4],
    )


def test_image_ref_grammar():
    ok = [
        f"ubuntu@{DIGEST}",
        f"localhost:5000/a/b_c.d:1.0-x@{DIGEST}",
        f"nvcr.io/nvidia/pytorch:24.03-py3@{DIGEST}",
    ]
    bad = ["Ubuntu@" + DIGEST, f"a:b:c@{DIGEST}", "a@sha256:abc", f"a b@{DIGEST}", f"-a@{DIGEST}"]
    assert all(images.IMAGE_REF.fullmatch(v) for v in ok)
    assert not any(images.IMAGE_REF.fullmatch(v) for v in bad)


# --- the master stand-in ----------------------------------------------------------------------


def test_standin_knows_exactly_the_real_task_container_defaults():
    standin = load(MASTER)
    # KNOWN_MASTER lists the JSON names of model.TaskContainerDefaultsConfig at v0.38.0
    # (determined-ai/determined, master/pkg/model/task_container_defaults.go).
    assert set(standin.TASK_CONTAINER_DEFAULTS.fields) == set(KNOWN_MASTER["task_container_defaults"])


def test_standin_master_accepts_the_rendered_master_yaml(tmp_path, monkeypatch):
    cluster = cluster_from(tmp_path, monkeypatch)
    config = rendered(cluster)
    config.update(port=free_port(), log={"color": False}, cache={"cache_dir": str(tmp_path / "cache")})
    config["db"]["port"] = free_port()  # nothing listens: the decoder passed when it connects
    result = run_master(tmp_path, config)
    assert "cannot unmarshal configuration" not in result.stdout, result.stdout
    assert f"connecting to database localhost:{config['db']['port']}" in result.stdout, result.stdout


def test_verify_reads_the_real_masters_printable_shape(tmp_path, monkeypatch):
    """GET /api/v1/master/config marshals the parsed Go struct (RuntimeItems, DeviceConfig)."""
    from tests.verify.master_config import differences, expected_task_container_defaults
    from tests.verify.test_determined import _as_written

    cluster = cluster_from(tmp_path, monkeypatch)
    expected = expected_task_container_defaults(cluster)
    written = rendered(cluster)["task_container_defaults"]
    env = written["environment_variables"]
    real = {
        **written,
        "environment_variables": {"cpu": env, "cuda": env, "rocm": env},
        "devices": [{**d, "mode": "mrw"} for d in written["devices"]],
        "network_mode": "bridge",
        # Unset keys come back empty, not absent.
        "bind_mounts": [],
        "registry_auth": None,
    }
    assert differences(_as_written(real), expected) == []
    # The lab stand-in reports the file's shape.
    assert _as_written(written) == written and differences(written, expected) == []
    # A master that kept an old image is told apart.
    stale = {**real, "image": {"cuda": "old:1", "cpu": written["image"]["cpu"]}}
    assert differences(_as_written(stale), expected, "task_container_defaults") == [
        f"task_container_defaults.image.cuda is 'old:1', cluster.yaml implies {cluster.task_refs.gpu!r}"
    ]
