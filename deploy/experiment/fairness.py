"""`experiment new --example fairness`: a Core API trial that audits its own fairness.

The source article makes fairness auditing part of every training run: per-group metrics
reported beside the task's own, so that a gap that opens mid-training is seen, and the trial
paused, while it trains rather than after release. The example trains a small classifier
(numpy only: the harness's own dependency, so every task image that runs the harness has it)
on a synthetic dataset generated in the trial, whose records carry a group attribute, and
reports two gaps with each validation:

- fairness/equal_opportunity_gap = |TPR(group 0) - TPR(group 1)|: of the records that truly
  are positive, the difference in the share the model finds (Hardt, Price, Srebro 2016,
  "Equality of Opportunity in Supervised Learning");
- fairness/demographic_parity_gap = |P(pred 1 | group 0) - P(pred 1 | group 1)|: the
  difference in the share of records predicted positive, whatever their label.

Past `gap_threshold` the trial logs a warning naming the gap and reports
fairness/over_threshold = 1; with `stop_on_gap: true` it saves a checkpoint and pauses its own
experiment (PauseExperiment through the task's own session, as Determined's exec modules log
in: authentication.login_from_task). The master then preempts the trial, which exits; `det
experiment activate ID` resumes it from that checkpoint, and it does not pause twice.
"""

from __future__ import annotations

NAME = "fairness"

HYPERPARAMETERS = """\
hyperparameters:
  # Global: the batch of ALL ranks together (keep it divisible by slots_per_trial).
  global_batch_size: {batch}
  learning_rate: 0.5
  steps: 200
  validate_every: 50
  # How differently the synthetic data treats group 1 (0: not at all). Replace make_data() in
  # train.py with your dataset's loader and this goes away.
  group_bias: 1.0
  # A gap above this is flagged (fairness/over_threshold = 1) and logged.
  gap_threshold: 0.1
  # true: also checkpoint and pause the experiment the first time a gap passes the threshold.
  stop_on_gap: false
"""

