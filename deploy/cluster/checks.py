"""Field checks: `check(reader, key path, value)` returns the typed value, or None after reporting.

Each check also carries `rule`, the short text the docs' key table shows as the key's type.
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
import string
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import SplitResult, urlsplit

from deploy.cluster.reader import MISSING, Map, Reader, did_you_mean, join

T = TypeVar("T")


@dataclass(frozen=True)
class Check(Generic[T]):
    rule: str  # what a value must be, as the docs' key table shows it
    fn: Callable[[Reader, str, Any], T | None]

    def __call__(self, r: Reader, path: str, v: Any) -> T | None:
        return self.fn(r, path, v)


def check(rule: str) -> Callable[[Callable[[Reader, str, Any], T | None]], Check[T]]:
    """Decorator: a check function with its rule text."""
    return lambda fn: Check(rule, fn)


def integer(lo: int, hi: int | None = None) -> Check[int]:
    span = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"

    @check(f"integer {lo}..{hi}" if hi is not None else f"integer ≥ {lo}")
    def fn(r: Reader, path: str, v: Any) -> int | None:
        if isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi):
            return v
        r.bad(path, v, f"must be an integer {span}")
        return None

    return fn


port = integer(1, 65535)


def number_at_least(lo: float) -> Check[float]:
    @check(f"number ≥ {lo:g}")
    def fn(r: Reader, path: str, v: Any) -> float | None:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= lo:
            return float(v)
        r.bad(path, v, f"must be a finite number of at least {lo:g}")
        return None

    return fn


@check("`true` or `false`")
def boolean(r: Reader, path: str, v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    r.bad(path, v, "must be true or false")
    return None


def choice(options: tuple[str, ...]) -> Check[str]:
    @check(", ".join(f"`{o}`" for o in options))
    def fn(r: Reader, path: str, v: Any) -> str | None:
        if isinstance(v, str) and v in options:
            return v
        hint = did_you_mean(v, list(options)) if isinstance(v, str) else ""
        r.bad(path, v, f"must be one of {', '.join(options)}{hint}")
        return None

    return fn


def matching(pattern: str, description: str, rule: str = "") -> Check[str]:
    """A string matching `pattern`; `description` completes "must be ..."."""
    regex = re.compile(pattern, re.ASCII)

    @check(rule or description)
    def fn(r: Reader, path: str, v: Any) -> str | None:
        if isinstance(v, str) and regex.fullmatch(v):
            return v
        r.bad(path, v, f"must be {description}")
        return None

    return fn


def version(example: str, pattern: str = r"\d+\.\d+\.\d+", rule: str = "`N.N.N`") -> Check[str]:
    regex = re.compile(pattern, re.ASCII)

    @check(rule)
    def fn(r: Reader, path: str, v: Any) -> str | None:
        if isinstance(v, str) and regex.fullmatch(v):
            return v
        hint = " (quote it: YAML read it as a number)" if isinstance(v, (int, float)) else ""
        r.bad(path, v, f"must be a version like {example!r}{hint}")
        return None

    return fn


def control_character(v: str) -> str | None:
    """The first control character of `v` (line breaks, tabs, escapes, DEL, ...), or None."""
    for c in v:
        if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"):
            return c
    return None


@check("string")
def text(r: Reader, path: str, v: Any) -> str | None:
    if isinstance(v, str) and v.strip() and v == v.strip() and control_character(v) is None:
        return v
    r.bad(path, v, "must be a non-empty string without surrounding spaces or control characters")
    return None


PATH_CHARACTERS = "letters, digits and . _ / + -"
_PATH = re.compile(r"/[A-Za-z0-9._/+-]*", re.ASCII)


@check("absolute path of `A-Za-z0-9._/+-`, no `..`, no `//`")
def abs_path(r: Reader, path: str, v: Any) -> str | None:
    """A path that reaches the nodes' shell commands and systemd units: nothing to quote."""
    if not isinstance(v, str) or not v.startswith("/"):
        r.bad(path, v, "must be an absolute path")
    elif not _PATH.fullmatch(v):
        r.bad(
            path,
            v,
            f"may hold only {PATH_CHARACTERS} (no spaces, quotes or other characters: "
            "it reaches shell commands and systemd units on the nodes)",
        )
    elif "//" in v:
        r.bad(path, v, "must not contain '//'")
    elif any(part in (".", "..") for part in v.split("/")):
        r.bad(path, v, "must not have '.' or '..' components")
    else:
        return v
    return None


