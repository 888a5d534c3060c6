"""deploy.experiment: `new` lints clean, each lint rule fires and says the fix, bad input is one line."""

from __future__ import annotations

import inspect
import py_compile
import random
from pathlib import Path

import pytest
import yaml

from deploy.experiment import lint, template
from deploy.experiment.__main__ import main
from deploy.experiment.target import load
from tests.unit.test_cluster import lab_copy

LAB = "inventories/lab/cluster.yaml"  # read without secrets (resolve_secrets=False)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    path, _ = lab_copy(tmp_path_factory.mktemp("lab"))
    return str(path)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("slots", [1, 2, 4, 8])
def test_new_lints_clean_for_the_lab(lab, tmp_path, capsys, slots):
    out = tmp_path / f"exp{slots}"
    assert run(capsys, "new", "--cluster", lab, "--slots", str(slots), "--out", str(out))[0] == 0
    code, printed, _ = run(
        capsys, "lint", "--strict", "--cluster", lab, str(out / "experiment.yaml"), str(out / "model")
    )
    assert (code, printed.strip()) == (0, f"{out / 'experiment.yaml'}: ok")


def test_new_prints_the_lab_values_and_no_secret(tmp_path, capsys):
    path, secrets = lab_copy(tmp_path)
    code, out, err = run(capsys, "new", "--cluster", str(path), "--slots", "16")
    assert code == 0
    config = yaml.safe_load(out)
    storage = config["checkpoint_storage"]
    assert storage == {
        "type": "s3",
        "bucket": "det-checkpoints",
        "endpoint_url": "http://10.77.0.10:9000",
        "save_trial_latest": 1,
    }
    assert config["environment"]["image"]["cuda"].startswith(
        "10.77.0.1:5000/determinedai/environments:cuda-11.3"
    )
    assert config["resources"]["slots_per_trial"] == 16
    assert "NVLink domains unknown" in err and "--nvlink-slots" in err
    for value in secrets.values():
        assert value not in out
    assert "region:" not in out.replace("`region:`", "")


def test_new_warns_beyond_the_nvlink_domain(lab, capsys):
    code, _, err = run(capsys, "new", "--cluster", lab, "--slots", "8", "--nvlink-slots", "4")
    assert code == 0 and "exceeds the largest NVLink domain" in err


def test_generated_model_compiles_and_matches_core_api(tmp_path):
    target = load(str(lab_copy(tmp_path)[0]))
    train = template.write(target, 2, tmp_path / "out")[1]
    py_compile.compile(str(train), doraise=True)
    import determined as det
    from determined import core

    text = train.read_text()
    calls = {
        "core.init": (core.init, ["distributed"]),
        "core.DistributedContext.from_torch_distributed": (
            core.DistributedContext.from_torch_distributed,
            [],
        ),
        "core_context.train.report_training_metrics": (
            core.TrainContext.report_training_metrics,
            ["steps_completed", "metrics"],
        ),
        "core_context.train.report_validation_metrics": (
            core.TrainContext.report_validation_metrics,
            ["steps_completed", "metrics"],
        ),
        "core_context.checkpoint.store_path": (core.CheckpointContext.store_path, ["metadata"]),
        "core_context.checkpoint.restore_path": (core.CheckpointContext.restore_path, ["storage_id"]),
        "core_context.preempt.should_preempt": (core.PreemptContext.should_preempt, []),
        "dist.allgather": (core.DistributedContext.allgather, ["stuff"]),
        "det.get_cluster_info": (det.get_cluster_info, []),
    }
    for call, (function, params) in calls.items():
        assert f"{call}(" in text, call
        assert set(params) <= set(inspect.signature(function).parameters), call
    assert {"latest_checkpoint", "trial"} <= set(dir(det.ClusterInfo))


@pytest.mark.parametrize("slots", [1, 4])
def test_the_fairness_example_lints_clean_and_names_its_knobs(lab, tmp_path, capsys, slots):
    out = tmp_path / "fair"
    argv = ["new", "--cluster", lab, "--example", "fairness", "--slots", str(slots), "--out", str(out)]
    assert run(capsys, *argv)[0] == 0
    code, printed, _ = run(
        capsys, "lint", "--strict", "--cluster", lab, str(out / "experiment.yaml"), str(out / "model")
    )
    assert (code, printed.strip()) == (0, f"{out / 'experiment.yaml'}: ok")
    config = yaml.safe_load((out / "experiment.yaml").read_text())
    assert config["name"] == "example-fairness"
    assert config["searcher"]["metric"] == "loss"
    assert config["hyperparameters"]["global_batch_size"] % slots == 0
    assert {"gap_threshold", "stop_on_gap", "group_bias"} <= set(config["hyperparameters"])
    py_compile.compile(str(out / "model" / "train.py"), doraise=True)


