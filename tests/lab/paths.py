"""Where the lab keeps its state on the controller, in one place."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE = Path("/var/lib/dtlab")
CACHE = Path("/var/cache/dtlab")
BASE_ROOTFS = CACHE / "base-bookworm"
NODES = STATE / "nodes"
DISKS = STATE / "disks"
RUN = STATE / "run"
LOGS = STATE / "logs"
MIRROR = STATE / "mirror"
GPG_HOME = STATE / "gpg"
DEFAULT_CLUSTER = REPO / "inventories" / "lab" / "cluster.yaml"
MIRROR_PORT = 8077
APT_PROXY_PORT = 3142
