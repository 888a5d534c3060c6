"""Reading a YAML file into problems and checked values: the machinery, not the cluster's rules.

`read_document` parses the text, notes the line and column of every key (problems are printed
in file order) and reports duplicate keys. A `Reader` collects problems, one line each:

    <file>: <key path>: <value>: <what is wrong>

A `Map` is one mapping of the file: it reports unknown keys (with "did you mean") and reads
its keys through checks (deploy/cluster/checks.py). Secret values are never shown.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from deploy.cluster.loader import MAX_BYTES, LimitError, Loader
from deploy.secrets import REPO_ROOT, Secret, SecretError, describe, parse_reference, resolve


class ClusterError(Exception):
    """cluster.yaml is unusable; `.problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = [one_line(p) for p in problems]
        super().__init__("\n".join(self.problems))


# Control characters, line/paragraph separators, and the invisible format characters (zero-width
# spaces and joiners, bidirectional overrides, the byte-order mark) and lone surrogates: what
# would make a problem line span lines, reorder itself or hide part of a value.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")


def one_line(text: str) -> str:
    """`text` with control characters escaped: a problem never spans lines or moves the cursor."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


MISSING: Any = object()  # a key that is not in the file
REQUIRED: Any = object()  # Map.get's default for a key without one

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def join(path: str, key: object) -> str:
    """The key path of `key` inside `path`: `storage.port`, `nodes[2]`, `x['odd key']`."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    if isinstance(key, str) and _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]" if path else repr(key)


def show(value: object) -> str:
    if value is MISSING:
        return "(missing)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def did_you_mean(word: object, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Reader:
    """Collects problems while the model is built; each check reports and returns None."""

    def __init__(self, shown_path: str, resolve_secrets: bool, top_keys: tuple[str, ...] = ()):
        self.file = shown_path
        self.resolve_secrets = resolve_secrets
        self.top_keys = top_keys  # the documented order of the top-level keys
        self.problems: list[str] = []
        self.keys: list[str] = []
        self.positions: dict[str, tuple[int, int]] = {}  # key path -> (line, column) in the file
        # Top-level sections holding secrets: a problem found while indexing (a YAML 1.1
        # surprise) shows a value there only for the keys in `shown_keys`.
        self.hidden: tuple[str, ...] = ()
        self.shown_keys: set[str] = set()
        # Key paths of values YAML 1.1 and 1.2 read differently: reported once, by
        # index_document; checks of those values (or of values inside them) stay silent.
        self.ambiguous: set[str] = set()
        self.ambiguous_keys: set[str] = set()  # those whose key itself is ambiguous

    def add(self, key: str, shown: str, message: str, about_key: bool = False) -> None:
        """about_key: the problem is the key itself (unknown, duplicate), not its value."""
        if (key in self.ambiguous_keys) if about_key else self._inside_ambiguous(key):
            return
        self.problems.append(f"{self.file}: {key or '(top level)'}: {shown}: {message}")
        self.keys.append(key)

    def _inside_ambiguous(self, key: str) -> bool:
        if not self.ambiguous:
            return False
        probe = key
        while True:
            if probe in self.ambiguous:
                return True
            parent = re.sub(r"(\.[^.\[]+|\[[^\]]*\])$", "", probe)
            if parent == probe:
                return False
            probe = parent

    def bad(self, key: str, value: object, message: str) -> None:
        self.add(key, show(value), message)

    def in_file_order(self) -> list[str]:
        """Problems sorted by the position of their key (or of its closest written parent);
        problems about missing top-level keys come first, in the documented key order."""

        def rank(item: tuple[int, str]) -> tuple[int, int, int, int]:
            index, key = item
            probe = key
            while probe and probe not in self.positions:
                parent = re.sub(r"(\.[^.\[]+|\[[^\]]*\])$", "", probe)
                probe = "" if parent == probe else parent
            top = re.split(r"[.\[]", key)[0]
            top_rank = self.top_keys.index(top) if top in self.top_keys else len(self.top_keys)
            line, column = self.positions.get(probe, (0, 0))
            return (line, column, top_rank, index)

        order = sorted(enumerate(self.keys), key=rank)
        return list(dict.fromkeys(self.problems[i] for i, _ in order))

    def mapping(
        self,
        raw: object,
        path: str,
        allowed: tuple[str, ...],
        required: str = "",
        holds_secrets: bool = False,
    ) -> Map:
        return Map(self, raw, path, allowed, required, holds_secrets=holds_secrets)


def read_document(path: str | Path, shown: str) -> tuple[yaml.Node | None, object, dict[int, str]]:
    """The file's YAML node tree, its plain data (YAML 1.2 core schema, deploy/cluster/loader.py)
    and the plain scalars YAML 1.1 would read differently (id(node) -> why); ClusterError if
    it cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ClusterError([f"{shown}: cannot read the file: {e.strerror}"]) from None
    if len(data) > MAX_BYTES:
        raise ClusterError([f"{shown}: cannot read the file: larger than {MAX_BYTES} bytes"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ClusterError([f"{shown}: cannot read the file: it is not UTF-8 text"]) from None
    try:
        loader = Loader(text)  # PyYAML's reader refuses non-printable characters here
        document, raw = loader.load()
    except yaml.reader.ReaderError as e:
        # A character YAML does not allow (NUL, most control characters): say where.
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        code = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or "?")
        what = (
            f"unacceptable character U+{code:04X}: YAML allows no control characters but tab and line breaks"
        )
        raise ClusterError([f"{shown}:{line}: YAML syntax error: {what} (column {column})"]) from None
    except yaml.YAMLError as e:
        raise ClusterError([_yaml_problem(shown, e)]) from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as e:
        # PyYAML's constructors on odd explicit tags; never seen with plain YAML.
        raise ClusterError([f"{shown}: YAML: cannot read a value ({type(e).__name__})"]) from None
    return document, raw, loader.surprises


def _yaml_problem(shown: str, e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or (str(e).splitlines() or ["unreadable"])[0]
    if isinstance(e, LimitError):
        label = "YAML refused"
    elif isinstance(e, yaml.constructor.ConstructorError):
        label = "YAML value error"
    else:
        label = "YAML syntax error"
    if mark is None:
        return f"{shown}: {label}: {what}"
    return f"{shown}:{mark.line + 1}: {label}: {what} (column {mark.column + 1})"


def index_document(reader: Reader, node: yaml.Node, surprises: dict[int, str], path: str = "") -> None:
    """Note the position of every key (to print problems in file order), flag duplicate keys,
    and report the plain values YAML 1.1 reads differently from YAML 1.2 (`surprises`).

    PyYAML silently keeps the last of two equal keys: an operator would edit one and see
    the other take effect. The loader's limits keep this walk shallow and small.
    """
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
            child = join(path, key)
            mark = key_node.start_mark
            if child in reader.positions and key != "<<":
                reader.add(
                    child,
                    "...",
                    f"duplicate key (lines {reader.positions[child][0]} and "
                    f"{mark.line + 1}): YAML would keep only the last one",
                    about_key=True,
                )
            reader.positions.setdefault(child, (mark.line + 1, mark.column))
            if _surprise(reader, key_node, surprises, child):
                reader.ambiguous_keys.add(child)
            index_document(reader, value_node, surprises, child)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            mark = item.start_mark
            reader.positions.setdefault(join(path, i), (mark.line + 1, mark.column))
            index_document(reader, item, surprises, join(path, i))
    else:
        _surprise(reader, node, surprises, path)


def _surprise(reader: Reader, node: yaml.Node, surprises: dict[int, str], path: str) -> bool:
    why = surprises.get(id(node))
    if why is None:
        return False
    if path in reader.ambiguous:
        return True
    top = re.split(r"[.\[]", path)[0]
    if top in reader.hidden and path not in reader.shown_keys:
        # Maybe a secret written in place: the secret's own check refuses it, unseen.
        return False
    reader.add(path, str(node.value), f"{why} (line {node.start_mark.line + 1})")
    reader.ambiguous.add(path)
    return True


CheckFn = Callable[[Reader, str, Any], Any]  # a check of deploy/cluster/checks.py


class Map:
    """One mapping of the file: unknown keys reported once, fields read with checks.

    A map that is missing (when required) or is not a mapping is reported once and marked
    broken; its fields and sub-maps then stay silent instead of repeating the problem.
    """

    broken: bool

    def __init__(
        self,
        reader: Reader,
        raw: object,
        path: str,
        allowed: tuple[str, ...],
        required: str = "",
        parent: Map | None = None,
        holds_secrets: bool = False,
    ):
        self.r = reader
        self.path = path
        self.data: dict = {}
        quiet = parent is not None and parent.broken
        self.broken = quiet
        if raw is MISSING or raw is None:
            if required:
                if not quiet:
                    reader.bad(path, raw, f"required: {required}")
                self.broken = True
        elif not isinstance(raw, dict):
            if not quiet:
                # `database: hunter2` must not be echoed back.
                shown = describe(raw) if holds_secrets else show(raw)
                reader.add(path, shown, f"must be a mapping with keys {', '.join(allowed)}")
            self.broken = True
        else:
            self.data = raw
            for key in raw:
                if key not in allowed:
                    hint = did_you_mean(key, list(allowed)) or f"; allowed here: {', '.join(allowed)}"
                    # Never show the value: a mistyped `pasword:` would hold a secret.
                    shown_key = key if isinstance(key, str) else repr(key)
                    reader.add(join(path, shown_key), "...", f"unknown key{hint}", about_key=True)

    def sub(self, key: str, allowed: tuple[str, ...], required: str = "", holds_secrets: bool = False) -> Map:
        return Map(
            self.r, self.raw(key), self.key(key), allowed, required, parent=self, holds_secrets=holds_secrets
        )

    def key(self, key: str) -> str:
        return join(self.path, key)

    def raw(self, key: str) -> Any:
        return self.data.get(key, MISSING)

    def given(self, key: str) -> bool:
        """Whether the key is written with a value (`key:` alone counts as not given)."""
        return self.raw(key) not in (MISSING, None)

    def get(self, key: str, check: CheckFn, default: Any = REQUIRED, what: str = "") -> Any:
        """The checked value, `default` if the key is missing, None after reporting a problem.

        default=None makes the key optional: written with no value, it is unset. With another
        default, `port:` with no value is reported by the check.
        """
        value = self.raw(key)
        path = self.key(key)
        required = f"required: {what}" if what else "required"
        if value is MISSING:
            if default is REQUIRED:
                if not self.broken:
                    self.r.bad(path, value, required)
                return None
            return default
        if value is None:
            if default is None:  # an optional key written with no value
                return None
            if default is REQUIRED:
                self.r.bad(path, value, required)
                return None
        return check(self.r, path, value)

    def secret(self, key: str, what: str) -> Secret | None:
        raw = self.raw(key)
        path = self.key(key)
        if raw is MISSING or raw is None:
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
