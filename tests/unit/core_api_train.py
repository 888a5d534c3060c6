"""A user's Core API training script (single searcher, S3 checkpoints, preemption)."""

import json
import os
import pathlib
import sys
import time

import determined as det
from determined import core


def main() -> int:
    info = det.get_cluster_info()
    assert info is not None
    distributed = None
    if len(info.container_addrs) > 1:
        rank = info.container_rank
        size = len(info.container_addrs)
        distributed = core.DistributedContext(
            rank=rank, size=size, local_rank=0, local_size=1, cross_rank=rank, cross_size=size,
            chief_ip=info.container_addrs[0],
        )
    hold = float(info.trial.hparams.get("hold", 0))
    # MANUAL: no TensorBoard metric writer (AUTO needs torch or tensorflow).
    with core.init(distributed=distributed, tensorboard_mode=core.TensorboardMode.MANUAL) as ctx:
        gathered = ctx.distributed.allgather(ctx.distributed.rank)
        print(f"allgather {json.dumps(gathered)}", flush=True)
        latest = info.latest_checkpoint
        start = 0
        if latest is not None:
            with ctx.checkpoint.restore_path(latest) as path:
                start = int((path / "state").read_text())
            print(f"resumed from {latest} at {start}", flush=True)
        steps = start
        for op in ctx.searcher.operations():
            while steps < op.length:
                steps += 1
                ctx.train.report_training_metrics(steps_completed=steps, metrics={"loss": 1.0 / steps})
                if ctx.distributed.rank == 0:
                    op.report_progress(steps)
                if steps % 2 == 0 or steps == op.length:
                    meta = {"steps_completed": steps}
                    if ctx.distributed.rank == 0:
                        with ctx.checkpoint.store_path(meta) as (path, storage_id):
                            (path / "state").write_text(str(steps))
                        print(f"checkpoint {storage_id} at {steps}", flush=True)
                deadline = time.time() + hold
                while True:
                    if ctx.preempt.should_preempt():
                        print(f"preempted at {steps}", flush=True)
                        return 0
                    if time.time() >= deadline:
                        break
                    time.sleep(0.2)
            ctx.train.report_validation_metrics(steps_completed=steps, metrics={"loss": 0.25})
            if ctx.distributed.rank == 0:
                op.report_completed(0.25)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
