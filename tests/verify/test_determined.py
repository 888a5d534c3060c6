"""The scheduler: PostgreSQL, the Determined master, Docker and the agents.

master.yaml and agent.yaml are checked against the fields Determined 0.38 knows (KNOWN_MASTER,
KNOWN_AGENT below, from master/internal/config and agent/internal/options at v0.38.0): the
master and the agent refuse unknown keys, and the article's `region:` under
checkpoint_storage is one. Their values are checked against what cluster.yaml implies
(tests/verify/master_config.py), written from the model, not from the deploy's templates.

Secret values never reach an assertion message (comparisons become booleans first).
"""

import hashlib
import http.client
import json
import shlex
import socket
import ssl

import pytest
import yaml

from deploy import determined_node, master_http
from deploy.cluster.determined import SMOKE_USER
from deploy.cluster.master_tls import agent_ca, served_chain
from deploy.facts.postgresql import RoleVerifier
from deploy.postgresql_node import DIGEST_KEY, MIN_CONNECTIONS, MIN_MAJOR, hmac_key, password_matches
from tests.verify.master_api import (
    _agents_of,
    _enabled_slots,
    _http,
    _master_url,
    _slot_count,
    admin_token,
    smoke_token,
)
from tests.verify.master_config import differences, expected_master_yaml, expected_task_container_defaults
from tests.verify.test_storage import parse_env_file

ANY = None  # a leaf, or a subtree this check does not descend into

# Config (master/internal/config/config.go) with ResourceConfig inlined.
KNOWN_MASTER = {
    "config_file": ANY,
    "log": ANY,
    "tensorboard_timeout": ANY,
    "notebook_timeout": ANY,
    "db": {
        k: ANY
        for k in (
            "user",
            "password",
            "migrations",
            "views_and_triggers",
            "host",
            "port",
            "name",
            "ssl_mode",
            "ssl_root_cert",
        )
    },
    "security": {k: ANY for k in ("default_task", "tls", "ssh", "authz", "token", "initial_user_password")},
    # schemas/expconf/v0/s3.json (additionalProperties: false): there is no region.
    "checkpoint_storage": {
        k: ANY
        for k in (
            "type",
            "bucket",
            "access_key",
            "secret_key",
            "endpoint_url",
            "prefix",
            "save_experiment_best",
            "save_trial_best",
            "save_trial_latest",
        )
    },
    # master/pkg/model/task_container_defaults.go
    "task_container_defaults": {
        k: ANY
        for k in (
            "dtrain_network_interface",
            "nccl_port_range",
            "gloo_port_range",
            "shm_size_bytes",
            "network_mode",
            "cpu_pod_spec",
            "gpu_pod_spec",
            "checkpoint_gc_pod_spec",
            "image",
            "registry_auth",
            "force_pull_image",
            "environment_variables",
            "add_capabilities",
            "drop_capabilities",
            "devices",
            "bind_mounts",
            "work_dir",
            "slurm",
            "pbs",
            "startup_hook",
            "log_policies",
            "preemption_timeout",
            "kubernetes",
        )
    },
    "port": ANY,
    "root": ANY,
    "telemetry": ANY,
    "enable_cors": ANY,
    "launch_error": ANY,
    "cluster_name": ANY,
    "ui_customization": ANY,
    "logging": ANY,
    "retention_policy": ANY,
    "observability": ANY,
    "cache": ANY,
    "webhooks": ANY,
    "feature_switches": ANY,
    "reserved_ports": ANY,
    "resource_manager": ANY,
    "resource_pools": ANY,
    "additional_resource_managers": ANY,
    "__internal": ANY,
    "scim": ANY,
    "saml": ANY,
    "oidc": ANY,
    "det_cloud": ANY,
    "integrations": ANY,
}

# Options (agent/internal/options/options.go)
KNOWN_AGENT = {
    k: ANY
    for k in (
        "config_file",
        "log",
        "master_host",
        "master_port",
        "agent_id",
        "resource_pool",
        "container_master_host",
        "container_master_port",
        "slot_type",
        "visible_gpus",
        "security",
        "debug",
        "artificial_slots",
        "tls",
        "tls_cert",
        "tls_key",
        "api_enabled",
        "bind_ip",
        "bind_port",
        "http_proxy",
        "https_proxy",
        "ftp_proxy",
        "no_proxy",
        "agent_reconnect_attempts",
        "agent_reconnect_backoff",
        "container_runtime",
        "container_auto_remove_disabled",
        "hooks",
        "fluent",
    )
}


