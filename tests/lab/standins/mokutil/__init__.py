"""mokutil on every lab node: Ubuntu servers have it (shim-signed), Debian's base does not.

Unlike the mirror's stand-ins the deploy never installs it: it is part of the node as racked,
so the lab writes it into each node's root filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.lab.standins import source

PATH = "usr/bin/mokutil"
SETTING = "etc/dtlab/secure-boot"  # the lab's firmware switch: enabled | disabled | bios


def install(root: Path) -> None:
    """Write the stand-in into a node's root filesystem (idempotent)."""
    target = root / PATH
    text = source("mokutil/mokutil.sh")
    if not target.exists() or target.read_text() != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    os.chmod(target, 0o755)
