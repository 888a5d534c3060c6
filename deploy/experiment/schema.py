"""Determined's own experiment-config schemas (schemas/*.json, see schemas/SOURCE.md), checked
with jsonschema the way the master's "sanity check" does.

The master validates a submitted config in two steps (determined-ai/determined,
schemas/README.md at v0.38.0): a sanity check of what the user wrote, then, after merging the
cluster's defaults (master.yaml's checkpoint_storage, task_container_defaults, ...), a
completeness check that adds `eventuallyRequired` and `eventually`. A lint sees only the
user's file, so it runs the sanity check: a config that leaves checkpoint_storage's keys to
the master is valid here, as it is there.

The custom keywords follow the Python implementations Determined removed in commit
5d9266a003 (harness/determined/common/schemas/extensions.py at 5d9266a003~); the master's Go
versions live in master/pkg/schemas/extensions/.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from jsonschema import ValidationError as Error
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_VERSION = "0.38.0"
SCHEMAS = Path(__file__).with_name("schemas")
ROOT = "http://determined.ai/schemas/expconf/v0/experiment.json"


def _checks(validator, checks: dict, instance: Any, schema: dict) -> Iterator[Error]:
    for message, subschema in checks.items():
        if any(True for _ in validator.descend(instance, schema=subschema)):
            yield Error(message)


def _union_key(key: str, instance: Any) -> bool:
    if key in ("always", "never"):
        return key == "always"
    kind, _, arg = key.partition(":")
    if kind == "not":
        return not _union_key(arg, instance)
    if kind == "const":
        name, _, value = arg.partition("=")
        return isinstance(instance, dict) and instance.get(name) == value
    if kind == "singleproperty":
        return isinstance(instance, dict) and list(instance) == [arg]
    if kind == "type":
        return isinstance(instance, list if arg == "array" else dict)
    if kind == "hasattr":
        return isinstance(instance, dict) and arg in instance
    raise ValueError(f"invalid unionKey: {key}")


def _union(validator, union: dict, instance: Any, schema: dict) -> Iterator[Error]:
    """Exactly one member must match; when none does, the errors of the member the unionKey
    selects (e.g. `const:type=s3`) are the ones shown."""
    selected: list[Error] | None = None
    valid = 0
    for index, item in enumerate(union["items"]):
        errors = list(validator.descend(instance, schema=item, schema_path=index))
        if not errors:
            valid += 1
        elif selected is None and _union_key(item.get("unionKey"), instance):
            selected = errors
    if valid == 1:
        return
    if valid > 1:
        yield Error("matches more than one form (schema ambiguity)")
    elif selected:
        yield from selected
    else:
        yield Error(union.get("defaultMessage", "union failed to validate"))


def _compare(validator, compare: dict, instance: Any, schema: dict) -> Iterator[Error]:
    if not isinstance(instance, dict):
        return

    def get(path: str) -> Any:
        obj: Any = instance
        for key in path.split("."):
            if not isinstance(obj, dict):
                return None
            obj = obj.get(key)
        return obj

    a, b, kind = get(compare["a"]), get(compare["b"]), compare["type"]
    if a is None or b is None:
        return
    try:
        if kind == "a<b" and a >= b or kind == "a<=b" and a > b:
            yield Error(f"{compare['a']} must be less than {compare['b']}")
    except TypeError:
        return  # a type error of a or b is reported by their own schemas
    if kind == "a_is_subdir_of_b" and isinstance(a, str) and isinstance(b, str):
        a_norm, b_norm = os.path.normpath(a), os.path.normpath(b)
        if a_norm.startswith("..") if not os.path.isabs(a_norm) else not a_norm.startswith(b_norm):
            yield Error(f"{compare['a']} must be a subdirectory of {compare['b']}")


def _disallow(validator, disallowed: dict, instance: Any, schema: dict) -> Iterator[Error]:
    if isinstance(instance, dict):
        for prop in instance:
            if prop in disallowed:
                yield Error(disallowed[prop])


def _optional_ref(validator, ref: str, instance: Any, schema: dict) -> Iterator[Error]:
    if instance is not None:
        yield from validator.descend(instance, schema={"$ref": ref}, schema_path="optionalRef")


def _skip(validator, value: Any, instance: Any, schema: dict) -> Iterator[Error]:
    """eventuallyRequired / eventually: the completeness step, after the master's defaults."""
    return iter(())


@cache
def validator() -> jsonschema.protocols.Validator:
    resources = []
    for path in sorted(SCHEMAS.glob("*.json")):
        document = json.loads(path.read_text())
        # jsonschema picks the validator class by `$schema` when it follows a reference, which
        # would be plain Draft 7 without the keywords above: drop it (they are all draft-07).
        document.pop("$schema", None)
        resources.append((document["$id"], Resource.from_contents(document, default_specification=DRAFT7)))
    registry: Registry = Registry().with_resources(resources)
    cls = jsonschema.validators.extend(
        jsonschema.Draft7Validator,
        {
            "checks": _checks,
            "union": _union,
            "compareProperties": _compare,
            "disallowProperties": _disallow,
            "optionalRef": _optional_ref,
            "eventuallyRequired": _skip,
            "eventually": _skip,
        },
    )
    root = registry.contents(ROOT)
    return cls(root, registry=registry)


def errors(config: Any) -> list[tuple[str, str]]:
    """(key path like `resources.slots_per_trial`, message) for each schema error, in order."""
    found = []
    for e in validator().iter_errors(config):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        found.append((path.lstrip(".") or "<top>", e.message))
    return sorted(set(found))