def unknown_keys(document, known, path="") -> list[str]:
    """Dotted paths of keys in `document` that `known` does not list (names only)."""
    if not isinstance(document, dict):
        return [f"{path or '(top level)'}: not a mapping"]
    found = []
    for key, value in document.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in known:
            found.append(where)
        elif isinstance(known[key], dict) and isinstance(value, dict):
            found += unknown_keys(value, known[key], where)
    return found


def _read_yaml(host, path: str) -> dict:
    return yaml.safe_load(host.file(path).content_string)


# --- PostgreSQL ---------------------------------------------------------------------------


def _psql(host, cluster, sql: str) -> str:
    return host.check_output(
        f'cd / && runuser -u postgres -- psql -X -p {cluster.database.port} -Atc "{sql}"'
    )


def test_postgresql_version_and_connections(master, host_of, cluster):
    h = host_of(master)
    version = int(_psql(h, cluster, "SHOW server_version_num"))
    assert version >= MIN_MAJOR * 10000, f"PostgreSQL {version}: Determined needs {MIN_MAJOR}+"
    assert int(_psql(h, cluster, "SHOW max_connections")) >= MIN_CONNECTIONS
    assert _psql(h, cluster, "SHOW listen_addresses") == "localhost"
    assert int(_psql(h, cluster, "SHOW port")) == cluster.database.port


def test_database_role_password_is_the_configured_one(master, host_of, cluster):
    h = host_of(master)
    db = cluster.database
    # The node's key for the keyed digest (roles/postgresql/db_role.py), read into memory only.
    key = hmac_key(h.file(DIGEST_KEY).content) if h.file(DIGEST_KEY).exists else None
    assert key is not None, f"{DIGEST_KEY} is missing or not 128 bytes"
    verifier = RoleVerifier().process(
        [h.check_output(RoleVerifier().command(role=db.user, port=db.port, key=DIGEST_KEY))]
    )
    assert verifier is not None, f"role {db.user} does not exist"
    matches = password_matches(db.password.value, verifier, key)
    assert matches, f"role {db.user}'s password is not database.password from cluster.yaml"
    owner = _psql(h, cluster, f"SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = '{db.name}'")
    assert owner == db.user


# --- master -------------------------------------------------------------------------------


def test_master_service(master, host_of):
    service = host_of(master).service("determined-master")
    assert service.is_enabled and service.is_running


def test_master_health_from_controller(cluster):
    status, _ = _http(f"{_master_url(cluster)}/health")
    assert status == 200, f"GET /health -> {status}; journalctl -u determined-master on {cluster.master_host}"


def test_master_health_on_node(master, host_of, cluster):
    # As the deploy's start-up wait asks (https by master_host against master-ca.crt with TLS).
    url, resolve, env = determined_node.health_check(cluster)
    options = [f"--resolve {shlex.quote(resolve)}"] if resolve else []
    options += [f"--cacert {shlex.quote(path)}" for path in env.values()]
    code = host_of(master).check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' {' '.join(options)} {shlex.quote(url)}"
    )
    assert code == "200", f"GET {url} on the node -> {code}"


def test_master_yaml(master, host_of, cluster):
    """The node's master.yaml, parsed: only keys Determined knows, and the values cluster.yaml
    implies (port, db, checkpoint_storage, security, task_container_defaults)."""
    h = host_of(master)
    config = _read_yaml(h, "/etc/determined/master.yaml")
    assert unknown_keys(config, KNOWN_MASTER) == []
    differ = differences(config, expected_master_yaml(cluster))
    assert differ == [], "master.yaml differs from cluster.yaml: " + "; ".join(differ)
    # The keys Determined's trial containers use are the ones the master's service has.
    storage = config["checkpoint_storage"]
    env = parse_env_file(h.file("/etc/determined/master-s3.env").content_string)
    same = (
        storage["access_key"] == env["AWS_ACCESS_KEY_ID"]
        and storage["secret_key"] == env["AWS_SECRET_ACCESS_KEY"]
    )
    assert same, "checkpoint_storage keys in master.yaml differ from master-s3.env"


