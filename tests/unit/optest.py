"""Operations and roles tested the way pyinfra tests its own operations: facts in, commands out.

pyinfra's tests (tests/test_operations.py with tests/operations/<module>.<op>/*.json) give an
operation's `_inner` a host whose facts come from the test data and compare the commands it
yields and the no-op description it leaves. This module is that harness for this toolkit:

  Facts             the facts of one host: a dict keyed by fact class, or by fact(cls, **args)
                    when an operation reads one fact class with several arguments; a value may
                    be a callable (args -> value) for facts computed from their arguments.
  run_op(op, facts, *args, **kwargs) -> (commands, noops)
                    one operation's commands and no-op descriptions, nothing executed.
  plan(deploy, facts, *args, **kwargs) -> [Planned]
                    a role's @deploy planned under a real pyinfra State for one host (no SSH),
                    then "executed" in order without running anything: each operation's `_if`
                    is evaluated against the earlier ones' results, as pyinfra does when it
                    runs the plan, so an operation conditional on a change that did not happen
                    is a no-op here as it is on the node.

A fact the test does not give fails the test naming the fact class and its arguments
(MissingFact), even when a role catches the exception: a missing fact is never read as None.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import json
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra.api import (
    Config,
    FileDownloadCommand,
    FileUploadCommand,
    FunctionCommand,
    Inventory,
    State,
    StringCommand,
)
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state


class MissingFact(AssertionError):
    """The operation or role asked for a fact the test case does not give."""


def _frozen(value):
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def fact(cls: type, **args) -> tuple:
    """The key of one fact read with these arguments (FileContents, path=...)."""
    return (cls, _frozen(args))


def fact_name(cls: type, args: dict) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(args.items()))
    return f"{cls.__module__}.{cls.__qualname__}({shown})"


@dataclass
class Facts:
    """A host's facts; `asked` lists every read (cls, args), in order, for tests that check it."""

    table: dict = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # what get_file (SFTP) serves
    # Facts not in the table read by running the fact's command on this machine, and files
    # served from this machine: for operations tested against a real local service (no
    # MissingFact then: the reader answers every fact).
    reader: Callable[[type, dict], Any] | None = None
    local_files: bool = False
    asked: list[tuple[type, dict]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def get(self, cls, *args, **kwargs):
        if args:  # pyinfra's get_fact takes positional fact arguments: name them as the fact does
            names = [p for p in inspect.signature(cls.command).parameters if p != "self"]
            kwargs = {**dict(zip(names, args, strict=False)), **kwargs}
        # Connector arguments (_sudo, _env, ...) change how a fact is read, not which one it is.
        fact_args = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        self.asked.append((cls, fact_args))
        for key in (fact(cls, **fact_args), cls):
            if key in self.table:
                value = self.table[key]
                return value(**fact_args) if callable(value) and not isinstance(value, type) else value
        if self.reader is not None:
            return self.reader(cls, fact_args)
        name = fact_name(cls, fact_args)
        self.missing.append(name)
        raise MissingFact(f"the test gives no fact {name}")

    def get_file(self, path, buffer, **kwargs) -> bool:
        if self.local_files:
            buffer.write(Path(path).read_bytes())
            return True
        if path not in self.files:
            raise FileNotFoundError(path)
        buffer.write(self.files[path])
        return True

    def check(self) -> None:
        """Fail here too, in case the code under test caught and swallowed MissingFact."""
        if self.missing:
            raise MissingFact(f"the test gives no fact {', '.join(dict.fromkeys(self.missing))}")


def _facts(facts) -> Facts:
    return facts if isinstance(facts, Facts) else Facts(dict(facts))


class OpHost:
    """The Host methods operations call while they generate commands, nothing that connects."""

    name = print_prefix = "node"

    def __init__(self, facts: Facts):
        self.facts, self.noops = facts, list[str]()
        self.get_fact, self.get_file = facts.get, facts.get_file

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def get_temp_filename(self, hash_key=None, **kwargs) -> str:
        # pyinfra hashes the key into its temp directory: the same, minus the host's config.
        return f"/tmp/pyinfra-{hashlib.sha1(str(hash_key).encode()).hexdigest()}"


@functools.cache
def _bare_state() -> State:
    """A State with no hosts, for operations that read state.config (pyinfra's FakeState)."""
    return State(Inventory(([], {})), Config())


@contextlib.contextmanager
def on_host(facts) -> Iterator[OpHost]:
    """pyinfra's `host` is an OpHost with these facts: for role helpers that read facts outside
    an operation. Fails on exit when a fact was missing."""
    host = OpHost(_facts(facts))
    with ctx_state.use(_bare_state()), ctx_host.use(host):
        yield host
    host.facts.check()


def run_op(op, facts, *args, **kwargs) -> tuple[list, list[str]]:
    """The commands one operation yields for these facts, and its no-op descriptions."""
    with on_host(facts) as host:
        commands = list(op._inner(*args, **kwargs))
    return commands, host.noops


def commands_of(op, facts, *args, **kwargs) -> list:
    """run_op's commands only, for tests about what runs, not what is said."""
    return run_op(op, facts, *args, **kwargs)[0]


def shown(command) -> Any:
    """A command as pyinfra's operation tests write it: strings masked, uploads as
    ["upload", content, dest], Python calls as [function name, args, kwargs]."""
    if isinstance(command, str):
        return command.strip()
    if isinstance(command, StringCommand):
        return kept_script(command.get_masked_value())
    if isinstance(command, FileUploadCommand):
        src = command.src
        if not isinstance(src, str):  # a file object (StringIO, BytesIO); a str is a local path
            src.seek(0)
            data = src.read()
            if isinstance(data, bytes):  # binary (a random key) as its size: nothing to read
                try:
                    data = data.decode()
                except UnicodeDecodeError:
                    data = f"<{len(data)} bytes>"
        else:
            data = str(src)
        return ["upload", data, str(command.dest)]
    if isinstance(command, FileDownloadCommand):
        return ["download", str(command.src), str(command.dest)]
    if isinstance(command, FunctionCommand):
        return [
            getattr(command.function, "__name__", repr(command.function)),
            list(command.args),
            command.kwargs,
        ]
    raise TypeError(f"{command!r} is not a pyinfra command")


FILES = Path(__file__).parents[2] / "files"


def kept_script(text: str) -> Any:
    """`sh -c '<files/PACKAGE/NAME.sh>' NAME.sh ARGS` (roles/shared/scripts.py) as
    ["script", "PACKAGE/NAME.sh", ARGS...] when the program is exactly that kept file: a case
    names the program it runs and its arguments, not three thousand characters of shell; any
    other command as it is."""
    if not text.startswith("sh -c "):
        return text
    try:
        argv = shlex.split(text)
    except ValueError:
        return text
    if len(argv) < 4:
        return text
    for path in FILES.glob(f"*/{argv[3]}"):
        if path.read_text() == argv[2]:
            return ["script", str(path.relative_to(FILES)), *argv[4:]]
    return text


# --- operation cases kept as data -------------------------------------------------------------

CASES = Path(__file__).parent / "operation_cases"


def case_files() -> list[Path]:
    return sorted(CASES.glob("*/*.json"))


def load_fact_class(name: str) -> type:
    """ "deb.DebPackages" (pyinfra.facts.deb) or "deploy.facts.trust.SecretFileState"."""
    module, _, cls = name.rpartition(".")
    if not module.startswith(("pyinfra.", "deploy.")):
        module = f"pyinfra.facts.{module}"
    return getattr(importlib.import_module(module), cls)


def _argument(text: str) -> Any:
    """ "port=8080" is the number 8080, "path=/etc/x" the string: JSON where it parses."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def case_facts(data: dict) -> Facts:
    """pyinfra's JSON layout: {"deb.DebPackages": value} for a fact read without arguments,
    {"files.Sha256File": {"path=/x": value}} for one read with them (one key=value per
    argument, comma-separated)."""
    table: dict = {}
    for name, value in data.items():
        cls = load_fact_class(name)
        arg_keys = isinstance(value, dict) and value and all("=" in k for k in value)
        if not arg_keys:
            table[cls] = value
            continue
        for keyed, one in value.items():
            args = {k: _argument(v) for k, v in (part.split("=", 1) for part in keyed.split(","))}
            table[fact(cls, **args)] = one
    return Facts(table)


# --- plans: a role's deploy under a real State ------------------------------------------------


@dataclass
class Planned:
    """One operation of a plan: its name, the commands it would run and its no-op notes."""

    name: str
    commands: list
    noops: list[str]

    @property
    def changes(self) -> bool:
        return bool(self.commands)

    @property
    def text(self) -> str:
        lines = (shown(c) for c in self.commands)
        return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)


@contextlib.contextmanager
def _one_host_state(facts: Facts) -> Iterator[tuple[State, Any]]:
    # How pyinfra's API tests build a state (tests/test_api/test_api_deploys.py): an Inventory
    # and a Config, no connect_all. The host never connects: its three methods that would reach
    # the node are replaced on this one Host object (never on pyinfra's class) by the fact table.
    state = State(Inventory((["node"], {})), Config())
    # Plan without calling each operation's generator (pyinfra would, to count changes, before
    # any `_if` can be known): the walk in plan() calls it once, as pyinfra's execution does.
    state.check_for_changes = False
    host = state.inventory.get_host("node")
    noops: list[str] = []
    host.get_fact = facts.get  # type: ignore[method-assign,assignment]
    host.get_file = facts.get_file  # type: ignore[method-assign]
    host.noop = noops.append  # type: ignore[method-assign,assignment]
    host.recorded_noops = noops  # type: ignore[attr-defined]
    with ctx_state.use(state), ctx_host.use(host):
        yield state, host


def plan(deploy: Callable, facts, *args, **kwargs) -> list[Planned]:
    """The operations `deploy` adds for one host with these facts, in pyinfra's run order.

    Each operation is completed as if its commands succeeded (OperationMeta.set_complete, the
    public method pyinfra's executor calls), so a later `_if=op.did_change` sees whether it
    would have changed anything."""
    facts = _facts(facts)
    planned: list[Planned] = []
    with _one_host_state(facts) as (state, host):
        deploy(*args, **kwargs)
        # From here on as pyinfra's run_ops: with state.is_executing the generator pyinfra made
        # for each operation first evaluates its `_if` (pyinfra/api/operation.py) and yields
        # nothing when it is false; apt_pins.update_if_stale reads it for sources_changed.
        state.is_executing = True
        for op_hash in state.get_op_order():
            op_data = state.get_op_data_for_host(host, op_hash)
            before = len(host.recorded_noops)
            commands = list(op_data.command_generator())
            op_data.operation_meta.set_complete(True, commands, CommandOutput([]))
            name = min(state.get_op_meta(op_hash).names)  # one name per operation here
            planned.append(Planned(name, commands, host.recorded_noops[before:]))
    facts.check()
    return planned


def changing(planned: list[Planned]) -> list[str]:
    """The names of the operations that would change something: [] for an as-deployed node."""
    return [p.name for p in planned if p.changes]
