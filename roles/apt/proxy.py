"""Apt behaviour every later role relies on: the site's proxy and waiting for the lock, and the
logins of the site mirror and the apt proxy (sources.mirror_credentials,
sources.apt_proxy_credentials).

A login never goes into a URL, sources list, apt.conf line or command line (all world-readable
or shown by pyinfra): apt reads it from /etc/apt/auth.conf.d/ (apt_auth.conf(5): `machine
[protocol://]host[:port] login USER password PASS`; apt's methods open those files as root
before dropping to _apt, so root 0600 works: methods/aptmethod.h, aptAuthConfMethod), and the
proxy's too (methods/basehttp.cc: AddProxyAuth looks the proxy up there). Downloads that do
not go through apt (files/shared/fetch-verified.sh: curl) read the mirror's login from a
root-only netrc file with --netrc-file. Both are written with shared_ops.secret_file, and
removed when cluster.yaml no longer has a login.
"""

from __future__ import annotations

import io
from urllib.parse import urlsplit

from pyinfra.api import deploy
from pyinfra.operations import files

from deploy.cluster import Cluster, Node
from deploy.secrets import Secret
from roles.shared.ops import DOWNLOAD_NETRC, DPKG_LOCK_TIMEOUT, SecretBytes, secret_file

CONF = "/etc/apt/apt.conf.d/90gpu-cluster"
# apt reads only the *.conf files of auth.conf.d.
AUTH_CONF = "/etc/apt/auth.conf.d/90gpu-cluster.conf"


def apt_conf(proxy: str | None, direct_hosts=()) -> str:
    # An unattended upgrade holding the dpkg lock is waited for, not failed on.
    lines = [f'DPkg::Lock::Timeout "{DPKG_LOCK_TIMEOUT}";']
    if proxy:
        lines.append(f'Acquire::http::Proxy "{proxy}";')
        # The site's own mirror (of NVIDIA's repo) is reached directly, not via the proxy.
        lines += [f'Acquire::http::Proxy::{h} "DIRECT";' for h in sorted(set(direct_hosts))]
    return "\n".join(lines) + "\n"


def _machine(url: str) -> str:
    """apt's machine token for `url`: scheme://host[:port]. Without a scheme apt matches https
    only (apt_auth.conf(5) from apt 2.0, Ubuntu 20.04's: "If protocol is not specified, the
    entry only matches https and tor+https"); without a port, every port."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _login(secret: Secret) -> tuple[str, str]:
    user, _, password = secret.value.partition(":")  # checked: user:password, one token each
    return user, password


def auth_conf(cluster: Cluster) -> str | None:
    """apt's auth.conf.d file for the mirror (the host of cuda_repo) and the apt proxy, or None
    when cluster.yaml has neither login. The model allows no whitespace in either login."""
    sources = cluster.sources
    entries = []
    if sources.mirror_credentials is not None:
        user, password = _login(sources.mirror_credentials)
        entries.append(f"machine {_machine(sources.cuda_repo)} login {user} password {password}")
    if sources.apt_proxy_credentials is not None and sources.apt_proxy:
        user, password = _login(sources.apt_proxy_credentials)
        entries.append(f"machine {_machine(sources.apt_proxy)} login {user} password {password}")
    if not entries:
        return None
    return "# gpu-cluster (roles/apt/proxy.py): logins from cluster.yaml\n" + "\n".join(entries) + "\n"


def download_netrc(cluster: Cluster) -> str | None:
    """curl's netrc for the mirror's host (curl matches a machine by host name alone), or None."""
    login = cluster.sources.mirror_credentials
    if login is None:
        return None
    user, password = _login(login)
    host = urlsplit(cluster.sources.cuda_repo).hostname
    return f"machine {host} login {user} password {password}\n"


def _secret_or_absent(path: str, content: str | None, what: str) -> None:
    if content is None:
        files.file(name=f"No {what} ({path})", path=path, present=False)
        return
    folder = path.rsplit("/", 1)[0]
    files.directory(name=f"Directory {folder}", path=folder, mode="755")
    secret_file(name=f"{what} ({path}, 0600)", dest=path, content=SecretBytes(content))


@deploy("Apt settings")
def apply(cluster: Cluster, node: Node) -> None:
    sources = cluster.sources
    files.put(
        name="Apt proxy and lock timeout",
        src=io.StringIO(apt_conf(sources.apt_proxy, [urlsplit(sources.cuda_repo).hostname])),
        dest=CONF,
        mode="644",
    )
    _secret_or_absent(AUTH_CONF, auth_conf(cluster), "Apt logins for the mirror and proxy")
    _secret_or_absent(DOWNLOAD_NETRC, download_netrc(cluster), "Mirror login for downloads")
