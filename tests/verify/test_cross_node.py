"""Cross-node checks: every node resolves and reaches every other on both networks.

One item per node and network (not one per ordered pair: 65,000 items at 256 nodes for a
matrix that shows one cell per node anyway). Every node's probe of all its peers ran once, in
one command per node, in verify's first step (tests/verify/reach.py PROBE); these items assert
on the blame decided from everyone's view there, by majority:
- a peer most nodes cannot reach is that peer's problem: red on its own cell (SSH when this
  machine cannot reach it either), not on the cells of the nodes that tried it;
- a node that reaches fewer than half of the peers the others reach is red on its own cell
  (its link, route or /etc/hosts), and its peers stay ok;
- any other failing path is the source node's, naming the peer (a firewall between two).
The cell names the failing peers and says which way the majority went.
"""

from tests.verify.reach import IPOIB, MANAGEMENT


def test_reaches_peer_on_management(node, reach):
    problems = reach.blame_of(node.hostname, MANAGEMENT)
    assert not problems, f"{node.hostname} on {MANAGEMENT}: " + "; ".join(problems)


def test_reaches_peer_on_ipoib(node, reach):
    problems = reach.blame_of(node.hostname, IPOIB)
    assert not problems, f"{node.hostname} on {IPOIB}: " + "; ".join(problems)