def _as_written(held: dict) -> dict:
    """The real master reports its parsed config (Config.Printable): a plain environment list
    becomes RuntimeItems {cpu, cuda, rocm} (each the list), a device gains mode "mrw"."""
    held = dict(held)
    env = held.get("environment_variables")
    if isinstance(env, dict) and env.get("cpu") == env.get("cuda"):
        held["environment_variables"] = env.get("cuda")
    devices = held.get("devices")
    if isinstance(devices, list):
        held["devices"] = [
            {k: v for k, v in d.items() if (k, v) != ("mode", "mrw")} if isinstance(d, dict) else d
            for d in devices
        ]
    return held


def test_master_task_container_defaults(cluster):
    """The configuration the running master holds (GET /api/v1/master/config), not the file:
    a master that was not restarted after a change still hands trials the old values."""
    status, body = _http(f"{_master_url(cluster)}/api/v1/master/config", token=admin_token(cluster))
    assert status == 200, f"GET /api/v1/master/config -> {status}"
    config = body["config"]
    held = _as_written(config.get("task_container_defaults") or {})
    differ = differences(held, expected_task_container_defaults(cluster), "task_container_defaults")
    assert differ == [], "the master's task_container_defaults differ: " + "; ".join(differ)
    endpoint = (config.get("checkpoint_storage") or {}).get("endpoint_url")
    assert endpoint == cluster.trial_endpoint, (
        f"the master hands trials endpoint_url {endpoint}, cluster.yaml implies {cluster.trial_endpoint}"
    )


def _login(cluster, username: str, password: str) -> tuple[int, dict | None]:
    return _http(f"{_master_url(cluster)}/api/v1/auth/login", {"username": username, "password": password})


def test_master_admin_password_is_the_configured_one(cluster):
    status, _ = _login(cluster, "admin", cluster.determined.admin_password.value)
    assert status == 200, f"login as admin with determined.admin_password -> {status}"


def test_master_refuses_blank_passwords(cluster):
    """No user, built-in or added later, logs in with a blank password (Determined lets a user
    without a password in with a blank one: model.User.ValidatePassword)."""
    # admin_token: the same login and message, and a token typed as one (not an optional body).
    status, listed = _http(f"{_master_url(cluster)}/api/v1/users", token=admin_token(cluster))
    assert status == 200, f"GET /api/v1/users -> {status}"
    names = sorted({"admin", "determined"} | {u["username"] for u in listed["users"] if not u.get("remote")})
    let_in = [name for name in names if _login(cluster, name, "")[0] == 200]
    assert let_in == [], f"the master lets {let_in} log in with a blank password"


def test_determined_user_inactive(cluster):
    """The built-in `determined` user had admin's initial password: the deploy deactivates it."""
    # admin_token: the same login and message, and a token typed as one (not an optional body).
    status, listed = _http(f"{_master_url(cluster)}/api/v1/users", token=admin_token(cluster))
    assert status == 200, f"GET /api/v1/users -> {status}"
    active = [u["username"] for u in listed["users"] if u["username"] == "determined" and u.get("active")]
    assert active == [], "the built-in user determined is active"
    status, _ = _login(cluster, "determined", cluster.determined.admin_password.value)
    assert status != 200, "determined logs in with determined.admin_password"


def test_trial_submitter_is_no_admin(cluster, host_of):
    """The smoke experiments' user logs in with the password the deploy left on the master node
    and is no admin: the session token Determined hands its trials is not an admin's."""
    token = smoke_token(cluster, host_of(cluster.master_node))
    status, me = _http(f"{_master_url(cluster)}/api/v1/me", token=token)
    assert status == 200, f"GET /api/v1/me as {SMOKE_USER} -> {status}"
    assert me["user"]["username"] == SMOKE_USER and me["user"]["active"], me["user"]
    assert not me["user"]["admin"], f"{SMOKE_USER} is an admin: its trials would hold an admin token"


# --- agents -------------------------------------------------------------------------------


