"""Every slot of a lab held by users' long experiments, as a cluster that trains all day is.

One `sleep` experiment per enabled agent, sized to its slots (largest first, so the 8-slot
trials take the 8-slot agents and the 4-slot ones the per-domain agents), all running before
the block's body; killed afterwards, and waited for until the slots are free again. Used by the
busy-cluster smoke test and by the bench's "verify, every slot busy" step."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from tests.verify.master_api import list_agents

from .test_day_two_lab import wait_registered
from .test_trials_lab import TERMINAL, Api, experiment_yaml


def _size(agent: dict) -> int:
    return len(agent.get("slots") or {})


@contextlib.contextmanager
def every_slot_held(cluster, timeout: float = 180) -> Iterator[list[int]]:
    """Yields the experiment ids holding the slots."""
    # A master restarted just before: every agent back first, or the slots counted here are
    # those of the agents that happened to have reconnected.
    for node in cluster.agents:
        wait_registered(cluster, node, timeout=timeout)
    api = Api(cluster)
    sizes = sorted(
        (_size(a) for a in list_agents(cluster, api.token) if a.get("enabled", True)), reverse=True
    )
    assert sum(sizes) == sum(n.slots or 0 for n in cluster.agents), sizes
    held: list[int] = []
    try:
        for n, slots in enumerate(sizes):
            config = experiment_yaml("sleep 900", slots=slots).replace(
                "name: lab-trials", f"name: lab-busy-{n}"
            )
            status, created = api.create(config)
            assert status == 200, created
            held.append(created["experiment"]["id"])
        deadline = time.monotonic() + timeout
        while not all(api.trial(e)["state"] == "STATE_RUNNING" for e in held):
            assert time.monotonic() < deadline, [api.trial(e)["state"] for e in held]
            time.sleep(2)
        agents = list_agents(cluster, api.token)
        assert all(not a.get("slots") or all(s.get("container") for s in a["slots"].values()) for a in agents)
        yield held
    finally:
        for exp_id in held:
            api.call("POST", f"/api/v1/experiments/{exp_id}/kill")
        for exp_id in held:
            api.wait(exp_id, TERMINAL, timeout=120)
