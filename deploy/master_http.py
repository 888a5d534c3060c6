"""The controller's HTTP access to the Determined master: the one place that knows its scheme,
address and, with determined.tls, whom to trust and which name to check.

base_url(cluster): `https://<master address>:<master_port>` with determined.tls, else http. The
address, not master_host: the controller need not resolve the cluster's host names (the nodes'
/etc/hosts has them, the controller's may not). With TLS the certificate is checked against
determined.tls.ca_certificate (else the certificate file's own chain, which ends at its root:
deploy/cluster/master_tls.py) and for the name master_host, as the agents do
(security.tls.master_cert_name) and as Determined's own client does with DET_MASTER_CERT_NAME
(harness/determined/common/api/_session.py sets urllib3's assert_hostname).

urlopen(request, timeout): urllib.request.urlopen, with the TLS settings of the master whose
base_url the request's URL starts with (base_url registers them), so the callers keep building
their URLs and handling urllib's errors as before.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import ssl
import threading
import urllib.request
from typing import Any

from deploy.cluster.master_tls import agent_ca

# base_url -> (context, the name the certificate must hold), for the masters seen so far. A
# process deploys or verifies one cluster: a second one at the same address and port replaces
# the first's settings (the later base_url wins). The lock: verify's threads register and read.
_TLS: dict[str, tuple[ssl.SSLContext, str]] = {}
_TLS_LOCK = threading.Lock()


def tls_enabled(cluster: Any) -> bool:
    # getattr: the unit tests' stand-in clusters (SimpleNamespace) carry no tls section.
    tls = getattr(cluster.determined, "tls", None)
    return tls is not None and bool(tls.enabled)


def scheme(cluster: Any) -> str:
    return "https" if tls_enabled(cluster) else "http"


def base_url(cluster: Any) -> str:
    address = ipaddress.ip_address(str(cluster.master_node.address))
    host = f"[{address}]" if address.version == 6 else str(address)
    url = f"{scheme(cluster)}://{host}:{cluster.master_port}"
    if tls_enabled(cluster):
        settings = (ssl_context(cluster), cluster.master_host)
        with _TLS_LOCK:
            _TLS[url] = settings
    return url


def ssl_context(cluster: Any) -> ssl.SSLContext:
    """Trusting only the master's CA (what master-ca.crt on the agents holds)."""
    tls = cluster.determined.tls
    context = ssl.create_default_context(cadata=agent_ca(tls, cluster.master_host))
    context.check_hostname = True
    return context


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to one address that checks the certificate for another name."""

    def __init__(self, *args: Any, server_name: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.server_name)  # type: ignore[attr-defined]


class _NamedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext, server_name: str) -> None:
        super().__init__(context=context)
        self._tls_context, self._server_name = context, server_name

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_NamedHTTPSConnection, server_name=self._server_name)
        return self.do_open(connection, req, context=self._tls_context)


def tls_for(url: str) -> tuple[ssl.SSLContext, str] | None:
    """The context and name for a URL under a registered https base_url, else None."""
    with _TLS_LOCK:
        registered = list(_TLS.items())
    for base, settings in registered:
        if url == base or url.startswith(base + "/"):
            return settings
    return None


def urlopen(request: urllib.request.Request | str, timeout: float) -> Any:
    """urllib.request.urlopen (same return value and errors), over TLS as base_url set up."""
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    settings = tls_for(url)
    if settings is None:
        return urllib.request.urlopen(request, timeout=timeout)
    opener = urllib.request.build_opener(_NamedHTTPSHandler(*settings))
    return opener.open(request, timeout=timeout)
