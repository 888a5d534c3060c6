"""The cluster's own rules: building the model from the checked keys, and every check that
looks at more than one key (subnets, addresses, roles, the storage host, ports, secrets' strength).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import string
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from deploy.cluster import checks, hardware, images, master_tls, storage_tls
from deploy.cluster.keys import (
    ArtifactKey,
    Key,
    ListKey,
    Section,
    allowed,
    default,
    open_section,
    read,
    required,
    section_type,
    specs,
)
from deploy.cluster.model import (
    ARTIFACT_KINDS,
    ROLES,
    Artifact,
    Cluster,
    Database,
    Determined,
    Hardware,
    IpoibNetwork,
    Network,
    Node,
    Preflight,
    Sources,
    Ssh,
    Storage,
    TaskImage,
    Versions,
)
from deploy.cluster.reader import (
    MISSING,
    ClusterError,
    Map,
    Reader,
    did_you_mean,
    index_document,
    read_document,
)
from deploy.secrets import describe


def load_cluster(path: str | Path, *, resolve_secrets: bool = True) -> Cluster:
    """Read and validate cluster.yaml. Raises ClusterError listing every problem.

    resolve_secrets=False keeps secret references unresolved (`.value` then raises): for
    tools that only need the references, such as deploy.short_yaml.
    """
    shown = str(path)
    document, raw, surprises = read_document(path, shown)
    reader = Reader(shown, resolve_secrets, top_keys=allowed(Cluster))
    reader.hidden = tuple(
        name for name, spec in specs(Cluster).items() if isinstance(spec, Section) and spec.holds_secrets
    )
    reader.shown_keys = {
        f"{section}.{name}"
        for section in reader.hidden
        for name, spec in specs(section_type(Cluster, section)).items()
        if isinstance(spec, Key)
    }
    if document is not None:
        index_document(reader, document, surprises)
    cluster = build(reader, raw, Path(path))
    if reader.problems or cluster is None:
        raise ClusterError(reader.in_file_order())
    return cluster


def build(r: Reader, raw: object, path: Path) -> Cluster | None:
    """The model, or None once `r` holds every problem found."""
    # Long: the sections read in cluster.yaml's order, then the rules that span them: a list of one-
    # line steps
    if raw is None:
        r.add(
            "",
            "None",
            "the file is empty: expected a mapping with " + ", ".join(required(Cluster)),
        )
        return None
    if not isinstance(raw, dict):
        r.add("", describe(raw), "the top level must be a mapping of keys (master_host, nodes, ...)")
        return None
    top = r.mapping(raw, "", allowed(Cluster))
    values = read(top, Cluster)  # master_host, master_port, reboot
    master_host = values["master_host"]
    ssh = Ssh(**read(open_section(top, Cluster, "ssh"), Ssh))
    network = _network(r, top)
    preflight = Preflight(**read(open_section(top, Cluster, "preflight"), Preflight))
    versions = Versions(**read(open_section(top, Cluster, "versions"), Versions))
    sources = _sources(top)
    storage_map = open_section(top, Cluster, "storage")
    storage_values = read(storage_map, Storage, {"host": master_host})
    tls_map = open_section(storage_map, Storage, "tls")
    storage_values["tls"] = storage_tls.StorageTls(**read(tls_map, storage_tls.StorageTls))
    storage_host = storage_values["host"]
    determined = _determined(r, top, versions, master_host)
    roleless: list[tuple[str, object]] = []
    hw_map = open_section(top, Cluster, "hardware")
    hw_values = read(hw_map, Hardware)
    cluster_hw = _resolve({k: x for k, x in hw_values.items() if hw_map.given(k) or x is not None}, None)
    nodes = _nodes(r, top, network, master_host, storage_host, determined, roleless, cluster_hw)
    storage = _storage(r, storage_map, storage_values)
    _endpoint(r, storage_map, storage, nodes)
    storage_tls.check_tls(r, storage_map, storage, nodes)
    database = Database(**read(open_section(top, Cluster, "database"), Database))
    _database_password(r, database)
    _determined_tag(r, sources, determined)

    hostnames = [n.hostname for n in nodes or ()]
    # Only when every node parsed: a node with a broken hostname would make this a false alarm.
    if nodes is not None and None not in hostnames and len(hostnames) == len(top.raw("nodes")):
        for key, name in (("master_host", master_host), ("storage.host", storage_host)):
            if key == "storage.host" and storage_map.raw("host") is MISSING:
                continue  # the default, master_host: already reported if wrong
            if name is not None and name not in hostnames:
                r.bad(key, name, "not the hostname of a node under nodes" + did_you_mean(name, hostnames))
        sm = network.subnet_manager
        if sm is not None and sm not in hostnames:  # every node has the fabric (ipoib_address)
            r.bad(
                "network.subnet_manager",
                sm,
                "not the hostname of a node under nodes (the node that runs opensm)"
                + did_you_mean(sm, hostnames),
            )
        if master_host in hostnames and storage_host in hostnames:
            # Otherwise a node's missing role is only a consequence of the wrong name.
            for key, raw_roles in roleless:
                r.bad(
                    key,
                    raw_roles,
                    "the node has no role: list agent, or name it in master_host or storage.host",
                )
    _port_clashes(r, ssh, master_host, values["master_port"], storage_host, storage, database)
    if values["insecure_http"] is False:
        _tls_required(r, top)

    if r.problems:
        return None
    return Cluster(
        path=path,
        ssh=ssh,
        network=network,
        preflight=preflight,
        nodes=nodes or (),
        versions=versions,
        sources=sources,
        storage=storage,
        database=database,
        determined=determined,
        hardware=cluster_hw,
        **values,
    )


# What crosses the network in clear without each TLS section (the nodes share one flat network
# with no firewall rules, so any agent can read it: ARP spoofing needs no more).
PLAIN_HTTP = {
    "determined": "the admin password (the deploy, verify, rebuild and the drain timer log in with "
    "it), session tokens and trials' logs go to the master in clear",
    "storage": "checkpoints and database backups go to MinIO unencrypted",
}


def _tls_required(r: Reader, top: Map) -> None:
    """determined.tls and storage.tls, unless the file accepts plain HTTP in so many words."""
    for section, what in PLAIN_HTTP.items():
        raw = top.raw(section)
        tls = raw.get("tls") if isinstance(raw, dict) else None
        written = tls if isinstance(tls, dict) else {}
        if not isinstance(raw, dict) or written.get("certificate") or written.get("private_key"):
            continue  # a missing section or half a pair: reported by its own check
        r.add(
            f"{section}.tls",
            "(missing)",
            f"required unless the file says `insecure_http: true`: without it {what} "
            "(docs/cluster-yaml.md, TLS)",
        )


def _network(r: Reader, top: Map) -> Network:
    m = open_section(top, Cluster, "network")
    own = read(m, Network)
    management = own["management"]
    ib = read(open_section(m, Network, "ipoib"), IpoibNetwork)
    subnet = ib["subnet"]
    if management is not None and subnet is not None and subnet.overlaps(management):
        r.bad(
            "network.ipoib.subnet",
            str(subnet),
            f"overlaps network.management ({management}): IPoIB needs a subnet of its own",
        )
        ib["subnet"] = None
    # The kernel refuses a datagram-mode MTU above the IB link MTU (4096 at most) less the
    # 4-byte IPoIB header; connected mode carries up to 65520 (Documentation/infiniband/ipoib.rst).
    if ib["mode"] == "datagram" and ib["mtu"] is not None and ib["mtu"] > 4092:
        r.bad(
            "network.ipoib.mtu",
            ib["mtu"],
            "above 4092, the most IPoIB datagram mode carries (IB MTU 4096 less its 4-byte "
            "header): set network.ipoib.mode: connected (up to 65520) or a smaller MTU",
        )
    return Network(
        management=management,
        ipoib=IpoibNetwork(**ib),
        nccl_ib_hca=own["nccl_ib_hca"],
        subnet_manager=own["subnet_manager"],
    )


_ARTIFACT_KEYS = tuple(f.name for f in dataclasses.fields(Artifact))


def _sources(top: Map) -> Sources:
    m = open_section(top, Cluster, "sources")
    values: dict[str, Any] = read(m, Sources)
    for name, spec in specs(Sources).items():
        if not isinstance(spec, ArtifactKey):
            continue
        a = m.sub(name, _ARTIFACT_KEYS, required=f"{{url, sha256}} of the {spec.what}")
        url = a.get(
            "url",
            checks.url(("http", "https"), placeholders=spec.placeholders),
            what=f"where to download the {spec.what}",
        )
        if "distro" in spec.placeholders and isinstance(a.raw("sha256"), dict):
            per_distro = checks.distro_pins(a, "sha256")
            values[name] = Artifact(url=url, sha256="", per_distro=per_distro or ())
            continue
        pin: Any = checks.sha256(a, "sha256", spec.what)  # None after a problem: no Cluster then
        values[name] = Artifact(url=url, sha256=pin)
    if values["registry_ca"] is not None and not m.given("registry"):
        m.r.bad("sources.registry_ca", values["registry_ca"], "a CA without sources.registry: name it")
    login, repo = values["mirror_credentials"], urlsplit(values["cuda_repo"] or "").hostname or ""
    repo = repo.rstrip(".")  # "host." is the same host to DNS
    if login is not None and (repo == "nvidia.com" or repo.endswith(".nvidia.com")):  # not NVIDIA's
        m.r.add("sources.mirror_credentials", str(login.reference), f"for a site mirror, not {repo}")
    proxy_login = values["apt_proxy_credentials"]
    if proxy_login is not None and not m.given("apt_proxy"):
        m.r.add("sources.apt_proxy_credentials", str(proxy_login.reference), "a login without apt_proxy")
    return Sources(**values)


def _storage(r: Reader, m: Map, values: dict[str, Any]) -> Storage:
    host, port = values["host"], values["port"]
    if port is not None and port == values["console_port"]:
        r.bad("storage.console_port", port, "must differ from storage.port")
    if not m.given("endpoint_url") and host is not None and port is not None:
        values["endpoint_url"] = f"{storage_tls.default_scheme(values['tls'])}://{host}:{port}"
    data_dir = values["data_dir"]
    if data_dir is not None and data_dir.rstrip("/") == "":
        r.bad("storage.data_dir", data_dir, "must not be the root directory")
    # MinIO refuses to start with a root user under 3 or a password under 8 characters.
    for key, least, what in (("access_key", 3, "an access key"), ("secret_key", 8, "a secret key")):
        secret = values[key]
        if secret is not None and secret.resolved and len(secret.value) < least:
            r.add(
                f"storage.{key}",
                str(secret.reference),
                f"too short: MinIO needs {what} of at least {least} characters",
            )
    root = values["access_key"]
    if root is not None and root.resolved and values["determined_user"] == root.value:
        # The value is the root user's name, a secret: not shown.
        r.add("storage.determined_user", "(not shown)", "must not be storage.access_key (MinIO's root user)")
    # pg-backup's own user (deploy/minio_admin.py): a name shared with the root or Determined's
    # user would give trials the backups, or the backups every right.
    backup_user = values["backup_user"]
    if root is not None and root.resolved and backup_user == root.value:
        r.add("storage.backup_user", "(not shown)", "must not be storage.access_key (MinIO's root user)")
    elif backup_user is not None and backup_user == values["determined_user"]:
        r.bad(
            "storage.backup_user",
            backup_user,
            "must differ from storage.determined_user (trials hold its keys)",
        )
    # A user's own secret equal to the root password (or the other user's) would hand trials
    # the root account (or the backups). The values are secrets: not shown.
    root_secret = values["secret_key"]
    seen: dict[str, str] = {}
    if root_secret is not None and root_secret.resolved:
        seen[root_secret.value] = "storage.secret_key"
    for key in ("determined_secret_key", "backup_secret_key"):
        own = values[key]
        if own is None or not own.resolved:
            continue
        if own.value in seen:
            r.add(f"storage.{key}", str(own.reference), f"must differ from {seen[own.value]}")
        seen.setdefault(own.value, f"storage.{key}")
    # Determined's user is denied backups/ (the database dumps): its checkpoints cannot go there.
    prefix = values["prefix"]
    if prefix is not None and (prefix.strip("/") + "/").startswith("backups/"):
        r.bad(
            "storage.prefix",
            prefix,
            "must not be under backups/ (the database backups; trials may not touch it)",
        )
    return Storage(**values)


SCHEME_PORTS = {"http": 80, "https": 443}


def _endpoint(r: Reader, m: Map, storage: Storage, nodes: tuple[Node, ...] | None) -> None:
    """A written endpoint_url must reach MinIO's S3 port on the storage node.

    Otherwise the deploy succeeds and the first checkpoint fails: another host, the console
    port (a web UI, not S3), or a port left out (S3 clients then use 80 or 443).
    """
    url, host, port = storage.endpoint_url, storage.host, storage.port
    if not m.given("endpoint_url") or url is None or host is None or port is None:
        return
    split = checks.split_url(url)
    if isinstance(split, str):  # reported by the field check already
        return
    parts, url_host, url_port = split
    key = "storage.endpoint_url"
    node = next((n for n in nodes or () if n.hostname == host), None)
    if node is not None:
        # The names and addresses of the storage node; ipoib_name is its IPoIB name in every
        # node's /etc/hosts (roles/node/hosts.py).
        names = [host, str(node.address), str(node.ipoib_address)]
        if node.ipoib_interface is not None:
            names.insert(1, node.ipoib_name)
        if url_host.rstrip(".").lower() not in [n.lower() for n in names]:
            r.bad(
                key,
                url,
                f"points at {url_host}, not at the storage node {host} (write one of: {', '.join(names)})",
            )
    default_port = SCHEME_PORTS[parts.scheme]
    if url_port is None:
        if port != default_port:
            r.bad(
                key,
                url,
                f"has no port, so S3 clients would use {default_port}; MinIO's S3 API listens on "
                f"storage.port ({port}): write {parts.scheme}://{url_host}:{port}",
            )
    elif url_port == storage.console_port:
        r.bad(
            key,
            url,
            f"port {url_port} is storage.console_port, MinIO's web console: S3 clients need "
            f"storage.port ({port})",
        )
    elif url_port != port:
        r.bad(key, url, f"port {url_port} is not storage.port ({port}), where MinIO's S3 API listens")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _password_policy(value: str) -> list[str]:
    """Determined's rule for initial_user_password; returns what is missing."""
    missing = []
    if len(value) < 8:
        missing.append("at least 8 characters")
    if not any(c.isupper() for c in value):
        missing.append("an upper-case letter")
    if not any(c.islower() for c in value):
        missing.append("a lower-case letter")
    if not any(c.isdigit() for c in value):
        missing.append("a digit")
    return missing