_PREFIX = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/?", re.ASCII)


@check("object key prefix of `A-Za-z0-9._/-`")
def key_prefix(r: Reader, path: str, v: Any) -> str | None:
    if isinstance(v, str) and _PREFIX.fullmatch(v) and not any(part in (".", "..") for part in v.split("/")):
        return v
    r.bad(
        path,
        v,
        "must be an object key prefix of letters, digits and . _ - separated by single '/', "
        "like 'team-a/checkpoints' (no leading '/', no '.' or '..' parts)",
    )
    return None


@check("IPv4 CIDR, no host bits (`192.168.1.0/24`)")
def cidr(r: Reader, path: str, v: Any) -> ipaddress.IPv4Network | None:
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


@check("IPv4 address")
def ipv4(r: Reader, path: str, v: Any) -> ipaddress.IPv4Address | None:
    try:
        if isinstance(v, str):
            return ipaddress.IPv4Address(v)
    except ValueError:
        pass
    r.bad(path, v, "must be an IPv4 address, like '10.0.0.5'")
    return None


_FORMATTER = string.Formatter()

URL_CHARACTERS = "letters, digits and - . _ ~ : / ? # [ ] @ ! & ( ) * + , ; = %"
_URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!&()*+,;=%]*", re.ASCII)
_DNS_NAME = re.compile(
    r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?", re.ASCII
)
_USERINFO = re.compile(r"^([^:/?#]*:?//)([^/?#]*)@")


def _character_name(c: str) -> str:
    names = {" ": "a space", "\n": "a line break", "\r": "a carriage return", "\t": "a tab"}
    return names.get(c, repr(c))


def _unsafe_character(v: str) -> str | None:
    """The first whitespace, quote or control character of `v`, or None."""
    for c in v:
        if c.isspace() or c in "'\"`" or control_character(c):
            return c
    return None


def split_url(v: str) -> tuple[SplitResult, str, int | None] | str:
    """(parts, host, port) of a URL whose characters are already checked, or what is wrong.

    urlsplit raises ValueError on a bad IPv6 literal or port ('http://[::1/', 'http://h:x'):
    that becomes the answer here, never a traceback.
    """
    try:
        parts = urlsplit(v)
        host, port = parts.hostname, parts.port
    except ValueError as e:
        return f"not a valid URL: {e}"
    if not host:
        return "has no host"
    if "[" in parts.netloc or "]" in parts.netloc:
        if not re.fullmatch(r"\[[^\[\]]+\](:[0-9]*)?", parts.netloc):
            return "not a valid URL: write an IPv6 host as [address] or [address]:port"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"not a valid IPv6 address in brackets: {host!r}"
    elif not _DNS_NAME.fullmatch(host):
        return f"not a valid host name: {host!r}"
    if parts.netloc.endswith(":"):
        return "has an empty port after ':'"
    if port == 0:
        return "port 0 is not a port"
    return parts, host, port


