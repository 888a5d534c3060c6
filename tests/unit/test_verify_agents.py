"""test_master_knows_no_unnamed_agent's decision (tests/verify/test_determined.py
unnamed_agents): the agents the master lists, as GET /api/v1/agents gives them, against the
agent nodes cluster.yaml names. No master, no lab."""

from deploy.cluster import load_cluster
from tests.unit.test_cluster import lab_copy
from tests.verify.test_determined import unnamed_agents


def _agent(enabled: bool = True, address: str = "10.77.0.11", slots: int = 8) -> dict:
    return {"enabled": enabled, "addresses": [address], "slots": {str(i): {} for i in range(slots)}}


def test_only_agents_cluster_yaml_names_may_take_work(tmp_path):
    cluster = load_cluster(lab_copy(tmp_path)[0], resolve_secrets=False)
    named = {n.hostname: _agent() for n in cluster.agents if n.agent_layout == "per_node"}
    per_domain = [n for n in cluster.agents if n.agent_layout == "per_domain"]
    named.update({f"{n.hostname}-{i}": _agent(slots=4) for n in per_domain for i in (0, 1)})
    assert unnamed_agents(cluster, named) == []
    rogue = {
        **named,
        # A trial's container registering as a new 8-GPU agent, and one posing as a domain of a
        # node that has none by that number (lab-gpu1-x is not <hostname>-<i>).
        "gpu-spare": _agent(address="172.17.0.5"),
        f"{cluster.agents[0].hostname}-x": _agent(address="10.77.0.99", slots=1),
        "parked": _agent(enabled=False),  # disabled: takes no work
    }
    assert unnamed_agents(cluster, rogue) == [
        "gpu-spare (from 172.17.0.5, 8 slots)",
        f"{cluster.agents[0].hostname}-x (from 10.77.0.99, 1 slots)",
    ]
