"""The key table: how a model field says which cluster.yaml key it is read from.

Every key is declared once, on its field in its section's module (deploy/cluster/<section>.py,
see model.py), as `Annotated[type, spec]`:

    port: Annotated[int, Key(checks.port, 9000, "MinIO's S3 API port")]

The field's name is the key, its type is the type after loading, and the spec holds the check
(which also gives the docs their rule text), the default and a one-line description. From
these this module derives the keys allowed in each mapping, the defaults, the reading of a
section, and the rows of the docs' key table (deploy/cluster/docs.py).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from deploy.cluster.checks import Check, version
from deploy.cluster.reader import REQUIRED, Map


@dataclass(frozen=True)
class Required:
    """The default of a key that must be written; `what` completes "required: ..."."""

    what: str = ""


@dataclass(frozen=True)
class Computed:
    """The default of a key the cluster's rules derive when it is not written (deploy/cluster/rules.py).

    `shown` is how the docs show it. Written with no value, the key counts as not written.
    """

    shown: str


@dataclass(frozen=True)
class Key:
    """A key read by a check. default: Required(...), None (optional: unset unless written),
    Computed(...), or the value itself. agents_only: only agents may have it; the default
    applies to agents, other nodes have None."""

    check: Check[Any]
    default: Any
    doc: str
    agents_only: bool = False


@dataclass(frozen=True)
class SecretKey:
    """A secret reference, {env: NAME} or {file: PATH}; `what` names the secret. Required
    unless `optional` (then None when not written)."""

    what: str
    doc: str
    optional: bool = False
    # What the resolved text must look like: a problem line (never showing the text) or None.
    content: Callable[[str], str | None] | None = None


@dataclass(frozen=True)
class Section:
    """A mapping whose keys are the fields of the field's type."""

    required: str = ""  # what the problem says when it is missing; "" makes it optional
    holds_secrets: bool = False  # then a value that is not a mapping is not shown
    doc: str = ""


@dataclass(frozen=True)
class ArtifactKey:
    """`{url, sha256}` of a downloaded file; `placeholders` must appear in the url."""

    what: str
    placeholders: tuple[str, ...]
    doc: str


@dataclass(frozen=True)
class ListKey:
    """A required, non-empty list of mappings (the nodes: deploy/cluster/rules.py reads them)."""

    rule: str
    required: str  # completes "required: ..."
    doc: str


Spec = Key | SecretKey | Section | ArtifactKey | ListKey


@cache
def specs(cls: type) -> dict[str, Spec]:
    """The keys of a mapping, in the documented order: field name -> its spec."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found: dict[str, Spec] = {}
    for f in dataclasses.fields(cls):
        for extra in getattr(hints[f.name], "__metadata__", ()):
            if isinstance(extra, Spec):
                found[f.name] = extra
    return found


def allowed(cls: type) -> tuple[str, ...]:
    return tuple(specs(cls))


@cache
def section_type(cls: type, name: str) -> type:
    """The model class of the section `name` of `cls`: the type its field is annotated with."""
    hint = typing.get_type_hints(cls)[name]
    if not isinstance(hint, type):
        raise TypeError(f"{cls.__name__}.{name} is not a section")
    return hint


def required(cls: type) -> tuple[str, ...]:
    """The keys of a mapping that must be written."""
    return tuple(
        name
        for name, spec in specs(cls).items()
        if isinstance(spec, (ArtifactKey, ListKey))
        or (isinstance(spec, SecretKey) and not spec.optional)
        or (isinstance(spec, Section) and spec.required)
        or (isinstance(spec, Key) and isinstance(spec.default, Required))
    )


def default(cls: type, name: str) -> Any:
    spec = specs(cls)[name]
    if not isinstance(spec, Key) or isinstance(spec.default, (Required, Computed)):
        raise KeyError(f"{cls.__name__}.{name} has no default value")
    return spec.default


def defaults(cls: type) -> dict[str, Any]:
    """The literal defaults of a mapping's keys, like {"nvidia_driver": "515.65.01", ...}."""
    return {
        name: spec.default
        for name, spec in specs(cls).items()
        if isinstance(spec, Key) and not isinstance(spec.default, (Required, Computed))
    }


