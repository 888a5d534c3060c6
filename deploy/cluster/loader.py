"""PyYAML, read as YAML 1.2 (core schema) with limits, and YAML 1.1's surprises flagged.

PyYAML implements YAML 1.1: `master_port: 023457` loads as 10031 (octal), `reboot: no` as
False, `time: 1:30` as 90 (base 60). `Loader` resolves plain scalars by the YAML 1.2 core
schema instead (null, true/false, decimal, 0o and 0x integers, floats; everything else is a
string) and notes every plain scalar that YAML 1.1 would have read differently, so the reader
can refuse it with its line (`surprise()` says why).

Limits, each refused with the line it is reached on instead of a traceback or a long wait:
nesting deeper than MAX_DEPTH, more than MAX_NODES nodes once aliases are expanded (a
"billion laughs" document has a few hundred bytes and 10^9 nodes), an alias inside the
collection it names (a recursive document), numbers longer than MAX_DIGITS digits, and files
over MAX_BYTES.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import Node, ScalarNode

MAX_BYTES = 1_000_000
MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_DIGITS = 100

_TAG = "tag:yaml.org,2002:"
NULL, BOOL, INT, FLOAT, STR, MERGE = (f"{_TAG}{t}" for t in ("null", "bool", "int", "float", "str", "merge"))


class LimitError(yaml.MarkedYAMLError):
    """A document PyYAML could read but this loader refuses (too deep, too big, recursive)."""


# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#103-core-schema), plus `<<` merge keys.
_CORE = [
    (NULL, r"~|null|Null|NULL|", "~nN"),
    (BOOL, r"true|True|TRUE|false|False|FALSE", "tTfF"),
    (INT, r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    (
        FLOAT,
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        "-+.0123456789",
    ),
    (MERGE, r"<<", "<"),
]

_YAML11 = yaml.resolver.Resolver()  # PyYAML's own YAML 1.1 resolution, to compare with


def _core_tag(text: str) -> str:
    for tag, pattern, _ in _CORE:
        if re.fullmatch(pattern, text):
            return tag
    return STR


def surprise(text: str) -> str | None:
    """Why a plain scalar is ambiguous between YAML 1.1 and 1.2, or None when both agree."""
    if len(text) > MAX_DIGITS:
        return None  # only short scalars are numbers, booleans or dates
    tag11 = _YAML11.resolve(ScalarNode, text, (True, False))
    tag12 = _core_tag(text)
    if text in ("y", "Y", "n", "N") or (tag11 == BOOL and tag12 != BOOL):
        word = "true" if text.lower() in ("y", "yes", "on") else "false"
        return (
            f"YAML 1.1 reads an unquoted {text} as {word}, YAML 1.2 as text: "
            f"write {word} for a boolean, or quote it for text"
        )
    if re.fullmatch(r"[-+]?0[xXoObB][0-9a-fA-F_]*", text) and INT in (tag11, tag12):
        return "a hexadecimal, octal or binary number: write it in decimal, or quote it if it is text"
    if tag12 == INT and re.fullmatch(r"[-+]?0[0-9]+", text):
        read11 = f"as the octal number {_load11(text)}" if tag11 == INT else "as text"
        return (
            f"a number with a leading zero: YAML 1.1 reads it {read11}, YAML 1.2 as {int(text, 10)}: "
            "drop the leading zero, or quote it"
        )
    if tag11 == tag12:
        return None
    if tag11 in (INT, FLOAT) and ":" in text:
        return f"YAML 1.1 reads {text} as the base-60 number {_load11(text)}: quote it"
    if tag11 in (INT, FLOAT) and "_" in text:
        return f"YAML 1.1 reads {text} as the number {_load11(text)}: write it without '_', or quote it"
    if tag11 == f"{_TAG}timestamp":
        return "YAML 1.1 reads this as a date: quote it"
    kind11, kind12 = _KINDS.get(tag11, tag11), _KINDS.get(tag12, tag12)
    return f"YAML 1.1 reads {text} as {kind11}, YAML 1.2 as {kind12}: quote it"


_KINDS = {
    NULL: "null",
    BOOL: "a boolean",
    INT: "an integer",
    FLOAT: "a number",
    STR: "text",
    MERGE: "a merge key",
    f"{_TAG}timestamp": "a date",
    f"{_TAG}value": "a value key",
}


def _load11(text: str) -> object:
    try:
        return yaml.safe_load(text) if len(text) <= 40 else "?"
    except (yaml.YAMLError, ValueError):
        return "?"


class Loader(yaml.SafeLoader):
    """Loader(text).load() -> (node tree, data, {id(node): why} for YAML 1.1 surprises)."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}

    def __init__(self, text: str):
        super().__init__(text)
        self.surprises: dict[int, str] = {}
        self._depth = 0
        self._nodes = 0  # nodes of the document with every alias expanded
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size
        self._open: list[str] = []  # anchors of the collections being composed

    def load(self) -> tuple[Node | None, object]:
        try:
            node = self.get_single_node()
            data = None if node is None else self.construct_document(node)
        finally:
            self.dispose()
        return node, data

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise LimitError(
                None,
                None,
                f"more than {MAX_NODES} nodes once aliases are expanded (an alias bomb: each alias "
                "repeats what it names)",
                mark,
            )

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()
        start: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise LimitError(
                    None,
                    None,
                    f"the alias *{event.anchor} is inside the collection it names (a recursive document)",
                    start,
                )
            target = self.anchors.get(event.anchor)
            if target is not None:
                self._count(self._sizes.get(id(target), 1), event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise LimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        anchor = getattr(event, "anchor", None)
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if anchor and collection:
            self._open.append(anchor)
        before = self._nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        if anchor and collection:
            self._open.pop()
        self._sizes[id(node)] = self._nodes - before
        self._depth -= 1
        return node

    def compose_scalar_node(self, anchor: Any) -> Any:
        event = self.peek_event()
        node = super().compose_scalar_node(anchor)
        if event.tag is None and event.style is None:  # plain and untagged: resolved by content
            why = surprise(event.value)
            if why:
                self.surprises[id(node)] = why
        return node

    # --- constructing YAML 1.2 values ----------------------------------------------------------

    def _text(self, node: Node) -> str:
        text = self.construct_scalar(node)  # type: ignore[arg-type]
        if not isinstance(text, str):
            raise ConstructorError(None, None, "expected a scalar", node.start_mark)
        if len(text) > MAX_DIGITS:
            raise LimitError(None, None, f"a number longer than {MAX_DIGITS} characters", node.start_mark)
        return text

    def construct_core_int(self, node: Node) -> int:
        text = self._text(node)
        sign, body = (-1, text[1:]) if text[:1] == "-" else (1, text.removeprefix("+"))
        if re.fullmatch(r"[0-9]+", body):
            return sign * int(body, 10)
        if re.fullmatch(r"0o[0-7]+", body):
            return sign * int(body[2:], 8)
        if re.fullmatch(r"0x[0-9a-fA-F]+", body):
            return sign * int(body[2:], 16)
        raise ConstructorError(None, None, f"not an integer: {text!r}", node.start_mark)

    def construct_core_float(self, node: Node) -> float:
        text = self._text(node)
        special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
        if text.lower() in special:
            return special[text.lower()]
        try:
            return float(text)
        except ValueError:
            raise ConstructorError(None, None, f"not a number: {text!r}", node.start_mark) from None

    def construct_core_bool(self, node: Node) -> bool:
        text = self._text(node)
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ConstructorError(None, None, f"not true or false: {text!r}", node.start_mark)

    def construct_safe_timestamp(self, node: Node) -> object:
        try:
            return self.construct_yaml_timestamp(node)  # type: ignore[arg-type]
        except (AttributeError, ValueError, TypeError):
            raise ConstructorError(None, None, "not a timestamp", node.start_mark) from None


for _tag, _pattern, _first in _CORE:
    Loader.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list(_first))
Loader.add_implicit_resolver(NULL, re.compile(r"^$"), [""])  # the empty plain scalar
Loader.add_constructor(INT, Loader.construct_core_int)
Loader.add_constructor(FLOAT, Loader.construct_core_float)
Loader.add_constructor(BOOL, Loader.construct_core_bool)
Loader.add_constructor(f"{_TAG}timestamp", Loader.construct_safe_timestamp)