def _fairness_functions() -> dict:
    """make_data, gradient and audit of the example's train.py, without the harness's main."""
    namespace: dict = {}
    source = template.train_py("fairness").split('if __name__ == "__main__":')[0]
    exec(compile(source, "fairness-train.py", "exec"), namespace)
    return namespace


def test_the_fairness_audit_measures_both_gaps():
    import numpy as np

    audit = _fairness_functions()["audit"]
    # Four positives in each group; the model finds 4 of group 0's and 1 of group 1's, and
    # predicts positive for 4 of 4 in group 0, 1 of 4 in group 1 (no negatives predicted positive).
    x = np.eye(4)[[0] * 4 + [1] * 4]
    y = np.ones(8, dtype=np.int64)
    group = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    w = np.array([10.0, -10.0, 0.0, 0.0])
    metrics = audit(w, 0.0, x, y, group)
    assert metrics["fairness/tpr_group0"] == 1.0 and metrics["fairness/tpr_group1"] == 0.0
    x[4] = np.eye(4)[0]  # one of group 1's positives found
    metrics = audit(w, 0.0, x, y, group)
    assert metrics["fairness/equal_opportunity_gap"] == pytest.approx(0.75)
    assert metrics["fairness/demographic_parity_gap"] == pytest.approx(0.75)
    assert metrics["accuracy"] == pytest.approx(5 / 8)


@pytest.mark.parametrize(("group_bias", "flagged"), [(0.0, False), (1.0, True)])
def test_the_fairness_examples_data_opens_a_gap_only_with_its_bias(group_bias, flagged):
    """The example's default (group_bias 1.0) is flagged at its default threshold 0.1; unbiased
    data is not: the audit measures the data, not a constant."""
    import numpy as np

    f = _fairness_functions()
    hparams = yaml.safe_load(template.fairness.hyperparameters(1, 16))["hyperparameters"]
    assert hparams["group_bias"] == 1.0
    w, b = np.zeros(f["FEATURES"]), 0.0
    x_val, y_val, g_val = f["make_data"](4000, group_bias, 7)
    for step in range(1, hparams["steps"] + 1):
        x, y, _ = f["make_data"](16, group_bias, 100_000 * step)
        gw, gb = f["gradient"](w, b, x, y)
        w, b = w - hparams["learning_rate"] * gw / 16, b - hparams["learning_rate"] * gb / 16
    metrics = f["audit"](w, b, x_val, y_val, g_val)
    gaps = [metrics["fairness/equal_opportunity_gap"], metrics["fairness/demographic_parity_gap"]]
    assert (max(gaps) > hparams["gap_threshold"]) is flagged, metrics
    assert metrics["accuracy"] > 0.8, metrics


def test_new_refuses_a_bad_cluster_in_one_line(tmp_path, capsys):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes: [\n")
    code, out, err = run(capsys, "new", "--cluster", str(bad))
    assert code == 2 and out == "" and "Traceback" not in err and err.startswith(str(bad))
    code, _, err = run(capsys, "lint", "--cluster", str(tmp_path / "missing.yaml"), str(bad))
    assert (
        code == 2
        and err.strip() == f"{tmp_path / 'missing.yaml'}: cannot read the cluster file (no such file)"
    )


GOOD = {
    "name": "x",
    "entrypoint": "python3 -m determined.launch.torch_distributed python3 train.py",
    "searcher": {"name": "single", "metric": "loss"},
    "hyperparameters": {"global_batch_size": 32},
    "resources": {"slots_per_trial": 4},
    "checkpoint_storage": {
        "type": "s3",
        "bucket": "det-checkpoints",
        "endpoint_url": "http://10.77.0.10:9000",
    },
}

# (change to GOOD, key that must be named, words of the fix)
RULES = [
    (
        {"checkpoint_storage": {**GOOD["checkpoint_storage"], "region": "us-east-1"}},
        "checkpoint_storage.region",
        "AWS_DEFAULT_REGION",
    ),
    ({"gpu_affinity": [0, 1]}, "gpu_affinity", "per_domain"),
    (
        {"resources": {"slots_per_trial": 16}, "hyperparameters": {"global_batch_size": 32}},
        "resources.slots_per_trial",
        "at most",
    ),
    ({"hyperparameters": {"global_batch_size": 30}}, "hyperparameters.global_batch_size", "multiple of 4"),
    (
        {"hyperparameters": {"global_batch_size": {"type": "categorical", "vals": [32, 33]}}},
        "hyperparameters.global_batch_size",
        "multiple of 4",
    ),
    (
        {"environment": {"image": {"cuda": "nvcr.io/nvidia/pytorch:24.03-py3"}}},
        "environment.image.cuda",
        "use the pinned",
    ),
    (
        {"checkpoint_storage": {"type": "s3", "bucket": "other"}},
        "checkpoint_storage.bucket",
        "det-checkpoints",
    ),
    (
        {"checkpoint_storage": {"type": "s3", "endpoint_url": "http://lab-master:9000"}},
        "checkpoint_storage.endpoint_url",
        "http://10.77.0.10:9000",
    ),
    (
        {"checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp"}},
        "checkpoint_storage.type",
        "type: s3",
    ),
    (
        {"environment": {"environment_variables": ["AWS_DEFAULT_REGION=eu-west-1"]}},
        "environment.environment_variables",
        "remove it",
    ),
    (
        {"environment": {"environment_variables": ["NCCL_SOCKET_IFNAME=ib0"]}},
        "environment.environment_variables",
        "Docker's bridge network",
    ),
    (
        {"environment": {"environment_variables": {"cuda": ["GLOO_SOCKET_IFNAME=ib"]}}},
        "environment.environment_variables",
        "Bootstrap : no socket interface found",
    ),
    ({"resources": {"slots_per_trial": "four"}}, "resources.slots_per_trial", "refuses it"),
    ({"searcher": {"name": "bayesian"}}, "searcher", "refuses it"),
]


