"""verify's own oracle for master.yaml (tests/verify/master_config.py): it agrees with what the
deploy renders for every shape of cluster.yaml, and it tells a wrong value, a missing or extra
key and a wrong secret apart, one line each, without a secret's value.

The TLS shapes are checked beside their rendering tests (tests/unit/test_master_tls.py,
tests/unit/test_storage_tls.py).
"""

from __future__ import annotations

import copy

import pytest
import yaml

from roles.determined import master as determined_master
from tests.unit.test_storage_roles import NASTY, write_cluster
from tests.verify.master_config import differences, expected_master_yaml, expected_task_container_defaults

DIGEST = "sha256:" + "3" * 64


def _edit_registry(doc):
    doc["sources"]["registry"] = "reg.site:5000"
    doc["determined"]["task_image"] = {
        "gpu": f"nvcr.io/nvidia/pytorch:22.08-py3@{DIGEST}",
        "cpu": f"ubuntu:22.04@{DIGEST}",
    }


def _edit_two_interfaces(doc):
    doc["nodes"][1]["ipoib_interface"] = "ibp65s0"
    doc["nodes"].append(
        {
            "hostname": "g2",
            "address": "127.0.0.3",
            "ipoib_address": "10.78.9.12",
            "roles": ["agent"],
            "slots": 4,
        }
    )


SHAPES = {
    "defaults": ({}, None),
    "prefix and region": ({"prefix": "team-a/ckpt", "region": "eu-central-1"}, None),
    "by hostname": ({}, lambda doc: doc["storage"].update(endpoint_url="http://m1:9000")),
    "site registry": ({}, _edit_registry),
    "nccl_ib_hca": ({}, lambda doc: doc["network"].update(nccl_ib_hca="mlx5_0:1,mlx5_1:1")),
    "no common interface": ({}, _edit_two_interfaces),
    "shm and database": (
        {},
        lambda doc: (
            doc["determined"].update(shm_size_bytes=17179869184),
            doc["database"].update(name="det", user="det_user", port=5433),
        ),
    ),
}


def load(tmp_path, monkeypatch, shape="defaults"):
    from deploy.cluster import load_cluster

    for key, value in NASTY.items():
        monkeypatch.setenv(key, value)
    kwargs, edit = SHAPES[shape]
    path = write_cluster(tmp_path, **kwargs)
    if edit is not None:
        doc = yaml.safe_load(path.read_text())
        edit(doc)
        path.write_text(yaml.safe_dump(doc))
    return load_cluster(path)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_rendered_master_yaml_is_what_cluster_yaml_implies(tmp_path, monkeypatch, shape):
    """Two ways to the same file: the deploy's template and verify's oracle agree."""
    cluster = load(tmp_path, monkeypatch, shape)
    config = yaml.safe_load(determined_master.master_yaml(cluster))
    assert differences(config, expected_master_yaml(cluster)) == []


def test_the_oracle_reads_the_model_not_the_template(tmp_path, monkeypatch):
    cluster = load(tmp_path, monkeypatch, "site registry")
    expected = expected_master_yaml(cluster)
    assert expected["checkpoint_storage"]["endpoint_url"] == cluster.trial_endpoint == "http://127.0.0.1:9000"
    assert expected["task_container_defaults"]["image"] == {
        "cuda": f"reg.site:5000/nvidia/pytorch:22.08-py3@{DIGEST}",
        "cpu": f"reg.site:5000/library/ubuntu:22.04@{DIGEST}",
    }
    assert expected["task_container_defaults"] == expected_task_container_defaults(cluster)


@pytest.fixture
def case(tmp_path, monkeypatch):
    cluster = load(tmp_path, monkeypatch, "prefix and region")
    return cluster, yaml.safe_load(determined_master.master_yaml(cluster))


def changed(config, path: str, value=None, delete=False):
    out = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if delete:
        del node[last]
    else:
        node[last] = value
    return out


def test_a_wrong_value_is_named_with_both_values(case):
    cluster, config = case
    wrong = changed(config, "checkpoint_storage.endpoint_url", "http://m1:9000")
    assert differences(wrong, expected_master_yaml(cluster)) == [
        "checkpoint_storage.endpoint_url is 'http://m1:9000', cluster.yaml implies 'http://127.0.0.1:9000'"
    ]
    # A number written as text is another value: Determined refuses `port: "23457"`.
    assert differences(changed(config, "port", "23457"), expected_master_yaml(cluster)) == [
        "port is '23457', cluster.yaml implies 23457"
    ]


def test_missing_and_unexpected_keys(case):
    cluster, config = case
    expected = expected_master_yaml(cluster)
    assert differences(changed(config, "checkpoint_storage.prefix", delete=True), expected) == [
        "checkpoint_storage.prefix is missing, cluster.yaml implies 'team-a/ckpt'"
    ]
    # The article's region key, and TLS files without determined.tls.
    assert differences(changed(config, "checkpoint_storage.region", "eu-central-1"), expected) == [
        "checkpoint_storage.region is 'eu-central-1', cluster.yaml implies none"
    ]
    assert differences(changed(config, "security.tls", {"cert": "/x", "key": "/y"}), expected) == [
        "security.tls is {'cert': '/x', 'key': '/y'}, cluster.yaml implies none"
    ]
    # Empty is absent: the running master prints an unset key empty.
    assert differences(changed(config, "task_container_defaults.bind_mounts", []), expected) == []


def test_environment_variables_by_name(case):
    cluster, config = case
    expected = expected_master_yaml(cluster)
    env = "task_container_defaults.environment_variables"
    assert differences(changed(config, env, ["AWS_DEFAULT_REGION=us-east-1"]), expected) == [
        f"{env} has AWS_DEFAULT_REGION=us-east-1, cluster.yaml implies AWS_DEFAULT_REGION=eu-central-1"
    ]
    # An interface name for every trial breaks the one-agent trials on Docker's bridge network.
    extra = ["AWS_DEFAULT_REGION=eu-central-1", "NCCL_SOCKET_IFNAME=ib0"]
    assert differences(changed(config, env, extra), expected) == [
        f"{env} has NCCL_SOCKET_IFNAME=ib0, which cluster.yaml does not imply"
    ]
    assert differences(changed(config, env, []), expected) == [f"{env} lacks AWS_DEFAULT_REGION=eu-central-1"]
    twice = ["AWS_DEFAULT_REGION=eu-central-1"] * 2
    assert differences(changed(config, env, twice), expected) == [f"{env} sets AWS_DEFAULT_REGION twice"]


def test_secrets_are_compared_and_never_shown(case):
    cluster, config = case
    expected = expected_master_yaml(cluster)
    wrong = changed(config, "db.password", "guess-1")
    wrong = changed(wrong, "checkpoint_storage.secret_key", cluster.storage.secret_key.value)  # the root's
    wrong = changed(wrong, "security.initial_user_password", delete=True)
    lines = differences(wrong, expected)
    assert lines == [
        "db.password is not database.password",
        "checkpoint_storage.secret_key is not storage.determined_user's secret key",
        "security.initial_user_password is missing, cluster.yaml implies determined.admin_password",
    ]
    text = "\n".join(lines) + repr(expected)
    for secret in (
        "guess-1",
        NASTY["T_SECRET"],
        NASTY["T_DB"],
        NASTY["T_ADMIN"],
        cluster.storage.determined_secret.value,
    ):
        assert secret not in text