TRAIN_PY = '''\
"""Example trial with a fairness audit on Determined's Core API (numpy only, no download).

A logistic-regression classifier fitted by data-parallel gradient descent on a synthetic
dataset whose records carry a group attribute (group 1 is the minority, 30 % of records).
Each validation reports, beside loss and accuracy on held-out records:
- fairness/equal_opportunity_gap: |TPR(group 0) - TPR(group 1)|, the difference in the share
  of truly positive records the model finds (equality of opportunity);
- fairness/demographic_parity_gap: |P(pred 1 | group 0) - P(pred 1 | group 1)|, the
  difference in the share of records predicted positive.
A gap above gap_threshold is flagged (fairness/over_threshold = 1, a warning in the trial's
log); with stop_on_gap the trial checkpoints and pauses its experiment once, so a person looks
at the data before it trains on: `det experiment activate ID` resumes it from the checkpoint.

To audit a real dataset, replace make_data() with your loader; return the attribute you audit
(a demographic field, a recording site, a device model) as `group`, one 0/1 value per record.
"""

import json
import logging
import os
import time

import numpy as np

import determined as det
from determined import core
from determined.common.api import authentication, bindings, certs

logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
FEATURES = 4


def make_data(n, group_bias, seed):
    """(x, y, group): features, 0/1 labels, 0/1 group attribute of n records."""
    rng = np.random.default_rng(seed)
    group = (rng.random(n) < 0.3).astype(np.int64)
    # The label follows one rule for everybody, from what the records really are ...
    truth = rng.normal(size=(n, FEATURES))
    y = (truth @ np.array([1.5, -1.0, 0.5, 0.0]) + rng.normal(scale=0.3, size=n) > 0).astype(np.int64)
    # ... but group 1's features are measured skewed (one read low, one high), the way a gap
    # opens in real data: the model sees x, fits mostly group 0 and misses group 1's positives.
    x = truth - group_bias * group[:, None] * np.array([0.6, -0.4, 0.0, 0.0])
    return x, y, group


def gradient(w, b, x, y):
    p = 1 / (1 + np.exp(-(x @ w + b)))
    err = p - y
    return x.T @ err, float(err.sum())


def audit(w, b, x, y, group):
    """Validation metrics: log loss, accuracy, and the per-group rates behind both gaps."""
    p = 1 / (1 + np.exp(-(x @ w + b)))
    pred = (p >= 0.5).astype(np.int64)
    eps = 1e-12
    metrics = {
        "loss": float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))),
        "accuracy": float(np.mean(pred == y)),
    }
    for g in (0, 1):
        members = group == g
        positives = members & (y == 1)
        metrics[f"fairness/tpr_group{g}"] = float(pred[positives].mean()) if positives.any() else 0.0
        metrics[f"fairness/positive_rate_group{g}"] = float(pred[members].mean()) if members.any() else 0.0
    metrics["fairness/equal_opportunity_gap"] = abs(
        metrics["fairness/tpr_group0"] - metrics["fairness/tpr_group1"]
    )
    metrics["fairness/demographic_parity_gap"] = abs(
        metrics["fairness/positive_rate_group0"] - metrics["fairness/positive_rate_group1"]
    )
    return metrics


def pause_own_experiment(info):
    """PauseExperiment with the task's session: the master preempts this trial."""
    cert = certs.default_load(info.master_url)
    session = authentication.login_from_task(info.master_url, cert=cert)
    bindings.post_PauseExperiment(session, id=info.trial.experiment_id)


def main(core_context, info):
    hparams = info.trial.hparams
    dist = core_context.distributed
    per_rank = hparams["global_batch_size"] // dist.size
    w, b, start, paused_once = np.zeros(FEATURES), 0.0, 0, False
    if info.latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            state = json.loads((path / "state.json").read_text())
        w, b = np.array(state["w"]), state["b"]
        start, paused_once = state["steps_completed"], state["paused_once"]
        logging.info("restored checkpoint %s at step %d", info.latest_checkpoint, start)
    x_val, y_val, g_val = make_data(4000, hparams["group_bias"], seed=7)

    def save(step):
        if dist.rank == 0:
            state = {"w": w.tolist(), "b": b, "steps_completed": step, "paused_once": paused_once}
            with core_context.checkpoint.store_path({"steps_completed": step}) as (path, _):
                (path / "state.json").write_text(json.dumps(state))

    for step in range(start + 1, hparams["steps"] + 1):
        x, y, _ = make_data(per_rank, hparams["group_bias"], seed=100_000 * step + dist.rank)
        gw, gb = gradient(w, b, x, y)
        parts = dist.allgather((gw.tolist(), gb))
        n = per_rank * dist.size
        w = w - hparams["learning_rate"] * np.sum([p[0] for p in parts], axis=0) / n
        b = b - hparams["learning_rate"] * sum(p[1] for p in parts) / n
        if step % hparams["validate_every"] and step != hparams["steps"]:
            continue
        stop = False
        if dist.rank == 0:
            metrics = audit(w, b, x_val, y_val, g_val)
            over = [
                name
                for name in ("fairness/equal_opportunity_gap", "fairness/demographic_parity_gap")
                if metrics[name] > hparams["gap_threshold"]
            ]
            metrics["fairness/over_threshold"] = float(bool(over))
            core_context.train.report_validation_metrics(steps_completed=step, metrics=metrics)
            for name in over:
                logging.warning(
                    "fairness audit: %s %.3f at step %d is over gap_threshold %.3f",
                    name,
                    metrics[name],
                    step,
                    hparams["gap_threshold"],
                )
            stop = bool(over) and hparams["stop_on_gap"] and not paused_once
        if dist.broadcast(stop):
            paused_once = True
            save(step)
            if dist.rank == 0:
                logging.warning("fairness audit: pausing experiment %d", info.trial.experiment_id)
                pause_own_experiment(info)
            deadline = time.monotonic() + 120
            while not core_context.preempt.should_preempt():
                if time.monotonic() > deadline:
                    raise RuntimeError("paused the experiment, but the master did not preempt the trial")
                time.sleep(1)
            return
        save(step)
        if core_context.preempt.should_preempt():
            return


if __name__ == "__main__":
    info = det.get_cluster_info()
    assert info is not None, "run this on the cluster: det experiment create experiment.yaml ."
    distributed = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # set by determined.launch.torch_distributed
        distributed = core.DistributedContext.from_torch_distributed()
    # MANUAL: no TensorBoard metric writer. AUTO's imports TensorFlow or PyTorch
    # (determined/tensorboard/base.py get_metric_writer), which a numpy-only trial does not need
    # and a slim image does not carry; the metrics still reach the master and its web UI.
    with core.init(distributed=distributed, tensorboard_mode=core.TensorboardMode.MANUAL) as core_context:
        main(core_context, info)
'''


def hyperparameters(slots: int, batch_per_slot: int) -> str:
    return HYPERPARAMETERS.format(batch=batch_per_slot * slots)