def lint_of(tmp_path, config, nvlink=None, model=None):
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(config))
    return [str(p) for p in lint.lint(str(path), load(LAB, nvlink), model)]


@pytest.mark.parametrize(("change", "key", "fix"), RULES, ids=[r[1] + str(i) for i, r in enumerate(RULES)])
def test_each_rule_fires_and_says_the_fix(tmp_path, change, key, fix):
    assert lint_of(tmp_path, GOOD) == []
    lines = lint_of(tmp_path, {**GOOD, **change})
    hits = [line for line in lines if f": {key}: " in line]
    assert hits and fix in hits[0], lines
    assert len(lines) == len(set(lines))


def test_socket_interfaces_only_where_the_trial_spans_agents(tmp_path):
    env = {"environment_variables": ["NCCL_SOCKET_IFNAME=ib0", "GLOO_SOCKET_IFNAME=ib0"]}
    spanning = {**GOOD, "resources": {"slots_per_trial": 16}, "environment": env}
    spanning["hyperparameters"] = {**GOOD["hyperparameters"], "global_batch_size": 128}
    assert not [line for line in lint_of(tmp_path, spanning) if "bridge network" in line]
    # eth0 or an exclusion is what a bridge container can take.
    for value in ("NCCL_SOCKET_IFNAME=eth0", "NCCL_SOCKET_IFNAME=^docker,lo"):
        assert lint_of(tmp_path, {**GOOD, "environment": {"environment_variables": [value]}}) == []


def test_nvlink_domain_warning(tmp_path):
    lines = lint_of(tmp_path, GOOD, nvlink=2)
    assert len(lines) == 1 and "warning: more than the largest NVLink domain" in lines[0]


def test_code_warnings_only_for_distributed_trials(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "train.py").write_text(
        "m = torch.compile(net)\n# torch.compile(x) in a comment\nDataLoader(ds, persistent_workers=True)\n"
    )
    lines = lint_of(tmp_path, GOOD, model=str(model))
    assert [line.split(": code: ")[0] for line in lines] == [f"{model}/train.py:1", f"{model}/train.py:3"]
    assert "fix:" in lines[0] and "_orig_mod" in lines[0] and "persistent_workers=False" in lines[1]
    assert lint_of(tmp_path, {**GOOD, "resources": {"slots_per_trial": 1}}, model=str(model)) == []
    # Warnings alone exit 0; --strict makes them fail.
    cluster = LAB
    lint_of(tmp_path, GOOD)  # experiment.yaml back to 4 slots
    exp = str(tmp_path / "experiment.yaml")
    assert run(capsys, "lint", "--cluster", cluster, exp, str(model))[0] == 0
    assert run(capsys, "lint", "--strict", "--cluster", cluster, exp, str(model))[0] == 1