def url(
    schemes: tuple[str, ...],
    *,
    placeholders: tuple[str, ...] = (),
    trailing_slash: bool | None = None,
    path_allowed: bool = True,
) -> Check[str]:
    """A URL (template). placeholders: the {names} it must contain, and the only ones allowed.

    The URL reaches apt's configuration, sources lists and download commands on the nodes, so
    the string as written is checked: no whitespace, quotes or control characters (urlsplit
    would quietly strip some of them from its own copy), only URL characters, no user:password@.
    """
    # Long: one URL's rules in the order a reader meets them (scheme, login, host, port, path,
    # placeholders), each a problem line of its own; split, each part would parse the URL again
    scheme_text = " or ".join(f"{s}://" for s in schemes)
    rule = " or ".join(f"`{s}://`" for s in schemes) + " URL"
    if not path_allowed:
        rule = "`scheme://host:port`, no path"
    if placeholders:
        rule += " with " + ", ".join(f"`{{{p}}}`" for p in placeholders)
    if trailing_slash is not None:
        rule += ", ending in `/`" if trailing_slash else ", no trailing `/`"
    rule += "; URL characters only, no `user:password@`"

    @check(rule)
    def fn(r: Reader, path: str, v: Any) -> str | None:
        # Long: the body of url() (above)
        if not isinstance(v, str):
            r.bad(path, v, f"must be a {scheme_text} URL")
            return None
        userinfo = _USERINFO.match(v)
        if userinfo:
            # Never echo what might be a password.
            masked = userinfo.group(1) + "***@" + v[userinfo.end() :]
            r.bad(
                path,
                masked,
                "must not hold user:password@: credentials in a URL would land in command lines, "
                "logs and a world-readable (0644) apt file on the nodes",
            )
            return None
        unsafe = _unsafe_character(v)
        if unsafe is not None:
            r.bad(
                path,
                v,
                "must not contain whitespace, quotes or control characters "
                f"(found {_character_name(unsafe)})",
            )
            return None
        try:
            fields = list(_FORMATTER.parse(v))
        except ValueError:
            r.bad(path, v, "unbalanced { } in the URL template")
            return None
        names = [name for _, name, _, _ in fields if name is not None]
        literal = "".join(text for text, _, _, _ in fields)
        unknown = [n for n in names if n not in placeholders]
        missing = [p for p in placeholders if p not in names]
        if not _URL_CHARACTERS.fullmatch(literal):
            bad = next(c for c in literal if not _URL_CHARACTERS.fullmatch(c))
            r.bad(
                path,
                v,
                f"may hold only URL characters ({URL_CHARACTERS}), not {bad!r}: percent-encode it",
            )
            return None
        if unknown:
            allowed = ", ".join("{" + p + "}" for p in placeholders) or "none"
            r.bad(path, v, f"unknown placeholder {{{unknown[0]}}} (allowed: {allowed})")
            return None
        if any(spec or conversion for _, name, spec, conversion in fields if name is not None):
            r.bad(path, v, "placeholders take no format spec or conversion: write {name}")
            return None
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", v)
        if scheme is None or scheme.group(1).lower() not in schemes:
            r.bad(path, v, f"must be a {scheme_text} URL")
            return None
        split = split_url(v.format(**{p: "x" for p in placeholders}))
        if isinstance(split, str):
            r.bad(path, v, split)
            return None
        parts = split[0]
        if parts.scheme not in schemes or not parts.netloc:
            r.bad(path, v, f"must be a {scheme_text} URL")
        elif missing:
            r.bad(path, v, f"must contain {{{missing[0]}}}")
        elif trailing_slash is True and not v.endswith("/"):
            r.bad(path, v, "must end with '/'")
        elif trailing_slash is False and v.endswith("/"):
            r.bad(path, v, "must not end with '/'")
        elif not path_allowed and (parts.path or parts.query or parts.fragment or "?" in v or "#" in v):
            r.bad(path, v, "must be scheme://host:port with no path")
        else:
            return v
        return None

    return fn


def sha256(m: Map, key: str, artifact: str) -> str | None:
    """The pin of a downloaded file: a missing or null one is a problem saying how to pin it."""
    v = m.raw(key)
    path = m.key(key)
    if v is MISSING or v is None:
        if not m.broken:
            m.r.bad(path, v, f"not pinned: write the sha256 of the {artifact} here (`sha256sum FILE`)")
        return None
    if isinstance(v, str) and re.fullmatch(r"[0-9a-fA-F]{64}", v):
        return v.lower()
    m.r.bad(path, v, "must be 64 hexadecimal characters (the output of `sha256sum FILE`)")
    return None