def test_docker_with_nvidia_runtime(agent, host_of):
    h = host_of(agent)
    assert h.service("docker").is_enabled and h.service("docker").is_running
    version = h.check_output("docker version --format '{{.Server.Version}}'")
    major, minor = (int(x) for x in version.split(".")[:2])
    assert (major, minor) >= (20, 10), f"Docker {version}: Determined needs 20.10+"
    runtimes = json.loads(h.check_output("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes


def test_agent_yaml(agent, host_of, cluster):
    # per_node: agent.yaml; per_domain: /etc/determined/agent-<i>.yaml, one per NVLink domain.
    from tests.verify.test_topology_agents import agent_configs, expected_agent_id

    configs = agent_configs(host_of(agent), agent)
    assert configs, f"no agent configuration for agent_layout {agent.agent_layout}"
    for path, config in configs.items():
        assert unknown_keys(config, KNOWN_AGENT) == [], path
        assert config["master_host"] == cluster.master_host, path
        # Always written: without it the agent dials port 80, not the master's port.
        assert config["master_port"] == cluster.master_port, path
        assert config["agent_id"] == expected_agent_id(agent, path), path
        assert config["resource_pool"] == cluster.determined.resource_pool, path
        assert config["slot_type"] == cluster.determined.slot_type, path


def test_agent_service(agent, host_of):
    # per_domain nodes run determined-agent@<i> instead (test_topology_agents.py checks them).
    from tests.verify.test_topology_agents import domain_config_paths

    h = host_of(agent)
    units = (
        ["determined-agent"]
        if agent.agent_layout == "per_node"
        else [f"determined-agent@{i}" for i in sorted(domain_config_paths(h), key=int)]
    )
    assert units, "no per-domain agent configuration on a per_domain node"
    for unit in units:
        service = h.service(unit)
        assert service.is_enabled and service.is_running, f"{unit} not enabled and running"


def test_agent_reaches_master_port(agent, host_of, cluster):
    # By name, as the agent does: /etc/hosts resolution and the port in one go.
    target = f"/dev/tcp/{cluster.master_host}/{cluster.master_port}"
    result = host_of(agent).run(f"timeout 5 bash -c ': < {target}'")
    assert result.rc == 0, (
        f"{agent.hostname} cannot connect to {cluster.master_host}:"
        f"{cluster.master_port}: {result.stderr.strip()}"
    )


def test_agent_registered_with_its_slots(agent, registered_agents):
    # Disabled agents are ones stopped within agent_reconnect_wait (25 s): the master still
    # lists them after a layout change; they offer nothing.
    mine = {i: a for i, a in _agents_of(agent, registered_agents).items() if a.get("enabled", True)}
    assert mine, (
        f"{agent.hostname} has no enabled agent (have: {sorted(registered_agents)}); "
        f"journalctl -u 'determined-agent*' on {agent.hostname}"
    )
    if agent.agent_layout == "per_node":
        assert sorted(mine) == [agent.hostname]
    # slots is the node's GPU count: per_domain agents share it out, one domain each.
    assert _enabled_slots(agent, registered_agents) == agent.slots


def unnamed_agents(cluster, agents: dict) -> list[str]:
    """The enabled agents no agent node of cluster.yaml owns by id (its hostname, or
    hostname-<i> per NVLink domain), each with where the master sees it connect from."""
    return [
        f"{agent_id} (from {', '.join(a.get('addresses') or ['?'])}, {_slot_count(a.get('slots'))} slots)"
        for agent_id, a in sorted(agents.items())
        if a.get("enabled", True) and not any(n.owns_agent(agent_id) for n in cluster.agents)
    ]


def test_master_knows_no_unnamed_agent(master, registered_agents, cluster):
    """Determined 0.38 exempts the agents' websocket from authentication (master/internal/user
    unauthenticatedPointsList: /agents): anything that reaches the master's port can register
    an agent with any id and slot count, and receive other users' tasks, their tokens and S3
    keys. Every enabled agent must be one cluster.yaml names; a disabled one takes no work."""
    unnamed = unnamed_agents(cluster, registered_agents)
    assert not unnamed, f"the master schedules on agents cluster.yaml does not name: {'; '.join(unnamed)}"


# --- determined.tls ------------------------------------------------------------------------


def test_master_serves_the_configured_certificate(master, cluster):
    """A client's own handshake with the master's address, checking master_host against the
    master's CA (as the agents and trials do), and the leaf is determined.tls.certificate's
    (compared by sha256: not one left from before)."""
    tls = cluster.determined.tls
    if not tls.enabled:
        pytest.skip("determined.tls is not set: the master serves plain http")
    context = master_http.ssl_context(cluster)
    try:
        with (
            socket.create_connection((str(master.address), cluster.master_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=cluster.master_host) as conn,
        ):
            served = conn.getpeercert(binary_form=True) or b""
    except (ssl.SSLError, OSError) as e:
        pytest.fail(
            f"no TLS session with the master at {master.address}:{cluster.master_port} as "
            f"{cluster.master_host}: {e}"
        )
    configured = ssl.PEM_cert_to_DER_cert(
        tls.certificate.text.split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
    )
    assert hashlib.sha256(served).hexdigest() == hashlib.sha256(configured).hexdigest(), (
        "the master serves another certificate than determined.tls.certificate"
    )


def test_master_serves_no_plain_http(master, cluster):
    """No API answer over plain http: Determined's master closes a connection that does not
    start a TLS handshake (its cmux reads the first bytes through tls.NewListener,
    master/internal/core.go); a plain net/http TLS server would answer 400 ("Client sent an
    HTTP request to an HTTPS server."). Either passes; a 200 does not."""
    if not cluster.determined.tls.enabled:
        pytest.skip("determined.tls is not set: plain http is the master's protocol")
    conn = http.client.HTTPConnection(str(master.address), cluster.master_port, timeout=10)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        status, body = response.status, response.read(512)
    except (OSError, http.client.HTTPException):
        status, body = None, b""  # the connection dropped: no plain http either
    finally:
        conn.close()
    assert status != 200 and b'"status"' not in body, (
        f"the master answers plain http on {master.address}:{cluster.master_port}"
    )


def test_master_certs_as_configured(master, host_of, cluster):
    """master.crt (the served chain), master.key (0600 root) and master-ca.crt, named by
    master.yaml's security.tls; without determined.tls neither the directory nor the keys."""
    h = host_of(master)
    security = _read_yaml(h, "/etc/determined/master.yaml").get("security") or {}
    certs = h.file(determined_node.CERTS_DIR)
    tls = cluster.determined.tls
    if not tls.enabled:
        assert "tls" not in security, "master.yaml has security.tls without determined.tls"
        assert not certs.exists, (
            f"{determined_node.CERTS_DIR} exists without determined.tls: a stale private key"
        )
        return
    # Determined's security.tls: the certificate and key files the master serves.
    files = {"cert": determined_node.MASTER_CRT, "key": determined_node.MASTER_KEY}
    assert security.get("tls") == files, f"master.yaml's security.tls is not {files}"
    crt, key, ca = (
        h.file(determined_node.MASTER_CRT),
        h.file(determined_node.MASTER_KEY),
        h.file(determined_node.MASTER_CA),
    )
    assert crt.exists and crt.content_string == served_chain(tls, cluster.master_host), (
        f"{determined_node.MASTER_CRT} is not determined.tls.certificate (with its root)"
    )
    assert key.exists and (key.user, key.group, key.mode) == ("root", "root", 0o600), (
        f"{determined_node.MASTER_KEY} is not 0600 root"
    )
    assert ca.exists and ca.content_string == agent_ca(tls, cluster.master_host), (
        f"{determined_node.MASTER_CA}"
    )


def test_agent_tls_as_configured(agent, host_of, cluster):
    """Each agent's configuration has security.tls (enabled, master_cert, master_cert_name) and
    the CA file with determined.tls; neither without it."""
    from tests.verify.test_topology_agents import agent_configs

    h = host_of(agent)
    configs = agent_configs(h, agent)
    assert configs, f"no agent configuration for agent_layout {agent.agent_layout}"
    tls = cluster.determined.tls
    # Determined's agent security.tls: the master's CA, and master_host as the name to check.
    expected = {
        "enabled": True,
        "master_cert": determined_node.MASTER_CA,
        "master_cert_name": cluster.master_host,
    }
    for path, config in configs.items():
        held = (config.get("security") or {}).get("tls")
        if not tls.enabled:
            assert held is None, f"{path} has security.tls without determined.tls"
        else:
            assert held == expected, f"{path}: security.tls is not the master's"
    ca = h.file(determined_node.MASTER_CA)
    if not tls.enabled:
        assert not h.file(determined_node.CERTS_DIR).exists, (
            f"{determined_node.CERTS_DIR} without determined.tls"
        )
        return
    assert ca.exists and ca.content_string == agent_ca(tls, cluster.master_host), (
        f"{determined_node.MASTER_CA} is not the master's CA"
    )