MALFORMED = [
    b"",
    b"[1, 2]\n",
    b"just a string\n",
    b"name: [\n",
    b"a: &a [*a]\n",
    b"\xff\xfe\x00bad",
    b"name: x\n\x01\n",
    b"- - - - -\n" * 3,
    b"{" * 200,
    b"key: *undefined\n",
    b"resources: 5\nhyperparameters: [1]\ncheckpoint_storage: s3\nenvironment: {image: 7}\n",
]


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_files_get_lines_not_tracebacks(tmp_path, capsys, lab, data):
    lab_path = lab
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(data)
    code, out, err = run(capsys, "lint", "--cluster", lab_path, str(bad))
    assert code == 1 and err == "" and out.strip()
    for line in out.splitlines():
        assert line.startswith(f"{bad}: ") and "\n" not in line


def test_fuzz_mutated_experiments(tmp_path, capsys, lab):
    """Random byte edits of a real template: always lines or ok, never an exception."""
    lab_path = lab
    source = template.experiment_yaml(load(lab_path), 4).encode()
    rng = random.Random(15)
    bad = tmp_path / "fuzz.yaml"
    for _ in range(150):
        data = bytearray(source)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(data))
            data[i : i + rng.randint(0, 3)] = bytes([rng.choice(b":-[]{}&*!|>'\"#\n x0@%\t")])
        bad.write_bytes(bytes(data))
        code, out, _ = run(capsys, "lint", "--cluster", lab_path, str(bad))
        assert code in (0, 1) and out.strip()


def test_missing_files(tmp_path, capsys, lab):
    lab_path = lab
    code, out, _ = run(capsys, "lint", "--cluster", lab_path, str(tmp_path / "none.yaml"))
    assert (code, out.strip()) == (1, f"{tmp_path / 'none.yaml'}: <file>: -: no such file")
    code, out, _ = run(capsys, "lint", "--cluster", lab_path, str(tmp_path), str(tmp_path / "nomodel"))
    assert code == 1 and "not a regular file" in out


def test_vendored_schemas_are_v0_38_0():
    schemas = Path(lint.schema.SCHEMAS)
    assert "v0.38.0" in (schemas / "SOURCE.md").read_text()
    assert len(list(schemas.glob("*.json"))) > 50 and not list(schemas.glob("test-*.json"))


def test_fit_follows_determineds_agent_scheduler(tmp_path):
    """fitting.go: a multi-agent trial takes whole agents of one size."""
    from dataclasses import replace

    from deploy.experiment.rules import fit

    per_node = replace(load(LAB), agent_sizes=(8, 8, 8), total_slots=24)
    assert fit("e", 8, per_node) == [] and fit("e", 16, per_node) == [] and fit("e", 24, per_node) == []
    (twelve,) = [str(p) for p in fit("e", 12, per_node)]
    assert "never scheduled" in twelve and "use one of 8, 16, 24" in twelve
    (too_big,) = [str(p) for p in fit("e", 32, per_node)]
    assert "more than all 24 agent slots" in too_big
    assert fit("e", 12, load(LAB)) == []  # per_domain agents: sizes read on the nodes only


def test_duplicate_keys_and_unrelated_schema_errors_are_not_hidden(tmp_path):
    path = tmp_path / "experiment.yaml"
    path.write_text(
        "name: a\nname: b\nentrypoint: python3 train.py\nsearcher: {name: single, metric: loss}\n"
        "checkpoint_storage: {type: s3, region: us-east-1, colour: blue}\n"
    )
    lines = [str(p) for p in lint.lint(str(path), load(LAB))]
    assert any(": name: -: written twice (lines 1 and 2)" in line for line in lines)
    assert any("'colour', 'region' were unexpected" in line for line in lines), lines
    assert any(": checkpoint_storage.region: " in line and "AWS_DEFAULT_REGION" in line for line in lines)


def test_generated_model_trains_saves_and_restores(tmp_path):
    """The model on the Core API's off-cluster context (core._dummy_init: the package's own,
    checkpoints in a local directory instead of S3): it reports, saves, and resumes."""
    import importlib.util

    from determined import core

    train_py = template.write(load(LAB), 1, tmp_path / "out")[1]
    spec = importlib.util.spec_from_file_location("example_train", train_py)
    assert spec and spec.loader
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    store = tmp_path / "checkpoints"
    store.mkdir()
    hp = {"global_batch_size": 8, "learning_rate": 0.05, "steps": 50}
    with core._dummy_init(checkpoint_storage=str(store)) as ctx:
        train.main(ctx, {**hp, "steps": 25}, None)
    (first,) = [p.name for p in store.iterdir()]
    with core._dummy_init(checkpoint_storage=str(store)) as ctx:
        train.main(ctx, hp, first)
    states = sorted((p / "state.json").read_text() for p in store.iterdir())
    assert len(states) == 2 and any('"steps_completed": 50' in s for s in states)
