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

A node whose own probe did not run (its SSH channel did not open in time, no python3) is
neither: its paths were not tested. Its cell is a skip carrying P_NOT_PROBED, which the matrix
shows as n/p and counts in the exit status (tests/verify/matrix.py); a path its peers found
broken towards it is still a FAIL.
"""

import pytest

from tests.verify.matrix import NOT_PROBED_PREFIX, P_NOT_PROBED
from tests.verify.reach import IPOIB, MANAGEMENT


def _reaches_its_peers(node, reach, network: str, record_property) -> None:
    problems = reach.blame_of(node.hostname, network)
    why = reach.not_probed(node.hostname)
    own = f" (its own probe did not run: {why})" if why else ""
    assert not problems, f"{node.hostname} on {network}: " + "; ".join(problems) + own
    if why:
        # A skip, not a failure: nothing found broken. The property, not the reason's text,
        # is what tells the matrix this skip apart from a check that does not apply.
        record_property(P_NOT_PROBED, why)
        pytest.skip(f"{NOT_PROBED_PREFIX}{why}")


def test_reaches_peer_on_management(node, reach, record_property):
    _reaches_its_peers(node, reach, MANAGEMENT, record_property)


def test_reaches_peer_on_ipoib(node, reach, record_property):
    _reaches_its_peers(node, reach, IPOIB, record_property)
