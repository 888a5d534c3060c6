"""Load and validate cluster.yaml into a typed, frozen model.

This module is the only place that knows the YAML's shape. `load_cluster(path)` reads the
file, checks everything it can without connecting anywhere, and either returns a `Cluster`
or raises `ClusterError` with every problem found, one line each:

    <file>: <key path>: <value>: <what is wrong>

Secret values never appear in a problem or a repr (see deploy/secrets.py).

    python -m deploy.cluster check FILE...     # "FILE: ok (N nodes)" or the problems, exit 0/2
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import re
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from deploy.secrets import (
    REPO_ROOT,
    Secret,
    SecretError,
    describe,
    parse_reference,
    resolve,
)

ROLES = ("master", "storage", "agent")
AGENT_LAYOUTS = ("per_node", "per_domain")
SLOT_TYPES = ("auto", "cuda", "gpu", "rocm", "cpu", "none")
REBOOT_POLICIES = ("auto", "never")
ARTIFACT_KINDS = ("master", "agent")

# Defaults: the article's "golden combination" (see docs/cluster-yaml.md).
DEFAULT_MASTER_PORT = 23457
DEFAULT_ALLOWED_OS = {
    "Ubuntu 20.04": ("5.4.0-100-generic",),
    "Ubuntu 22.04": ("5.15.0-100-generic",),
}
DEFAULT_VERSIONS = {
    "nvidia_driver": "515.65.01",
    "cuda": "11.7.1",
    "nccl": "2.14.3",
    "mofed": "5.8-3.0.7.0",
}
DEFAULT_CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/"
DEFAULT_DETERMINED_VERSION = "0.38.0"
DEFAULT_SLOTS = 8


class ClusterError(Exception):
    """cluster.yaml is unusable; `.problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class Ssh:
    user: str
    port: int
    key_file: str | None
    strict_host_key_checking: bool
    known_hosts_file: str | None


@dataclass(frozen=True)
class IpoibNetwork:
    interface: str
    subnet: ipaddress.IPv4Network
    mtu: int


@dataclass(frozen=True)
class Network:
    management: ipaddress.IPv4Network
    ipoib: IpoibNetwork


@dataclass(frozen=True)
class Preflight:
    # ("Ubuntu 20.04", ("5.4.0-100-generic",)) pairs: a tuple keeps the model immutable.
    allowed_os: tuple[tuple[str, tuple[str, ...]], ...]
    min_free_disk_gb: float
    disk_path: str

    def kernel_patterns(self, os_name: str) -> tuple[str, ...]:
        """fnmatch patterns allowed for "<Distribution> <version>"; () if the OS is not allowed."""
        return dict(self.allowed_os).get(os_name, ())

    def allows(self, os_name: str, kernel: str) -> bool:
        return any(fnmatch.fnmatchcase(kernel, p) for p in self.kernel_patterns(os_name))


@dataclass(frozen=True)
class Versions:
    nvidia_driver: str
    cuda: str
    nccl: str
    mofed: str

    @property
    def driver_branch(self) -> str:
        """ "515" for 515.65.01: NVIDIA's package names carry the branch."""
        return self.nvidia_driver.split(".")[0]

    @property
    def cuda_major_minor(self) -> str:
        """ "11.7" for 11.7.1 (cuda-toolkit-11-7 uses it with a dash)."""
        return ".".join(self.cuda.split(".")[:2])


@dataclass(frozen=True)
class Artifact:
    url: str  # may hold {version} / {distro} placeholders
    sha256: str


@dataclass(frozen=True)
class Sources:
    apt_proxy: str | None
    cuda_repo: str
    mofed_tarball: Artifact
    minio: Artifact
    determined_master: Artifact
    determined_agent: Artifact

    def cuda_repo_for(self, os_id: str, os_version: str) -> str:
        """NVIDIA names its repos ubuntu2004, ubuntu2204, debian12."""
        return self.cuda_repo.format(distro=os_id.lower() + os_version.replace(".", ""))

    def mofed_url_for(self, os_id: str, os_version: str, mofed_version: str) -> str:
        """MLNX_OFED tarballs are named per distro as ubuntu20.04, ubuntu22.04, debian12."""
        return self.mofed_tarball.url.format(version=mofed_version, distro=os_id.lower() + os_version)

    def determined_url(self, kind: str, version: str) -> str:
        if kind not in ARTIFACT_KINDS:
            raise ValueError(f"kind must be one of {ARTIFACT_KINDS}, not {kind!r}")
        artifact = self.determined_master if kind == "master" else self.determined_agent
        return artifact.url.format(version=version)


@dataclass(frozen=True)
class Storage:
    host: str
    bucket: str
    region: str
    port: int
    console_port: int
    data_dir: str
    endpoint_url: str
    prefix: str | None
    access_key: Secret
    secret_key: Secret


@dataclass(frozen=True)
class Database:
    name: str
    user: str
    port: int
    password: Secret


@dataclass(frozen=True)
class Determined:
    version: str
    admin_password: Secret
    agent_layout: str
    resource_pool: str
    slot_type: str


@dataclass(frozen=True)
class Node:
    hostname: str
    address: ipaddress.IPv4Address
    ipoib_address: ipaddress.IPv4Address
    roles: tuple[str, ...]  # effective roles, in ROLES order
    slots: int | None  # agents only
    agent_layout: str | None  # effective layout, agents only

    def has(self, role: str) -> bool:
        return role in self.roles

    def to_json(self) -> dict:
        return {
            "hostname": self.hostname,
            "address": str(self.address),
            "ipoib_address": str(self.ipoib_address),
            "roles": list(self.roles),
            "slots": self.slots,
            "agent_layout": self.agent_layout,
        }


@dataclass(frozen=True)
class Cluster:
    path: Path
    master_host: str
    master_port: int
    ssh: Ssh
    network: Network
    preflight: Preflight
    nodes: tuple[Node, ...]
    versions: Versions
    sources: Sources
    storage: Storage
    database: Database
    determined: Determined
    reboot: str

    def node(self, hostname: str) -> Node:
        for n in self.nodes:
            if n.hostname == hostname:
                return n
        raise KeyError(f"{hostname!r} is not a node of {self.path}")

    def nodes_with(self, role: str) -> tuple[Node, ...]:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        return tuple(n for n in self.nodes if n.has(role))

    @property
    def master_node(self) -> Node:
        return self.node(self.master_host)

    @property
    def storage_node(self) -> Node:
        return self.node(self.storage.host)

    @property
    def agents(self) -> tuple[Node, ...]:
        return self.nodes_with("agent")

    def to_json(self) -> dict:
        # pyinfra's JSON output (debug-inventory, --json) calls this; keep it short.
        return {
            "file": str(self.path),
            "master_host": self.master_host,
            "nodes": [n.hostname for n in self.nodes],
        }


# ---------------------------------------------------------------------------------------------
# Loading


def load_cluster(path: str | Path, *, resolve_secrets: bool = True) -> Cluster:
    """Read and validate cluster.yaml. Raises ClusterError listing every problem.

    resolve_secrets=False keeps secret references unresolved (`.value` then raises): for
    tools that only need the references, such as deploy.article.
    """
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ClusterError([f"{shown}: cannot read the file: {e.strerror}"]) from None
    except UnicodeDecodeError:
        raise ClusterError([f"{shown}: cannot read the file: it is not UTF-8 text"]) from None

    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ClusterError([_yaml_problem(shown, e)]) from None

    reader = _Reader(shown, resolve_secrets)
    if document is not None:
        _index_document(reader, document, "")
    cluster = _build(reader, raw, Path(path))
    if reader.problems:
        raise ClusterError(reader.in_file_order())
    return cluster


def _yaml_problem(shown: str, e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is None:
        return f"{shown}: YAML syntax error: {what}"
    return f"{shown}:{mark.line + 1}: YAML syntax error: {what} (column {mark.column + 1})"


def _index_document(reader: _Reader, node: yaml.Node, path: str) -> None:
    """Note the line of every key (to print problems in file order) and flag duplicate keys.

    PyYAML silently keeps the last of two equal keys: an operator would edit one and see
    the other take effect.
    """
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
            child = _join(path, key)
            line = key_node.start_mark.line + 1
            if child in reader.lines and key != "<<":
                reader.add(
                    child,
                    "...",
                    f"duplicate key (lines {reader.lines[child]} and "
                    f"{line}): YAML would keep only the last one",
                )
            reader.lines.setdefault(child, line)
            _index_document(reader, value_node, child)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            reader.lines.setdefault(_join(path, i), item.start_mark.line + 1)
            _index_document(reader, item, _join(path, i))


_MISSING = object()
_REQUIRED = object()
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _join(path: str, key: object) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    if isinstance(key, str) and _IDENTIFIER.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]" if path else repr(key)


def _show(value: object) -> str:
    if value is _MISSING:
        return "(missing)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _did_you_mean(word: object, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Reader:
    """Collects problems while the model is built; each check reports and returns None."""

    def __init__(self, shown_path: str, resolve_secrets: bool):
        self.file = shown_path
        self.resolve_secrets = resolve_secrets
        self.problems: list[str] = []
        self.keys: list[str] = []
        self.lines: dict[str, int] = {}  # key path -> line in the file

    def add(self, key: str, shown: str, message: str) -> None:
        self.problems.append(f"{self.file}: {key or '(top level)'}: {shown}: {message}")
        self.keys.append(key)

    def in_file_order(self) -> list[str]:
        """Problems sorted by the line of their key (or of its closest written parent);
        problems about missing top-level keys come first, in the documented key order."""

        def rank(item: tuple[int, str]) -> tuple[int, int, int]:
            index, key = item
            probe = key
            while probe and probe not in self.lines:
                parent = re.sub(r"(\.[^.\[]+|\[[^\]]*\])$", "", probe)
                probe = "" if parent == probe else parent
            top = re.split(r"[.\[]", key)[0]
            top_rank = _TOP_KEYS.index(top) if top in _TOP_KEYS else len(_TOP_KEYS)
            return (self.lines.get(probe, 0), top_rank, index)

        order = sorted(enumerate(self.keys), key=rank)
        return list(dict.fromkeys(self.problems[i] for i, _ in order))

    def bad(self, key: str, value: object, message: str) -> None:
        self.add(key, _show(value), message)

    def mapping(
        self,
        raw: object,
        path: str,
        allowed: tuple[str, ...],
        required: str = "",
        holds_secrets: bool = False,
    ) -> _Map:
        return _Map(self, raw, path, allowed, required, holds_secrets=holds_secrets)


class _Map:
    """One mapping of the file: unknown keys reported once, fields read with checks.

    A map that is missing (when required) or is not a mapping is reported once and marked
    broken; its fields and sub-maps then stay silent instead of repeating the problem.
    """

    def __init__(
        self,
        reader: _Reader,
        raw: object,
        path: str,
        allowed: tuple[str, ...],
        required: str = "",
        parent: _Map | None = None,
        holds_secrets: bool = False,
    ):
        self.r = reader
        self.path = path
        self.data: dict = {}
        quiet = parent is not None and parent.broken
        self.broken = quiet
        if raw is _MISSING or raw is None:
            if required:
                if not quiet:
                    reader.bad(path, raw, f"required: {required}")
                self.broken = True
        elif not isinstance(raw, dict):
            if not quiet:
                # `database: hunter2` must not be echoed back.
                shown = describe(raw) if holds_secrets else _show(raw)
                reader.add(path, shown, f"must be a mapping with keys {', '.join(allowed)}")
            self.broken = True
        else:
            self.data = raw
            for key in raw:
                if key not in allowed:
                    hint = _did_you_mean(key, list(allowed)) or f"; allowed here: {', '.join(allowed)}"
                    # Never show the value: a mistyped `pasword:` would hold a secret.
                    shown_key = key if isinstance(key, str) else repr(key)
                    reader.add(_join(path, shown_key), "...", f"unknown key{hint}")

    def sub(
        self, key: str, allowed: tuple[str, ...], required: str = "", holds_secrets: bool = False
    ) -> _Map:
        return _Map(
            self.r, self.raw(key), self.key(key), allowed, required, parent=self, holds_secrets=holds_secrets
        )

    def key(self, key: str) -> str:
        return _join(self.path, key)

    def raw(self, key: str) -> object:
        return self.data.get(key, _MISSING)

    def get(
        self, key: str, check: Callable[[_Reader, str, Any], Any], default: Any = _REQUIRED, what: str = ""
    ) -> Any:
        value = self.raw(key)
        path = self.key(key)
        required = f"required: {what}" if what else "required"
        if value is _MISSING:
            if default is _REQUIRED:
                if not self.broken:
                    self.r.bad(path, value, required)
                return None
            return default
        if value is None:
            if default is None:  # an optional key written with no value
                return None
            if default is _REQUIRED:
                self.r.bad(path, value, required)
                return None
            # `port:` with nothing after it, where a default exists: let the check say why.
        return check(self.r, path, value)

    def secret(self, key: str, what: str) -> Secret | None:
        raw = self.raw(key)
        path = self.key(key)
        if raw is _MISSING or raw is None:
            if not self.broken:
                self.r.add(
                    path,
                    describe(raw) if raw is None else "(missing)",
                    f"required: {what}, as {{env: NAME}} or {{file: PATH}}",
                )
            return None
        try:
            ref = parse_reference(raw)
        except SecretError as e:
            self.r.add(path, describe(raw), str(e))
            return None
        if not self.r.resolve_secrets:
            return Secret(ref, None)
        try:
            return Secret(ref, resolve(ref, REPO_ROOT))
        except SecretError as e:
            self.r.add(path, str(ref), str(e))
            return None


# --- field checks: (reader, key path, value) -> typed value, or None after reporting --------


def _int(lo: int, hi: int | None = None) -> Callable:
    def check(r: _Reader, path: str, v: Any) -> int | None:
        if isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi):
            return v
        span = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
        r.bad(path, v, f"must be an integer {span}")
        return None

    return check


_port = _int(1, 65535)


def _number_at_least(lo: float) -> Callable:
    def check(r: _Reader, path: str, v: Any) -> float | None:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= lo:
            return float(v)
        r.bad(path, v, f"must be a number of at least {lo:g}")
        return None

    return check


def _bool(r: _Reader, path: str, v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    r.bad(path, v, "must be true or false")
    return None


def _choice(options: tuple[str, ...]) -> Callable:
    def check(r: _Reader, path: str, v: Any) -> str | None:
        if isinstance(v, str) and v in options:
            return v
        hint = _did_you_mean(v, list(options)) if isinstance(v, str) else ""
        if isinstance(v, bool):
            # YAML 1.1 reads unquoted yes/no/on/off as booleans.
            hint = " (YAML reads unquoted yes/no/on/off as true/false)"
        r.bad(path, v, f"must be one of {', '.join(options)}{hint}")
        return None

    return check


def _matching(pattern: str, description: str) -> Callable:
    regex = re.compile(pattern)

    def check(r: _Reader, path: str, v: Any) -> str | None:
        if isinstance(v, str) and regex.fullmatch(v):
            return v
        r.bad(path, v, f"must be {description}")
        return None

    return check


def _version(example: str, pattern: str = r"\d+\.\d+\.\d+") -> Callable:
    regex = re.compile(pattern)

    def check(r: _Reader, path: str, v: Any) -> str | None:
        if isinstance(v, str) and regex.fullmatch(v):
            return v
        hint = " (quote it: YAML read it as a number)" if isinstance(v, (int, float)) else ""
        r.bad(path, v, f"must be a version like {example!r}{hint}")
        return None

    return check


def _text(r: _Reader, path: str, v: Any) -> str | None:
    if isinstance(v, str) and v.strip() and v == v.strip():
        return v
    r.bad(path, v, "must be a non-empty string without surrounding spaces")
    return None


def _abs_path(r: _Reader, path: str, v: Any) -> str | None:
    if isinstance(v, str) and v.startswith("/"):
        return v
    r.bad(path, v, "must be an absolute path")
    return None


def _cidr(r: _Reader, path: str, v: Any) -> ipaddress.IPv4Network | None:
    if not isinstance(v, str) or "/" not in v:
        r.bad(path, v, "must be an IPv4 network in CIDR form, like '10.0.0.0/24'")
        return None
    try:
        return ipaddress.IPv4Network(v)
    except ipaddress.NetmaskValueError:
        r.bad(path, v, "must be an IPv4 network in CIDR form, like '10.0.0.0/24'")
    except ValueError:
        try:
            fixed = ipaddress.IPv4Network(v, strict=False)
            r.bad(path, v, f"has host bits set (did you mean {str(fixed)!r}?)")
        except ValueError:
            r.bad(path, v, "must be an IPv4 network in CIDR form, like '10.0.0.0/24'")
    return None


def _ipv4(r: _Reader, path: str, v: Any) -> ipaddress.IPv4Address | None:
    try:
        if isinstance(v, str):
            return ipaddress.IPv4Address(v)
    except ValueError:
        pass
    r.bad(path, v, "must be an IPv4 address, like '10.0.0.5'")
    return None


_FORMATTER = string.Formatter()


def _url(
    schemes: tuple[str, ...],
    *,
    placeholders: tuple[str, ...] = (),
    trailing_slash: bool | None = None,
    path_allowed: bool = True,
) -> Callable:
    """A URL (template). placeholders: the {names} it must contain, and the only ones allowed."""

    def check(r: _Reader, path: str, v: Any) -> str | None:
        scheme_text = " or ".join(f"{s}://" for s in schemes)
        if not isinstance(v, str):
            r.bad(path, v, f"must be a {scheme_text} URL")
            return None
        try:
            names = [name for _, name, _, _ in _FORMATTER.parse(v) if name is not None]
        except ValueError:
            r.bad(path, v, "unbalanced { } in the URL template")
            return None
        unknown = [n for n in names if n not in placeholders]
        missing = [p for p in placeholders if p not in names]
        parts = urlsplit(v)
        if parts.scheme not in schemes or not parts.netloc:
            r.bad(path, v, f"must be a {scheme_text} URL")
        elif unknown:
            allowed = ", ".join("{" + p + "}" for p in placeholders) or "none"
            r.bad(path, v, f"unknown placeholder {{{unknown[0]}}} (allowed: {allowed})")
        elif missing:
            r.bad(path, v, f"must contain {{{missing[0]}}}")
        elif trailing_slash is True and not v.endswith("/"):
            r.bad(path, v, "must end with '/'")
        elif trailing_slash is False and v.endswith("/"):
            r.bad(path, v, "must not end with '/'")
        elif not path_allowed and parts.path:
            r.bad(path, v, "must be scheme://host:port with no path")
        else:
            return v
        return None

    return check


def _sha256(m: _Map, key: str, artifact: str) -> str | None:
    v = m.raw(key)
    path = m.key(key)
    if v is _MISSING or v is None:
        if not m.broken:
            m.r.bad(path, v, f"not pinned: write the sha256 of the {artifact} here (`sha256sum FILE`)")
        return None
    if isinstance(v, str) and re.fullmatch(r"[0-9a-fA-F]{64}", v):
        return v.lower()
    m.r.bad(path, v, "must be 64 hexadecimal characters (the output of `sha256sum FILE`)")
    return None


_HOSTNAME = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_hostname = _matching(
    _HOSTNAME, "a hostname (RFC 1123 label: letters, digits and '-', 1-63 characters, no '-' at either end)"
)


def _bucket_problem(name: str) -> str | None:
    """S3 bucket naming rules (AWS's, which MinIO enforces too)."""
    if not 3 <= len(name) <= 63:
        return "must be 3 to 63 characters long"
    if not re.fullmatch(r"[a-z0-9.-]+", name):
        return "may hold only lower-case letters, digits, '.' and '-'"
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "must start and end with a letter or a digit"
    if ".." in name or ".-" in name or "-." in name:
        return "must not have '..', '.-' or '-.'"
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return "must not look like an IP address"
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        return "uses a prefix or suffix S3 reserves (xn--, sthree-, -s3alias, --ol-s3)"
    return None


def _bucket(r: _Reader, path: str, v: Any) -> str | None:
    if not isinstance(v, str):
        r.bad(path, v, "must be an S3 bucket name")
        return None
    why = _bucket_problem(v)
    if why:
        r.bad(path, v, f"not a valid S3 bucket name: {why}")
        return None
    return v


def _allowed_os(r: _Reader, path: str, v: Any) -> tuple | None:
    if not isinstance(v, dict) or not v:
        r.bad(
            path,
            v,
            "must map '<Distribution> <version>' to kernel patterns, "
            "like {'Ubuntu 20.04': ['5.4.0-100-generic']}",
        )
        return None
    pairs = []
    ok = True
    for name, patterns in v.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]* \d+(\.\d+)*", name):
            r.bad(path, name, "keys must read '<Distribution> <version>', like 'Ubuntu 20.04'")
            ok = False
            continue
        if (
            not isinstance(patterns, list)
            or not patterns
            or not all(isinstance(p, str) and p for p in patterns)
        ):
            r.bad(
                _join(path, name),
                patterns,
                "must be a non-empty list of kernel patterns, like ['5.4.0-100-generic']",
            )
            ok = False
            continue
        pairs.append((name, tuple(patterns)))
    return tuple(pairs) if ok else None


# --- the sections ----------------------------------------------------------------------------

_TOP_KEYS = (
    "master_host",
    "master_port",
    "ssh",
    "network",
    "preflight",
    "nodes",
    "versions",
    "sources",
    "storage",
    "database",
    "determined",
    "reboot",
)


def _build(r: _Reader, raw: object, path: Path) -> Cluster | None:
    if raw is None:
        r.add(
            "",
            "None",
            "the file is empty: expected a mapping with master_host, network, "
            "nodes, sources, storage, database, determined",
        )
        return None
    if not isinstance(raw, dict):
        r.add("", describe(raw), "the top level must be a mapping of keys (master_host, nodes, ...)")
        return None
    top = r.mapping(raw, "", _TOP_KEYS)

    master_host = top.get("master_host", _hostname, what="the hostname of the master node")
    master_port = top.get("master_port", _port, DEFAULT_MASTER_PORT)
    ssh = _ssh(r, top.raw("ssh"))
    network = _network(r, top.raw("network"))
    preflight = _preflight(r, top.raw("preflight"))
    versions = _versions(r, top.raw("versions"))
    sources = _sources(r, top.raw("sources"))
    storage_map = top.sub(
        "storage",
        _STORAGE_KEYS,
        required="bucket, access_key and secret_key of the checkpoint store",
        holds_secrets=True,
    )
    storage_host = storage_map.get("host", _hostname, master_host)
    determined = _determined(r, top.raw("determined"))
    roleless: list[tuple[str, object]] = []
    nodes = _nodes(r, top, network, master_host, storage_host, determined, roleless)
    storage = _storage(r, storage_map, storage_host)
    database = _database(r, top.raw("database"))
    reboot = top.get("reboot", _choice(REBOOT_POLICIES), "auto")

    hostnames = [n.hostname for n in nodes or ()]
    # Only when every node parsed: a node with a broken hostname would make this a false alarm.
    if nodes is not None and None not in hostnames and len(hostnames) == len(top.raw("nodes")):
        for key, name in (("master_host", master_host), ("storage.host", storage_host)):
            if key == "storage.host" and storage_map.raw("host") is _MISSING:
                continue  # the default, master_host: already reported if wrong
            if name is not None and name not in hostnames:
                r.bad(key, name, "not the hostname of a node under nodes" + _did_you_mean(name, hostnames))
        if master_host in hostnames and storage_host in hostnames:
            # Otherwise a node's missing role is only a consequence of the wrong name.
            for key, raw_roles in roleless:
                r.bad(
                    key,
                    raw_roles,
                    "the node has no role: list agent, or name it in master_host or storage.host",
                )
    _port_clashes(r, ssh, master_host, master_port, storage_host, storage, database)

    if r.problems:
        return None
    return Cluster(
        path=path,
        master_host=master_host,
        master_port=master_port,
        ssh=ssh,
        network=network,
        preflight=preflight,
        nodes=nodes,
        versions=versions,
        sources=sources,
        storage=storage,
        database=database,
        determined=determined,
        reboot=reboot,
    )


def _ssh(r: _Reader, raw: object) -> Ssh:
    m = r.mapping(raw, "ssh", ("user", "port", "key_file", "strict_host_key_checking", "known_hosts_file"))
    return Ssh(
        user=m.get("user", _matching(r"[a-z_][a-z0-9_.-]*", "a user name"), "root"),
        port=m.get("port", _port, 22),
        key_file=m.get("key_file", _text, None),
        strict_host_key_checking=m.get("strict_host_key_checking", _bool, True),
        known_hosts_file=m.get("known_hosts_file", _text, None),
    )


def _network(r: _Reader, raw: object) -> Network:
    m = r.mapping(raw, "network", ("management", "ipoib"), required="the management and IPoIB subnets")
    management = m.get("management", _cidr, what="the management subnet, like '10.0.0.0/24'")
    ib = m.sub("ipoib", ("interface", "subnet", "mtu"), required="at least its subnet")
    subnet = ib.get("subnet", _cidr, what="the IPoIB subnet, like '10.10.0.0/24'")
    if management is not None and subnet is not None and subnet.overlaps(management):
        r.bad(
            "network.ipoib.subnet",
            str(subnet),
            f"overlaps network.management ({management}): IPoIB needs a subnet of its own",
        )
        subnet = None
    interface = _matching(r"[A-Za-z0-9_.-]{1,15}", "a network interface name (1-15 characters)")
    ipoib = IpoibNetwork(
        interface=ib.get("interface", interface, "ib0"),
        subnet=subnet,
        mtu=ib.get("mtu", _int(576, 65520), 2044),
    )
    return Network(management=management, ipoib=ipoib)


def _preflight(r: _Reader, raw: object) -> Preflight:
    m = r.mapping(raw, "preflight", ("allowed_os", "min_free_disk_gb", "disk_path"))
    default_os = tuple(DEFAULT_ALLOWED_OS.items())
    return Preflight(
        allowed_os=m.get("allowed_os", _allowed_os, default_os),
        min_free_disk_gb=m.get("min_free_disk_gb", _number_at_least(0), 50.0),
        disk_path=m.get("disk_path", _abs_path, "/"),
    )


def _versions(r: _Reader, raw: object) -> Versions:
    m = r.mapping(raw, "versions", tuple(DEFAULT_VERSIONS))
    return Versions(
        nvidia_driver=m.get("nvidia_driver", _version("515.65.01"), DEFAULT_VERSIONS["nvidia_driver"]),
        cuda=m.get("cuda", _version("11.7.1"), DEFAULT_VERSIONS["cuda"]),
        nccl=m.get("nccl", _version("2.14.3"), DEFAULT_VERSIONS["nccl"]),
        mofed=m.get("mofed", _version("5.8-3.0.7.0", r"\d+\.\d+-[\d.]+"), DEFAULT_VERSIONS["mofed"]),
    )


# artifact key -> (what the file is, required placeholders)
_ARTIFACTS = {
    "mofed_tarball": ("MLNX_OFED tarball", ("version", "distro")),
    "minio": ("MinIO server binary", ()),
    "determined_master": ("determined-master package", ("version",)),
    "determined_agent": ("determined-agent package", ("version",)),
}


def _sources(r: _Reader, raw: object) -> Sources:
    m = r.mapping(
        raw,
        "sources",
        ("apt_proxy", "cuda_repo", *_ARTIFACTS),
        required="where the MLNX_OFED, MinIO and Determined files come from, each pinned by sha256",
    )
    artifacts = {}
    for key, (what, placeholders) in _ARTIFACTS.items():
        a = m.sub(key, ("url", "sha256"), required=f"{{url, sha256}} of the {what}")
        url = a.get(
            "url", _url(("http", "https"), placeholders=placeholders), what=f"where to download the {what}"
        )
        artifacts[key] = Artifact(url=url, sha256=_sha256(a, "sha256", what))
    return Sources(
        apt_proxy=m.get("apt_proxy", _url(("http",)), None),
        cuda_repo=m.get(
            "cuda_repo",
            _url(("http", "https"), placeholders=("distro",), trailing_slash=True),
            DEFAULT_CUDA_REPO,
        ),
        **artifacts,
    )


_STORAGE_KEYS = (
    "host",
    "bucket",
    "region",
    "port",
    "console_port",
    "data_dir",
    "endpoint_url",
    "prefix",
    "access_key",
    "secret_key",
)


def _storage(r: _Reader, m: _Map, host: str | None) -> Storage:
    port = m.get("port", _port, 9000)
    console_port = m.get("console_port", _port, 9001)
    if port is not None and port == console_port:
        r.bad("storage.console_port", console_port, "must differ from storage.port")
    endpoint = m.get("endpoint_url", _url(("http", "https"), trailing_slash=False, path_allowed=False), None)
    if m.raw("endpoint_url") in (_MISSING, None) and host is not None and port is not None:
        endpoint = f"http://{host}:{port}"
    data_dir = m.get("data_dir", _abs_path, "/mnt/data")
    if data_dir is not None and data_dir.rstrip("/") == "":
        r.bad("storage.data_dir", data_dir, "must not be the root directory")
    access_key = m.secret("access_key", "MinIO's root user (S3 access key)")
    secret_key = m.secret("secret_key", "MinIO's root password (S3 secret key)")
    # MinIO refuses to start with a root user under 3 or a password under 8 characters.
    if access_key is not None and access_key.resolved and len(access_key.value) < 3:
        r.add(
            "storage.access_key",
            str(access_key.reference),
            "too short: MinIO needs an access key of at least 3 characters",
        )
    if secret_key is not None and secret_key.resolved and len(secret_key.value) < 8:
        r.add(
            "storage.secret_key",
            str(secret_key.reference),
            "too short: MinIO needs a secret key of at least 8 characters",
        )
    return Storage(
        host=host,
        bucket=m.get("bucket", _bucket, what="the S3 bucket for checkpoints"),
        region=m.get(
            "region",
            _matching(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", "a region name like 'us-east-1'"),
            "us-east-1",
        ),
        port=port,
        console_port=console_port,
        data_dir=data_dir,
        endpoint_url=endpoint,
        prefix=m.get("prefix", _text, None),
        access_key=access_key,
        secret_key=secret_key,
    )


def _database(r: _Reader, raw: object) -> Database:
    m = r.mapping(
        raw,
        "database",
        ("name", "user", "port", "password"),
        required="at least password",
        holds_secrets=True,
    )
    identifier = _matching(r"[A-Za-z_][A-Za-z0-9_]{0,62}", "a PostgreSQL identifier (letters, digits, '_')")
    return Database(
        name=m.get("name", identifier, "determined"),
        user=m.get("user", identifier, "determined"),
        port=m.get("port", _port, 5432),
        password=m.secret("password", "the PostgreSQL password of the Determined user"),
    )


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


def _determined(r: _Reader, raw: object) -> Determined:
    m = r.mapping(
        raw,
        "determined",
        ("version", "admin_password", "agent_layout", "resource_pool", "slot_type"),
        required="at least admin_password",
        holds_secrets=True,
    )
    admin = m.secret("admin_password", "the initial password of Determined's admin user")
    if admin is not None and admin.resolved:
        missing = _password_policy(admin.value)
        if missing:
            r.add(
                "determined.admin_password",
                str(admin.reference),
                "the password does not meet Determined's policy: it needs " + _and(missing),
            )
    return Determined(
        version=m.get("version", _version("0.38.0"), DEFAULT_DETERMINED_VERSION),
        admin_password=admin,
        agent_layout=m.get("agent_layout", _choice(AGENT_LAYOUTS), "per_node"),
        resource_pool=m.get(
            "resource_pool", _matching(r"[A-Za-z0-9][A-Za-z0-9_.-]*", "a resource pool name"), "default"
        ),
        slot_type=m.get("slot_type", _choice(SLOT_TYPES), "cuda"),
    )


def _roles(r: _Reader, path: str, v: Any) -> tuple[str, ...] | None:
    if not isinstance(v, list):
        r.bad(path, v, "must be a list, like [agent]")
        return None
    ok = True
    for i, role in enumerate(v):
        if role not in ROLES:
            hint = _did_you_mean(role, list(ROLES)) if isinstance(role, str) else ""
            r.bad(_join(path, i), role, f"unknown role{hint}: roles are {', '.join(ROLES)}")
            ok = False
        elif v.index(role) != i:
            r.bad(_join(path, i), role, "listed twice")
            ok = False
    return tuple(v) if ok else None


_NODE_KEYS = ("hostname", "address", "ipoib_address", "roles", "slots", "agent_layout")


def _nodes(
    r: _Reader,
    top: _Map,
    network: Network,
    master_host: str | None,
    storage_host: str | None,
    determined: Determined,
    roleless: list[tuple[str, object]],
) -> tuple[Node, ...] | None:
    raw = top.raw("nodes")
    if raw is _MISSING or raw is None:
        if not top.broken:
            r.bad("nodes", raw, "required: the list of nodes")
        return None
    if not isinstance(raw, list) or not raw:
        r.bad("nodes", raw, "must be a non-empty list of nodes")
        return None

    management, ipoib = network.management, network.ipoib.subnet
    nodes: list[Node] = []
    seen_names: dict[str, str] = {}
    seen_addresses: dict[ipaddress.IPv4Address, str] = {}
    for i, item in enumerate(raw):
        base = f"nodes[{i}]"
        m = r.mapping(item, base, _NODE_KEYS)
        if m.broken:
            continue
        hostname = m.get("hostname", _hostname, what="the node's hostname")
        address = m.get("address", _ipv4, what="the node's management address")
        ipoib_address = m.get("ipoib_address", _ipv4, what="the node's IPoIB address")
        declared = m.get("roles", _roles, ())

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
        slots = m.get("slots", _int(1), None)
        layout = m.get("agent_layout", _choice(AGENT_LAYOUTS), None)
        if not is_agent and declared is not None:
            for key, value in (("slots", slots), ("agent_layout", layout)):
                if value is not None:
                    r.bad(m.key(key), value, "only agents have this: add agent to roles or remove it")
        nodes.append(
            Node(
                hostname=hostname,
                address=address,
                ipoib_address=ipoib_address,
                roles=tuple(role for role in ROLES if role in roles),
                slots=(slots or DEFAULT_SLOTS) if is_agent else None,
                agent_layout=(layout or determined.agent_layout) if is_agent else None,
            )
        )
    return tuple(nodes)


def _check_in_subnet(
    r: _Reader, path: str, addr: ipaddress.IPv4Address, subnet: ipaddress.IPv4Network, subnet_key: str
) -> None:
    if addr not in subnet:
        r.bad(path, str(addr), f"not in {subnet_key} ({subnet})")
    elif subnet.prefixlen < 31 and addr in (subnet.network_address, subnet.broadcast_address):
        which = "network" if addr == subnet.network_address else "broadcast"
        r.bad(path, str(addr), f"is the {which} address of {subnet_key} ({subnet})")


def _port_clashes(
    r: _Reader,
    ssh: Ssh,
    master_host: str | None,
    master_port: int | None,
    storage_host: str | None,
    storage: Storage,
    database: Database,
) -> None:
    # Services sharing a host must not share a port (the article's pitfall 5: a clash makes
    # the later service fail with only 'Address already in use' in its journal).
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


# ---------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "check":
        print("usage: python -m deploy.cluster check FILE...", file=sys.stderr)
        return 2
    status = 0
    for file in args[1:]:
        try:
            cluster = load_cluster(file)
        except ClusterError as e:
            for problem in e.problems:
                print(problem, file=sys.stderr)
            status = 2
        else:
            print(f"{file}: ok ({len(cluster.nodes)} nodes)")
    return status


if __name__ == "__main__":
    sys.exit(main())
