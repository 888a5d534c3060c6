"""Options shared by the verification suite and the lab tests."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser):
    parser.addoption(
        "--cluster",
        default=str(REPO / "inventories" / "lab" / "cluster.yaml"),
        help="cluster.yaml whose nodes tests/verify checks (default: the lab's)",
    )
