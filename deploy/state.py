"""Where the toolkit keeps per-user files outside the checkout: verify's reports and the
inventories `python -m deploy` generates.

A checkout is code: what a run leaves behind must not show up in `git status`, be lost with a
fresh clone, or mix two clusters' results. It goes to $XDG_STATE_HOME/gpu-cluster/
(~/.local/state/gpu-cluster/ when XDG_STATE_HOME is unset or not absolute, as the XDG base
directory spec says), one directory per cluster, named by cluster_name().
"""

from __future__ import annotations

import os
import re
from pathlib import Path

APP = "gpu-cluster"


def state_home() -> Path:
    xdg = os.environ.get("XDG_STATE_HOME", "")
    # The spec: a relative value is invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / APP


def cluster_name(cluster_yaml: str | Path) -> str:
    """The name a cluster file goes by: its directory's for the convention
    inventories/<env>/cluster.yaml (`prod`), else the file's own stem (`h4.yaml` -> `h4`).
    Only [A-Za-z0-9._-]: it becomes a file name."""
    path = Path(cluster_yaml).resolve()
    name = path.parent.name if path.name == "cluster.yaml" and path.parent.name else path.stem
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "cluster"


def reports_dir(cluster_yaml: str | Path) -> Path:
    """verify's default --reports: <state>/reports/<cluster name>."""
    return state_home() / "reports" / cluster_name(cluster_yaml)