# What Determined's master can carry in its database URL. It builds
# fmt.Sprintf("postgres://%s:%s@%s:%s/%s?...", user, password, ...) without escaping
# (master/internal/db/setup.go, 0.38) and pgx/pgconn parses it with Go's net/url: `/`, `?` and
# `#` end the user:password part, `%XX` is decoded into another password, and anything outside
# RFC 3986's userinfo characters fails ("net/url: invalid userinfo"). These pass unchanged.
DB_PASSWORD_CHARACTERS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@"


def _database_password(r: Reader, database: Database) -> None:
    secret = database.password
    if secret is None or not secret.resolved:
        return
    if any(c not in DB_PASSWORD_CHARACTERS for c in secret.value):
        r.add(
            "database.password",
            str(secret.reference),
            "holds a character Determined's master cannot carry: it writes the password "
            "unescaped into its postgres://user:password@host URL, where / ? # % and anything "
            "but letters, digits and - . _ ~ ! $ & ' ( ) * + , ; = : @ break it; "
            "generate one with `openssl rand -hex 24`",
        )


def _determined_tag(r: Reader, sources: Sources, determined: Determined) -> None:
    """Determined tags its GitHub releases v<version> from 0.38 on (its release CI runs on tags
    matching v\\d+.\\d+.\\d+; 0.37 and earlier were bare): a bare {version} tag is a 404."""
    version = determined.version
    if version is None or tuple(int(p) for p in version.split(".")[:2]) < (0, 38):
        return
    for kind in ARTIFACT_KINDS:
        artifact = getattr(sources, f"determined_{kind}", None)
        url = getattr(artifact, "url", None) or ""
        if url.startswith("https://github.com/determined-ai/") and "/releases/download/{version}/" in url:
            r.bad(
                f"sources.determined_{kind}.url",
                url,
                f"Determined {version} is tagged v{version}: write /releases/download/v{{version}}/",
            )


