"""Apt behaviour every later role relies on: the site's proxy and waiting for the lock."""

from __future__ import annotations

import io
from urllib.parse import urlsplit

from pyinfra.api import deploy
from pyinfra.operations import files

from deploy.cluster import Cluster, Node
from roles.shared_ops import DPKG_LOCK_TIMEOUT

CONF = "/etc/apt/apt.conf.d/90gpu-cluster"


def apt_conf(proxy: str | None, direct_hosts=()) -> str:
    # An unattended upgrade holding the dpkg lock is waited for, not failed on.
    lines = [f'DPkg::Lock::Timeout "{DPKG_LOCK_TIMEOUT}";']
    if proxy:
        lines.append(f'Acquire::http::Proxy "{proxy}";')
        # The site's own mirror (of NVIDIA's repo) is reached directly, not via the proxy.
        lines += [f'Acquire::http::Proxy::{h} "DIRECT";' for h in sorted(set(direct_hosts))]
    return "\n".join(lines) + "\n"


@deploy("Apt settings")
def apply(cluster: Cluster, node: Node) -> None:
    sources = cluster.sources
    files.put(
        name="Apt proxy and lock timeout",
        src=io.StringIO(apt_conf(sources.apt_proxy, [urlsplit(sources.cuda_repo).hostname])),
        dest=CONF,
        mode="644",
    )
