"""The Determined master's REST API as the checks read it: login, list agents, count slots."""

import json
import time
import urllib.error
import urllib.request

from deploy import master_http
from deploy.cluster.determined import SMOKE_LOGIN, SMOKE_USER
from tests.verify import reach

REGISTRATION_WAIT = 30  # seconds


def _http(url: str, data: dict | None = None, token: str | None = None):
    request = urllib.request.Request(url, data=json.dumps(data).encode() if data else None)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with master_http.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def _master_url(cluster) -> str:
    # A master found dead before the checks: SSH on the check's cell, not a wait per request.
    reach.raise_if_dead(cluster.master_node)
    return master_http.base_url(cluster)


def _agents_of(node, agents: dict) -> dict:
    """The registered agents the deploy gives this node: id = hostname (agent_layout per_node)
    or hostname-<i> (per_domain, one per NVLink domain)."""
    return {i: a for i, a in agents.items() if node.owns_agent(i)}


def _slot_count(slots) -> int:
    # The REST API returns a map of slot id -> slot; tolerate a list or a count.
    return slots if isinstance(slots, int) else len(slots or ())


def _enabled_slots(node, agents: dict) -> int:
    return sum(
        _slot_count(a.get("slots")) for a in _agents_of(node, agents).values() if a.get("enabled", True)
    )


def admin_token(cluster) -> str:
    """A session token for admin with determined.admin_password. Raised, not asserted: the
    drain plugin calls it outside any check (and `python -O` drops assert statements)."""
    status, body = _http(
        f"{_master_url(cluster)}/api/v1/auth/login",
        {"username": "admin", "password": cluster.determined.admin_password.value},
    )
    if status != 200:
        raise AssertionError(f"login as admin -> {status} (determined.admin_password)")
    return body["token"]


def smoke_login(master_host) -> dict:
    """The smoke user's login as the deploy left it on the master node (SMOKE_LOGIN, 0600 root:
    roles/determined/users.py), read over verify's SSH as master.yaml is."""
    f = master_host.file(SMOKE_LOGIN)
    if not f.exists:
        raise AssertionError(
            f"no {SMOKE_LOGIN} on the master node: the deploy makes {SMOKE_USER}; deploy again"
        )
    try:
        login = json.loads(f.content_string)
    except ValueError:
        raise AssertionError(f"{SMOKE_LOGIN} on the master node is not JSON: deploy again") from None
    password = login.get("password") if isinstance(login, dict) else None
    if (
        not isinstance(login, dict)
        or login.get("username") != SMOKE_USER
        or not isinstance(password, str)
        or not password
    ):
        raise AssertionError(f"{SMOKE_LOGIN} on the master node names no {SMOKE_USER} login: deploy again")
    return login


def smoke_token(cluster, master_host) -> str:
    """A session token of the smoke user, the non-admin user verify's smoke experiments run as:
    every task gets its submitter's token (DET_USER_TOKEN), so trial containers never hold admin's.
    Raised, not asserted, as admin_token."""
    login = smoke_login(master_host)
    status, body = _http(f"{_master_url(cluster)}/api/v1/auth/login", login)
    if status != 200:
        raise AssertionError(f"login as {login['username']} -> {status} (its password on the master node)")
    return body["token"]


def list_agents(cluster, token: str | None = None) -> list[dict]:
    """GET /api/v1/agents (as admin unless a token is given). Raised, not asserted, as
    admin_token."""
    status, body = _http(f"{_master_url(cluster)}/api/v1/agents", token=token or admin_token(cluster))
    if status != 200:
        raise AssertionError(f"GET /api/v1/agents -> {status}")
    return body.get("agents") or []


def poll_agents(cluster, done) -> list[dict]:
    """GET /api/v1/agents as admin until done(agents) or REGISTRATION_WAIT seconds passed (an
    agent started before the master retries every 5 s; a restarted one reconnects)."""
    token = admin_token(cluster)
    deadline = time.monotonic() + REGISTRATION_WAIT
    while True:
        agents = list_agents(cluster, token)
        if done(agents) or time.monotonic() > deadline:
            return agents
        time.sleep(2)