def _determined(r: Reader, top: Map, versions: Versions, master_host: str | None) -> Determined:
    m = open_section(top, Cluster, "determined")
    values = read(m, Determined)
    tls_map = open_section(m, Determined, "tls")
    values["tls"] = master_tls.DeterminedTls(**read(tls_map, master_tls.DeterminedTls))
    master_tls.check_tls(r, m, values["tls"], master_host)
    image_values = read(open_section(m, Determined, "task_image"), TaskImage)
    for name, ref in image_values.items():
        why = images.too_new(ref, versions.nvidia_driver) if ref and versions.nvidia_driver else None
        if why is not None:
            r.bad(f"determined.task_image.{name}", ref, why)
    values["task_image"] = TaskImage(**image_values)
    admin = values["admin_password"]
    if admin is not None and admin.resolved:
        missing = _password_policy(admin.value)
        if missing:
            r.add(
                "determined.admin_password",
                str(admin.reference),
                "the password does not meet Determined's policy: it needs " + _and(missing),
            )
    return Determined(**values)


def _nodes(
    r: Reader,
    top: Map,
    network: Network,
    master_host: str | None,
    storage_host: str | None,
    determined: Determined,
    roleless: list[tuple[str, object]],
    cluster_hw: Hardware,
) -> tuple[Node, ...] | None:
    # Long: the rules across the node list in one pass, so each problem names the node's index
    # (names, addresses in their subnets, roles, per-node keys)
    raw = top.raw("nodes")
    if raw is MISSING or raw is None:
        if not top.broken:
            spec = specs(Cluster)["nodes"]
            assert isinstance(spec, ListKey)
            r.bad("nodes", raw, f"required: {spec.required}")
        return None
    if not isinstance(raw, list) or not raw:
        r.bad("nodes", raw, "must be a non-empty list of nodes")
        return None

    management, ipoib = network.management, network.ipoib.subnet
    nodes: list[Node] = []
    seen_names: dict[str, str] = {}
    seen_addresses: dict[ipaddress.IPv4Address, str] = {}
    for i, item in enumerate(raw):
        m = r.mapping(item, f"nodes[{i}]", allowed(Node))
        if m.broken:
            continue
        v = read(m, Node)
        hostname, address, ipoib_address, declared = (
            v["hostname"],
            v["address"],
            v["ipoib_address"],
            v["roles"],
        )

        if hostname is not None:
            if hostname.lower() in seen_names:
                r.bad(
                    m.key("hostname"),
                    hostname,
                    f"duplicate: {seen_names[hostname.lower()]} has the same hostname",
                )
            seen_names.setdefault(hostname.lower(), m.key("hostname"))
        if address is not None and management is not None:
            _check_in_subnet(r, m.key("address"), address, management, "network.management")
        if ipoib_address is not None:
            if management is not None and ipoib_address in management:
                r.bad(
                    m.key("ipoib_address"),
                    str(ipoib_address),
                    f"is inside network.management ({management}): IPoIB addresses "
                    "belong to network.ipoib.subnet",
                )
            elif ipoib is not None:
                _check_in_subnet(r, m.key("ipoib_address"), ipoib_address, ipoib, "network.ipoib.subnet")
        for key, addr in (("address", address), ("ipoib_address", ipoib_address)):
            if addr is None:
                continue
            if addr in seen_addresses:
                r.bad(m.key(key), str(addr), f"duplicate: {seen_addresses[addr]} has the same address")
            seen_addresses.setdefault(addr, m.key(key))

        roles = set(declared or ())
        for role, owner, owner_key in (
            ("master", master_host, "master_host"),
            ("storage", storage_host, "storage.host"),
        ):
            if hostname is not None and hostname == owner:
                roles.add(role)
            elif role in roles and owner is not None and hostname is not None:
                r.bad(
                    m.key("roles"),
                    list(declared),
                    f"lists {role}, but {owner_key} is {owner!r}: only that node has the {role} role",
                )
        if declared is not None and not roles and hostname is not None:
            roleless.append((m.key("roles"), m.raw("roles")))
        is_agent = "agent" in roles
        slots, layout = v["slots"], v["agent_layout"]
        if not is_agent and declared is not None:
            for key, value in (("slots", slots), ("agent_layout", layout), ("hardware", v["hardware"])):
                if value is not None:
                    r.bad(m.key(key), value, "only agents have this: add agent to roles or remove it")
        if is_agent:
            v["slots"] = default(Node, "slots") if slots is None else slots
            v["agent_layout"] = determined.agent_layout if layout is None else layout
        else:
            v["slots"] = v["agent_layout"] = None
        if v["ipoib_interface"] is None:
            v["ipoib_interface"] = network.ipoib.interface
        v["roles"] = tuple(role for role in ROLES if role in roles)
        v["hardware"] = _resolve(v["hardware"], cluster_hw) if is_agent else None
        nodes.append(Node(**v))
    return tuple(nodes)