# --- reading -----------------------------------------------------------------------------------


def open_section(m: Map, cls: type, name: str) -> Map:
    """The sub-map `name` of `m` (a mapping of `cls`), checked against its own keys."""
    spec = specs(cls)[name]
    if not isinstance(spec, Section):
        raise TypeError(f"{cls.__name__}.{name} is not a section")
    inner = section_type(cls, name)
    return m.sub(name, allowed(inner), spec.required, holds_secrets=spec.holds_secrets)


def read(m: Map, cls: type, given_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read the keys and secrets of `cls` from `m` (sections, artifacts and lists are left to
    the caller): name -> checked value, the default, or None after a problem.

    given_defaults: values for Computed defaults that are known by now (like storage.host's
    master_host); such a key then behaves like one with a plain default.
    """
    values: dict[str, Any] = {}
    for name, spec in specs(cls).items():
        if isinstance(spec, SecretKey):
            secret = None if spec.optional and not m.given(name) else m.secret(name, spec.what)
            if spec.content and secret is not None and secret.resolved:
                problem = spec.content(secret.value)
                if problem:
                    m.r.add(m.key(name), str(secret.reference), problem)
                    secret = None
            values[name] = secret
        elif isinstance(spec, Key):
            d = spec.default
            if given_defaults and name in given_defaults:
                d = given_defaults[name]
            if isinstance(d, Required):
                values[name] = m.get(name, spec.check, REQUIRED, what=d.what)
            elif isinstance(d, Computed) or spec.agents_only:
                values[name] = m.get(name, spec.check, None)
            else:
                values[name] = m.get(name, spec.check, d)
    return values


# --- the docs' key table --------------------------------------------------------------------


def shown_default(spec: Spec) -> str:
    if isinstance(spec, SecretKey) and spec.optional:
        return "unset"
    if not isinstance(spec, Key):
        return "required"
    d = spec.default
    if isinstance(d, Required):
        return "required"
    if isinstance(d, Computed):
        return d.shown
    if d is None:
        return "unset"
    if isinstance(d, bool):
        return "`true`" if d else "`false`"
    if isinstance(d, float):
        return f"`{d:g}`"
    if isinstance(d, tuple) and d and all(isinstance(p, tuple) and len(p) == 2 for p in d):
        return "`" + json.dumps({k: list(v) for k, v in d}) + "`"
    if isinstance(d, tuple):
        return "`" + json.dumps(list(d)) + "`"
    return f"`{d}`"


def rows(cls: type, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(key path, type, default, description) of every key of `cls`, sections expanded."""
    for name, spec in specs(cls).items():
        path = f"{prefix}{name}"
        if isinstance(spec, Section):
            yield from rows(section_type(cls, name), path + ".")
        elif isinstance(spec, Key):
            doc = ("agents only; " + spec.doc) if spec.agents_only else spec.doc
            yield path, spec.check.rule, shown_default(spec), doc
        elif isinstance(spec, SecretKey):
            yield path, "secret reference", shown_default(spec), spec.doc
        elif isinstance(spec, ArtifactKey):
            url = ", ".join(f"`{{{p}}}`" for p in spec.placeholders) or "no placeholders"
            yield path, f"`{{url, sha256}}`, url with {url}", shown_default(spec), spec.doc
        else:
            yield path, spec.rule, shown_default(spec), spec.doc


def pinned(value: str, doc: str, pattern: str = r"\d+\.\d+\.\d+", rule: str = "`N.N.N`") -> Key:
    """A version key whose default is also the example in its problems."""
    return Key(version(value, pattern, rule), value, doc)
