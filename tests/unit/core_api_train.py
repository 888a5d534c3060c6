"""A user's Core API training script, run by test_standin_core_api.py inside a trial container.

determined.core.init() as the context manager, the single searcher's operation, training and
validation metrics, checkpoints through store_path() (S3 storage from the experiment config),
a resume from the latest checkpoint, should_preempt(); with more than one container, a
DistributedContext from the rendezvous info (no torch: the harness's own ZMQ all-gather).
Hyperparameters: hold (seconds to wait at step 2, after its checkpoint, on a first run only,
watching should_preempt()), ports ([pub, pull] of the chief's ZMQ sockets).
"""

from __future__ import annotations

import json
import sys
import time

import determined as det
from determined import core


def distributed_context(info: det.ClusterInfo) -> core.DistributedContext | None:
    if len(info.container_addrs) < 2:
        return None
    rank, size = info.container_rank, len(info.container_addrs)
    pub, pull = info.trial.hparams["ports"]
    return core.DistributedContext(
        rank=rank,
        size=size,
        local_rank=0,
        local_size=1,
        cross_rank=rank,
        cross_size=size,
        chief_ip=info.container_addrs[0],
        pub_port=pub,
        pull_port=pull,
    )


def main() -> int:  # Long: one user script, start to end, as a user writes it
    info = det.get_cluster_info()
    assert info is not None, "not on a cluster"
    hold = float(info.trial.hparams.get("hold") or 0)
    # MANUAL: no TensorBoard metric writer (AUTO needs torch or tensorflow).
    with core.init(
        distributed=distributed_context(info), tensorboard_mode=core.TensorboardMode.MANUAL
    ) as ctx:
        chief = ctx.distributed.rank == 0
        print(f"allgather {json.dumps(ctx.distributed.allgather(ctx.distributed.rank))}", flush=True)
        steps = 0
        if info.latest_checkpoint is not None:
            with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
                steps = int((path / "state").read_text())
            print(f"resumed from {info.latest_checkpoint} at {steps}", flush=True)
            hold = 0
        for op in ctx.searcher.operations():
            while steps < op.length:
                steps += 1
                if chief:
                    ctx.train.report_training_metrics(steps_completed=steps, metrics={"loss": 1.0 / steps})
                    op.report_progress(steps)
                if chief and steps % 2 == 0:
                    with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, storage_id):
                        (path / "state").write_text(str(steps))
                        (path / "weights.bin").write_bytes(bytes(range(256)) * steps)
                    print(f"checkpoint {storage_id} at {steps}", flush=True)
                deadline = time.time() + (hold if steps == 2 else 0)
                while True:
                    if ctx.preempt.should_preempt():
                        print(f"preempted at {steps}", flush=True)
                        return 0
                    if time.time() >= deadline:
                        break
                    time.sleep(0.2)
            if chief:
                ctx.train.report_validation_metrics(steps_completed=steps, metrics={"loss": 0.25})
                op.report_completed(0.25)
    print(f"done at {steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