def _check_in_subnet(
    r: Reader, path: str, addr: ipaddress.IPv4Address, subnet: ipaddress.IPv4Network, subnet_key: str
) -> None:
    if addr not in subnet:
        r.bad(path, str(addr), f"not in {subnet_key} ({subnet})")
    elif subnet.prefixlen < 31 and addr in (subnet.network_address, subnet.broadcast_address):
        which = "network" if addr == subnet.network_address else "broadcast"
        r.bad(path, str(addr), f"is the {which} address of {subnet_key} ({subnet})")


def _port_clashes(
    r: Reader,
    ssh: Ssh,
    master_host: str | None,
    master_port: int | None,
    storage_host: str | None,
    storage: Storage,
    database: Database,
) -> None:
    # Services sharing a host must not share a port. The article's cluster hit this: the
    # Determined master's default port, 8080, was already held by another service (Slurm), and
    # the service that starts second fails with only 'Address already in use' in its journal.
    listeners = [
        (master_host, "master_port", master_port),
        (master_host, "database.port", database.port),
        (storage_host, "storage.port", storage.port),
        (storage_host, "storage.console_port", storage.console_port),
    ]
    taken: dict[tuple[str, int], str] = {}
    for host, key, port in listeners:
        if host is None or port is None:
            continue
        other = taken.get((host, port))
        if ssh.port is not None and port == ssh.port:
            r.bad(key, port, f"clashes with ssh.port on {host}")
        elif other is None:
            taken[(host, port)] = key
        elif {other, key} != {"storage.port", "storage.console_port"}:  # reported already
            r.bad(key, port, f"clashes with {other} on {host}: each service needs its own port")


def _resolve(written: dict[str, Any] | None, base: Hardware | None) -> Hardware:
    """The expected hardware: the keys written; then, for a node, the cluster's values unless the
    node names a preset; then the preset's values."""
    values: dict[str, Any] = dataclasses.asdict(base) if base is not None else {}
    written = written or {}
    if base is None or "preset" in written:
        values.update(hardware.PRESETS.get(written.get("preset", hardware.DEFAULT_PRESET), {}))
    values.update(written)
    fields: dict[str, Any] = {f.name: values.get(f.name) for f in dataclasses.fields(Hardware)}
    return Hardware(**fields)