@dataclass(frozen=True)
class PinMap:
    """`{<name>: <sha256>}`: one pin per file of a download that differs per name (an OS's
    repo folder, a distro), with the words its problems use."""

    keys: re.Pattern
    shape: str  # "must map ..."
    key_rule: str  # "keys must be ..."
    unpinned: str  # "not pinned: ..."

    def read(self, r: Reader, path: str, v: Any) -> tuple[tuple[str, str], ...] | None:
        """The pins, or None after a problem (each named by its key)."""
        if not isinstance(v, dict) or not v:
            r.bad(path, v, self.shape)
            return None
        pins = []
        for name, digest in v.items():
            if not isinstance(name, str) or not self.keys.fullmatch(name):
                r.bad(path, name, self.key_rule)
            elif digest is None:
                r.bad(join(path, name), digest, self.unpinned)
            elif not (isinstance(digest, str) and re.fullmatch(r"[0-9a-fA-F]{64}", digest)):
                r.bad(
                    join(path, name),
                    digest,
                    "must be 64 hexadecimal characters (the output of `sha256sum FILE`)",
                )
            else:
                pins.append((name, digest.lower()))
        return tuple(pins) if len(pins) == len(v) else None


MOFED_PINS = PinMap(
    re.compile(r"(ubuntu[0-9]{2}\.[0-9]{2}|debian[0-9]{1,2}|rhel[0-9]\.[0-9]{1,2})", re.ASCII),
    "must map distros to the sha256 of their MLNX_OFED tarball, like {ubuntu22.04: <sha256>}",
    "keys must be distros as the file names them, like ubuntu20.04, ubuntu22.04, debian12",
    "not pinned: write the sha256 of that distro's MLNX_OFED tarball here (`sha256sum FILE`)",
)


def distro_pins(m: Map, key: str) -> tuple[tuple[str, str], ...] | None:
    """MLNX_OFED's pins per distro, `{ubuntu20.04: <sha256>, ...}` (the names its tarballs carry)."""
    return MOFED_PINS.read(m.r, m.key(key), m.raw(key))


NVIDIA_REPO_FOLDER = re.compile(r"(ubuntu|debian|rhel|sles)[0-9]{2,4}", re.ASCII)


KEYRING_PINS = PinMap(
    NVIDIA_REPO_FOLDER,
    "must map repo folders to the sha256 of their cuda-keyring .deb, like {ubuntu2204: <sha256>}",
    "keys must be NVIDIA's repo folder names, like ubuntu2004, ubuntu2204, debian12",
    "not pinned: write the sha256 of that folder's cuda-keyring .deb here (`sha256sum FILE`)",
)


@check("`{<repo folder>: sha256}`, folders like `ubuntu2204`, `debian12`")
def keyring_pins(r: Reader, path: str, v: Any) -> tuple[tuple[str, str], ...] | None:
    """One pin per CUDA repo folder: NVIDIA's cuda-keyring .deb differs per folder (each
    carries its folder's sources list)."""
    return KEYRING_PINS.read(r, path, v)


RESERVED_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "broadcasthost")
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)


def is_address(v: str) -> bool:
    """Whether a resolver would read `v` as an address: '10.0.0.1', '::1', and the forms
    inet_aton still accepts ('12345' is 0.0.48.57, '0x7f000001' is 127.0.0.1)."""
    try:
        ipaddress.ip_address(v)
        return True
    except ValueError:
        pass
    if not re.fullmatch(r"[0-9A-Fa-fxX.]+", v):
        return False
    try:
        socket.inet_aton(v)
        return True
    except OSError:
        return False


