"""The smoke experiment: the cluster trains (four rows of the cluster column).

Verify submits four small experiments to the master through its REST API
(tests/verify/smoke_client.py; configurations and trial from deploy/experiment/smoke.py, built
from `python -m deploy experiment new`'s template for this cluster, without its image: the
trials run the image master.yaml's task_container_defaults gives them):

- test_smoke_trial_saves_a_checkpoint: a one-slot trial writes a checkpoint to MinIO with boto3
  set up as Determined's S3StorageManager sets it up (endpoint and keys from the checkpoint
  storage the master hands the trial, region from AWS_DEFAULT_REGION);
- test_smoke_trial_restores_it: a second trial reads that checkpoint back and checks it. When
  the save failed it is skipped ("not run: no checkpoint from the save trial"), not red: it has
  nothing to read, and the cause is already the save row's, with its hint; a second red cell
  would send the operator after a second problem that may not exist;
- test_smoke_two_agent_allreduce: a trial on two agents of two nodes: rank 0 runs mpirun over
  ssh (port 12350) into the other container and the ranks allreduce with Open MPI (mpi4py) over
  the inter-node interface (Gloo where the image has no mpi4py);
- test_smoke_single_agent_allreduce: a trial with all the slots of the largest agent: one
  container on Docker's bridge network, a rank per slot, an allreduce inside it; a socket
  interface NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names that the container lacks fails it with
  NCCL's or Gloo's own error.

Before submitting, verify reads the agents' slots: a row whose slots other users' work holds is
skipped, "not run: busy", naming the experiments that hold them (nothing is submitted for it);
a trial that was scheduled and then hangs is red. The save and the two-agent allreduce run at
once, the restore after the save, the single-agent allreduce after the two-agent one. Whatever
happens, the experiments are ended and archived and the checkpoint objects under
verify-smoke/<run id> removed (with the deploy's MinIO keys, as test_storage.py does).

`python -m deploy verify --no-smoke` skips the four rows without contacting the master: for a
production cluster that must not run jobs.
"""

import datetime
import json
import re
import uuid

import pytest
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from deploy import s3
from deploy.experiment import smoke
from deploy.experiment.target import load
from tests.verify.master_api import _master_url, smoke_token
from tests.verify.matrix import P_HINT, P_SEEN
from tests.verify.smoke_client import FAIL, SKIP, Api, Smoke, node_of_agent

NO_SMOKE = "--no-smoke"


def remover(cluster):
    """Remove the objects under a prefix with the deploy's keys, signing for storage.region; when
    MinIO's region is another (the smoke may be red for exactly that, after boto3 wrote the
    checkpoint anyway), once more for the region MinIO names in its refusal."""

    def remove(prefix: str, region: str | None = None) -> str:
        client = s3.client(cluster)
        if region is not None:
            client = Minio(
                s3.endpoint(cluster),
                access_key=cluster.storage.access_key.value,
                secret_key=cluster.storage.secret_key.value,
                region=region,
                secure=s3.secure(cluster),
                http_client=s3.pool(cluster),
            )
        bucket = cluster.storage.bucket
        try:
            names = [o.object_name for o in client.list_objects(bucket, prefix=prefix + "/", recursive=True)]
            errors = list(client.remove_objects(bucket, [DeleteObject(n) for n in names if n]))
        except S3Error as e:
            expected = re.search(r"expecting '([^']+)'", e.message or "")
            if region is None and e.code == "AuthorizationHeaderMalformed" and expected:
                return remove(prefix, expected.group(1)) + f" (signed for MinIO's region {expected.group(1)})"
            raise
        if errors:
            return (
                f"{len(errors)} of {len(names)} checkpoint objects under {prefix}/ not removed: {errors[0]}"
            )
        return f"{len(names)} checkpoint objects under {prefix}/ removed"

    return remove


# The agents' last lines (the last ten minutes: a smoke run takes far less). No priority filter:
# the agent logs to stderr, which journald records at info.
AGENT_JOURNAL = "journalctl -q --no-pager -o cat --since -10min -u 'determined-agent*' | tail -n 40"


def journal(cluster, request):
    """node -> its agents' recent journal lines over verify's own SSH, or None when it cannot be
    read (the node is down: its cells already say so)."""

    def read(hostname: str) -> str | None:
        try:
            host = request.getfixturevalue("host_of")(cluster.node(hostname))
            return host.run(AGENT_JOURNAL).stdout
        except Exception:  # a cause not found is no new failure: the row says so
            return None

    return read


@pytest.fixture(scope="session")
def smoke_run(request, pytestconfig, cluster):
    """The four rows, run once (all four checks are in one xdist group: conftest.py)."""
    if pytestconfig.getoption(NO_SMOKE):
        pytest.skip(f"{NO_SMOKE}: no smoke experiment submitted (a cluster that must not run jobs)")
    # Every answering agent registered first: the rows' sizes come from the agents the runner
    # reads next, with their slots' holders.
    request.getfixturevalue("registered_agents")
    target = load(pytestconfig.getoption("--cluster"))
    run_id = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    # As the non-admin smoke user: the trials get its token, not admin's (master/pkg/tasks/task.go).
    master_host = request.getfixturevalue("host_of")(cluster.master_node)
    api = Api(_master_url(cluster), smoke_token(cluster, master_host))
    node_of = node_of_agent({n.hostname for n in cluster.agents})
    runner = Smoke(api, target, run_id, remover(cluster), node_of, journal(cluster, request))
    rows = runner.run()
    return runner, rows


def _verdict(kind: str, smoke_run, record_property) -> None:
    runner, rows = smoke_run
    row = rows[kind]
    skipped = "not run: busy" if "busy" in row.line else "not run"
    shown = f"{row.status} in {row.seconds:.1f}s" if row.status != SKIP else skipped
    record_property(P_SEEN, json.dumps({"what": "smoke", "node": smoke.ROWS[kind], "value": shown}))
    if kind == smoke.SINGLE:  # the last row: what the cleanup did, once
        note = "; ".join(runner.cleanup_notes) or "nothing to clean"
        record_property(P_SEEN, json.dumps({"what": "smoke cleanup", "node": runner.run_id, "value": note}))
    if row.status == SKIP:  # busy, or nothing to run it on: a reason, not a failure
        pytest.skip(row.line or "not run")
    if row.status == FAIL:
        hint = row.hint
        if hint is not None:
            record_property(P_HINT, json.dumps([hint.symptom, hint.action]))
        logs = "".join(f"\n    {line}" for line in row.logs)
        pytest.fail(f"{row.line} (experiment {row.experiment}){logs}", pytrace=False)


def test_smoke_trial_saves_a_checkpoint(smoke_run, record_property):
    _verdict(smoke.SAVE, smoke_run, record_property)


def test_smoke_trial_restores_it(smoke_run, record_property):
    _verdict(smoke.RESTORE, smoke_run, record_property)


def test_smoke_two_agent_allreduce(smoke_run, record_property):
    _verdict(smoke.ALLREDUCE, smoke_run, record_property)


def test_smoke_single_agent_allreduce(smoke_run, record_property):
    _verdict(smoke.SINGLE, smoke_run, record_property)