@check("hostname (RFC 1123 label), not `localhost` or an address")
def hostname(r: Reader, path: str, v: Any) -> str | None:
    if isinstance(v, str) and v.lower() in RESERVED_NAMES:
        r.bad(
            path,
            v,
            f"a reserved name: every machine resolves it to itself (reserved: {', '.join(RESERVED_NAMES)})",
        )
    elif isinstance(v, str) and is_address(v):
        try:
            ipaddress.ip_address(v)
            what = "an IP address, not a name"
        except ValueError:  # '12345', '0x7f000001': inet_aton and so getaddrinfo accept them
            what = f"resolvers read it as the address {socket.inet_ntoa(socket.inet_aton(v))}"
        r.bad(path, v, f"{what}: give the node a hostname (its address goes under address)")
    elif isinstance(v, str) and _LABEL.fullmatch(v):
        return v
    else:
        r.bad(
            path,
            v,
            "must be a hostname (RFC 1123 label: letters, digits and '-', 1-63 characters, "
            "no '-' at either end)",
        )
    return None


def bucket_problem(name: str) -> str | None:
    """S3 bucket naming rules (AWS's, which MinIO enforces too)."""
    if not 3 <= len(name) <= 63:
        return "must be 3 to 63 characters long"
    if not re.fullmatch(r"[a-z0-9.-]+", name):
        return "may hold only lower-case letters, digits, '.' and '-'"
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "must start and end with a letter or a digit"
    if ".." in name or ".-" in name or "-." in name:
        return "must not have '..', '.-' or '-.'"
    if re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+", name):
        return "must not look like an IP address"
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        return "uses a prefix or suffix S3 reserves (xn--, sthree-, -s3alias, --ol-s3)"
    return None


@check("S3 bucket name (3-63 of `a-z 0-9 . -`, …)")
def bucket(r: Reader, path: str, v: Any) -> str | None:
    if not isinstance(v, str):
        r.bad(path, v, "must be an S3 bucket name")
        return None
    why = bucket_problem(v)
    if why:
        r.bad(path, v, f"not a valid S3 bucket name: {why}")
        return None
    return v


@check('`"<Distribution> <version>"` → non-empty list of fnmatch kernel patterns')
def allowed_os(r: Reader, path: str, v: Any) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
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
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]* [0-9]+(\.[0-9]+)*", name):
            r.bad(path, name, "keys must read '<Distribution> <version>', like 'Ubuntu 20.04'")
            ok = False
            continue
        if (
            not isinstance(patterns, list)
            or not patterns
            or not all(isinstance(p, str) and p for p in patterns)
        ):
            r.bad(
                join(path, name),
                patterns,
                "must be a non-empty list of kernel patterns, like ['5.4.0-100-generic']",
            )
            ok = False
            continue
        pairs.append((name, tuple(patterns)))
    return tuple(pairs) if ok else None


@check("list of fnmatch kernel patterns (`[]`: none)")
def kernel_patterns(r: Reader, path: str, v: Any) -> tuple[str, ...] | None:
    if not isinstance(v, list) or not all(
        isinstance(p, str) and re.fullmatch(r"[A-Za-z0-9._+*?\[\]-]+", p) for p in v
    ):
        r.bad(path, v, "must be a list of kernel builds or patterns, like ['5.15.0-100-generic']")
        return None
    return tuple(v)


def role_list(roles: tuple[str, ...]) -> Check[tuple[str, ...]]:
    @check("list of " + ", ".join(f"`{role}`" for role in roles))
    def fn(r: Reader, path: str, v: Any) -> tuple[str, ...] | None:
        if not isinstance(v, list):
            r.bad(path, v, "must be a list, like [agent]")
            return None
        ok = True
        for i, role in enumerate(v):
            if role not in roles:
                hint = did_you_mean(role, list(roles)) if isinstance(role, str) else ""
                r.bad(join(path, i), role, f"unknown role{hint}: roles are {', '.join(roles)}")
                ok = False
            elif v.index(role) != i:
                r.bad(join(path, i), role, "listed twice")
                ok = False
        return tuple(v) if ok else None

    return fn
