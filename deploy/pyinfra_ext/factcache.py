"""Facts read once per host until that host changes, and read in one command when we know them.

pyinfra 3.10 has no fact cache and reads every fact with its own SSH command: an agent's no-op
re-deploy was 74 commands, run operation by operation in lockstep with every other host, and
while pyinfra plans (deploy.py, host after host) each fact read waits for its node in turn.

Two things here, both keyed on pyinfra's own fact classes and parsed by their own `process`:
- a cache: a fact is remembered per host and forgotten as soon as any operation command
  (shell, upload, download, Python callback) runs on that host, so a value is never older
  than the last change the deploy made there. A clock (`Date`) is never cached. The key is
  what pyinfra 2.x's own cache hashed (`_get_fact_hash` in pyinfra/api/facts.py:
  `make_hash((cls, fact_kwargs, executor_kwargs))`, both from `_handle_fact_kwargs`): the
  fact class, its arguments bound to its `command` signature, and the connector arguments
  the read runs with, i.e. the current operation's global arguments (sudo, su, env, shell,
  chdir, ...) overridden by those passed to get_fact. A read with `_sudo=True` and one
  without are two entries, as are two operations with different `_env`.
- a batch read: the facts each host asked for are written down at the end of a run
  (~/.cache/gpu-cluster/facts/); the next run reads all of them in ONE command per host, for
  every host at once, before the plan asks for the first. A no-op re-deploy then costs about
  one command per host instead of one per fact. A fact the batch could not read (non-zero exit,
  a missing binary, output the fact cannot process) is simply read the usual way. That file
  is trusted only when this user alone can write it, and only for an allow-list of fact
  classes and arguments (fact_class, safe_arguments): a planted entry must not run as root.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

import gevent  # type: ignore[import-untyped]  # gevent ships no type information
import gevent.event  # type: ignore[import-untyped]
from pyinfra.api import command as pyinfra_command
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.facts import FactBase, ShortFactBase, _handle_fact_kwargs, _make_command
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.facts.files import File, Sha1File
from pyinfra.facts.server import Date

from deploy.pyinfra_ext import wrap_once

logger = logging.getLogger("pyinfra.gpu_cluster.factcache")  # shown by pyinfra --debug

VOLATILE = (Date,)  # apt.update's cache_time compares it with "now"
COMMAND_CLASSES = (
    pyinfra_command.StringCommand,
    pyinfra_command.FileUploadCommand,
    pyinfra_command.FileDownloadCommand,
    pyinfra_command.FunctionCommand,
    pyinfra_command.RsyncCommand,
)
MARK = "--8<-- gpu-cluster fact"
_CACHE_ATTR = "_gpu_cluster_fact_cache"
_WANTED_ATTR = "_gpu_cluster_facts_wanted"
_BATCHED_ATTR = "_gpu_cluster_facts_batched"


def record_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-cluster" / "facts"


def _cache(host) -> dict:
    cache = getattr(host, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        setattr(host, _CACHE_ATTR, cache)
    return cache


def forget(host) -> None:
    _cache(host).clear()


def cacheable(cls) -> bool:
    return (
        isinstance(cls, type)
        and issubclass(cls, FactBase)
        and not issubclass(cls, ShortFactBase)
        and cls not in VOLATILE
    )


def freeze(value):
    """Lists (systemd facts take `services=[...]`) and dicts (`_env`) as tuples: a key."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    return value


def resolve(state, host, cls, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """(fact arguments, connector arguments) exactly as pyinfra's get_fact derives them."""
    fact_kwargs, global_kwargs = _handle_fact_kwargs(state, host, cls, list(args), dict(kwargs))
    fact_kwargs = {k: v for k, v in fact_kwargs.items() if k != "self"}  # a fresh fact object
    connector_kwargs = {k: v for k, v in global_kwargs.items() if k in CONNECTOR_ARGUMENT_KEYS}
    return fact_kwargs, connector_kwargs


def key_of(cls, fact_kwargs: dict, connector_kwargs: dict) -> tuple | None:
    key = (cls, freeze(fact_kwargs), freeze(connector_kwargs))
    try:
        hash(key)
    except TypeError:  # a set or an unhashable object argument: read it every time
        return None
    return key


def cache_key(state, host, cls, args: tuple, kwargs: dict) -> tuple | None:
    """The cache entry of a get_fact call on `host` made now (inside or outside an operation)."""
    try:
        return key_of(cls, *resolve(state, host, cls, args, kwargs))
    except Exception:  # arguments the fact does not take: pyinfra's own read says so
        return None


# --- which facts a host asks for, kept between runs -------------------------------------------


def wanted_entry(cls, args: tuple, kwargs: dict) -> str | None:
    """One fact request as JSON, or None when it would not come back the same from JSON."""
    if any(k.startswith("_") for k in kwargs):  # per-call sudo/env: not one shared command
        return None
    entry = [f"{cls.__module__}:{cls.__qualname__}", list(args), kwargs]
    try:
        text = json.dumps(entry, sort_keys=True)
    except TypeError:
        return None
    return text if freeze(json.loads(text)) == freeze(entry) else None


# files.put and files.template read File(path), then Sha1File(path) once the file exists: a
# first deploy (which creates the file) never asks for the checksum that every later run does.
COMPANIONS = {File: (Sha1File,)}


def wanted_entries(cls, args: tuple, kwargs: dict) -> list[str]:
    """The request itself and what it predicts the next run asks for (COMPANIONS)."""
    entries = [wanted_entry(cls, args, kwargs)]
    if not args and set(kwargs) == {"path"}:
        entries += [wanted_entry(other, (), kwargs) for other in COMPANIONS.get(cls, ())]
    return [e for e in entries if e is not None]


# The file names fact classes that the next run imports and runs as the deploy user (often
# root): only pyinfra's and this toolkit's facts may be named, never one that runs a command
# given as an argument (server.Command runs its argument as is), and every argument must be
# plain data of a safe character set, since some facts put arguments into their shell command
# unquoted. Anything else is left out: that fact is only read the usual way (slower).
ALLOWED_FACT_MODULES = ("pyinfra.facts.", "deploy.facts.")
# Of pyinfra's facts, only those this toolkit reads: the facts of the operations its roles call
# (pyinfra 3.10 operations/apt.py, files.py, server.py, systemd.py, postgres.py and docker.image)
# and those the roles read themselves. Another fact may take a program to run as an argument
# (facts/pip.py PipPackages runs its `pip` argument), so an entry naming one is not read.
PYINFRA_FACTS = frozenset(
    {
        "pyinfra.facts.apt:AptSources",
        "pyinfra.facts.deb:DebPackage",
        "pyinfra.facts.deb:DebPackages",
        "pyinfra.facts.docker:DockerImage",
        "pyinfra.facts.files:Block",
        "pyinfra.facts.files:Directory",
        "pyinfra.facts.files:File",
        "pyinfra.facts.files:FileContents",
        "pyinfra.facts.files:FindFiles",
        "pyinfra.facts.files:FindInFile",
        "pyinfra.facts.files:FindLinks",
        "pyinfra.facts.files:Flags",
        "pyinfra.facts.files:Link",
        "pyinfra.facts.files:Md5File",
        "pyinfra.facts.files:Sha1File",
        "pyinfra.facts.files:Sha256File",
        "pyinfra.facts.files:Sha384File",
        "pyinfra.facts.postgres:PostgresDatabases",
        "pyinfra.facts.postgres:PostgresRoles",
        "pyinfra.facts.server:EtcHosts",
        "pyinfra.facts.server:Groups",
        "pyinfra.facts.server:Hostname",
        "pyinfra.facts.server:Kernel",
        "pyinfra.facts.server:KernelModules",
        "pyinfra.facts.server:KernelVersion",
        "pyinfra.facts.server:LinuxDistribution",
        "pyinfra.facts.server:Mounts",
        "pyinfra.facts.server:Os",
        "pyinfra.facts.server:OsVersion",
        "pyinfra.facts.server:Port",
        "pyinfra.facts.server:Sysctl",
        "pyinfra.facts.server:Users",
        "pyinfra.facts.server:Which",
        "pyinfra.facts.systemd:SystemdEnabled",
        "pyinfra.facts.systemd:SystemdStatus",
    }
)
# Not on PYINFRA_FACTS either: kept should one of them ever be added there (defence in depth).
FREE_COMMAND_FACTS = frozenset(
    {"pyinfra.facts.server:Command", "pyinfra.facts.apt:SimulateOperationWillChange"}
)
FREE_COMMAND_PARAMETERS = frozenset({"command", "cmd", "commands", "script", "shell", "code"})
# Extra command-line text a fact passes through (FindFiles' `args`): such an entry is refused
# when it sets one, and allowed without (roles/fabric/ipoib.py reads FindFiles with a path only).
FREE_TEXT_ARGUMENTS = frozenset({"args", "extra_args"})
_SAFE_TEXT = re.compile(r"[A-Za-z0-9._/@:+=,*^-]*", re.ASCII)
_PRINTABLE = re.compile(r"[ -~]*", re.ASCII)
_AWK_TEXT = re.compile(r"(?:(?!['/\\])[ -~])*", re.ASCII)
# Arguments pyinfra 3.10 puts on the command line safely, so they may hold any printable text
# (read in pyinfra/facts/): FindInFile's pattern is QuoteString'd unless interpolate_variables
# (then it sits in double quotes: refused below); Which is `command -v` + QuoteString(command),
# a lookup that runs nothing; Block's markers go inside awk's '/.../' unquoted: no ', / or \.
TEXT_ARGUMENTS = {
    ("pyinfra.facts.files:FindInFile", "pattern"): _PRINTABLE,
    ("pyinfra.facts.server:Which", "command"): _PRINTABLE,
    ("pyinfra.facts.files:Block", "marker"): _AWK_TEXT,
    ("pyinfra.facts.files:Block", "begin"): _AWK_TEXT,
    ("pyinfra.facts.files:Block", "end"): _AWK_TEXT,
}


def takes_free_command(name: str, cls) -> bool:
    """A fact whose command() takes a parameter named like a command line (but Which)."""
    try:
        parameters = inspect.signature(cls.command).parameters
    except (AttributeError, TypeError, ValueError):
        return True
    free = {p for p in FREE_COMMAND_PARAMETERS & set(parameters) if (name, p) not in TEXT_ARGUMENTS}
    return bool(free)


def safe_argument(value, rule: re.Pattern = _SAFE_TEXT) -> bool:
    if value is None or isinstance(value, (bool, int)):
        return True
    if isinstance(value, str):
        return rule.fullmatch(value) is not None
    if isinstance(value, (list, tuple)):
        return all(safe_argument(v, rule) for v in value)
    return False


def _option_like(value) -> bool:
    """Text the fact's command would take as an option: `FindFiles(path="-delete")` becomes
    `find -delete -type f` (quoting does not help: the shell passes `-delete` on to find)."""
    if isinstance(value, str):
        return value.startswith("-")
    if isinstance(value, (list, tuple)):
        return any(_option_like(v) for v in value)
    return False


def safe_arguments(name: str, args: list, kwargs: dict, cls=None) -> bool:
    """Plain data of a safe character set (or text where pyinfra quotes it), no free
    command-line text, no global arguments (`_sudo`, ...: never written by wanted_entry);
    with the fact class: arguments its command() takes, none option-like (outside the text
    pyinfra passes after `-e` or as a quoted pattern), every `path` absolute, paths quoted."""
    if not safe_argument(args) or kwargs.get("interpolate_variables"):
        return False
    for key, value in kwargs.items():
        if not isinstance(key, str) or key.startswith("_"):
            return False
        if key in FREE_TEXT_ARGUMENTS and value is not None:
            return False
        if not safe_argument(value, TEXT_ARGUMENTS.get((name, key), _SAFE_TEXT)):
            return False
    if cls is None:
        return True
    try:
        bound = inspect.signature(cls.command).bind(None, *args, **kwargs).arguments
    except (AttributeError, TypeError, ValueError):  # not arguments this fact takes
        return False
    for key, value in list(bound.items())[1:]:  # past `self`
        if (name, key) not in TEXT_ARGUMENTS and _option_like(value):
            return False
        if key == "path" and not (isinstance(value, str) and value.startswith("/")):
            return False
        if key == "quote_path" and value is not True:
            return False
    return True


def fact_class(name: str):
    """The fact class `module:qualname` names, if it is one the file may name, else None."""
    if not isinstance(name, str) or name in FREE_COMMAND_FACTS:
        return None
    module, _, qualname = name.partition(":")
    if not module.startswith(ALLOWED_FACT_MODULES) or not re.fullmatch(r"[A-Za-z_][\w.]*", module + qualname):
        return None
    if module.startswith("pyinfra.facts.") and name not in PYINFRA_FACTS:
        return None
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None  # a fact renamed since the last run
    if not cacheable(obj) or takes_free_command(name, obj):
        return None
    return obj


def trusted_file(path: Path) -> bool:
    """The file and its directory belong to this user and nobody else may write them: another
    user able to plant an entry would choose what the next deploy runs."""
    try:
        for item in (path.parent, path):
            st = item.lstat()
            if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                logger.debug("not reading %s: %s is not this user's alone", path, item)
                return False
    except OSError:
        return False
    return True


def record_path(host) -> Path:
    address = host.data.get("ssh_hostname") or host.name
    safe = "".join(c if c.isalnum() or c in "-._@" else "_" for c in f"{host.name}@{address}")
    return record_dir() / f"{safe}.json"


def load_wanted(host) -> list[tuple]:
    path = record_path(host)
    if not trusted_file(path):
        return []
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(entries, list):
        return []
    wanted = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3):
            continue
        name, args, kwargs = entry
        cls = fact_class(name)
        if cls is None or not isinstance(args, list) or not isinstance(kwargs, dict):
            logger.debug("%s: %s names a fact it may not: %s", host.name, path, str(name)[:80])
            continue
        if not safe_arguments(name, args, kwargs, cls):
            logger.debug("%s: %s: unsafe arguments for %s", host.name, path, name)
            continue
        wanted.append((cls, tuple(args), kwargs))
    return wanted


def save_wanted(host) -> None:
    entries = getattr(host, _WANTED_ATTR, None)
    if not entries:
        return
    path = record_path(host)
    text = json.dumps([json.loads(e) for e in sorted(entries)]) + "\n"
    part = path.with_name(path.name + ".part")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        part.unlink(missing_ok=True)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(part, path)
    except OSError as e:  # a read-only home: the next run is only slower
        logger.debug("not saving the facts wanted by %s: %s", host.name, e)


# --- reading many facts in one command ---------------------------------------------------------


def shell_text(command) -> str | None:
    """A fact's command as shell text, or None if it hides a secret (it would be logged)."""
    if command is None or isinstance(command, str):
        return command
    if isinstance(command, pyinfra_command.StringCommand):
        raw = command.get_raw_value()
        return raw if raw == command.get_masked_value() else None
    return None


def batch_script(commands: list[str]) -> str:
    """Each command in a subshell between markers that carry its exit status."""
    parts = []
    for i, command in enumerate(commands):
        parts.append(f"echo '{MARK} {i}'; ( {command} ) 2>/dev/null; printf '\\n{MARK} {i} rc=%s\\n' \"$?\"")
    return "\n".join(parts)


def parse_batch(lines: list[str]) -> dict[int, tuple[int, list[str]]]:
    """{index: (exit status, stdout lines as pyinfra would have read them)}."""
    results: dict[int, tuple[int, list[str]]] = {}
    current: int | None = None
    body: list[str] = []
    for line in lines:
        if line.startswith(MARK + " "):
            rest = line[len(MARK) + 1 :]
            index, sep, rc = rest.partition(" rc=")
            if sep and current is not None and index == str(current):
                if body and body[-1] == "":
                    body.pop()  # the newline printed before the end marker
                results[current] = (int(rc), body)
                current, body = None, []
            elif not sep and index.isdigit():
                current, body = int(index), []
            continue
        if current is not None:
            body.append(line)
    return results


def _fact_command(state, host, cls, args, kwargs):
    """(cache key, fact, shell text, connector kwargs) as pyinfra's get_fact would run it, or
    None. `process` must be called on the same fact object: some keep their arguments on it."""
    fact = cls()
    if fact.shell_executable or fact.check_preconditions(state, host):
        return None
    fact_kwargs, connector_kwargs = resolve(state, host, cls, args, kwargs)
    key = key_of(cls, fact_kwargs, connector_kwargs)
    text = shell_text(_make_command(fact.command, dict(fact_kwargs)))
    requires_command = _make_command(fact.requires_command, dict(fact_kwargs))
    requires = shell_text(requires_command)
    if key is None or text is None or (requires_command is not None and requires is None):
        return None
    if requires:
        text = f"command -v {requires} >/dev/null 2>&1 || exit 127; {text}"
    return key, fact, text, connector_kwargs


def read_batch(state, host, wanted: list[tuple]) -> int:
    """Read `wanted` facts on `host` in one command into its cache; how many were cached.

    All of them run with one set of connector arguments (those of the first) and are cached
    under it: a later read with other arguments (an operation's `_sudo`) misses and reads."""
    commands: list[str] = []
    facts: list[tuple[tuple, Any]] = []
    connector_kwargs = None
    for cls, args, kwargs in wanted:
        try:
            made = _fact_command(state, host, cls, args, kwargs)
        except Exception as e:  # arguments a fact no longer takes
            logger.debug("%s: not batching %s: %s", host.name, cls.__name__, e)
            continue
        if made is None or made[0] in _cache(host):
            continue
        key, fact, text, kwargs_of_fact = made
        if connector_kwargs is None:
            connector_kwargs = kwargs_of_fact
        elif kwargs_of_fact != connector_kwargs:
            continue
        commands.append(text)
        facts.append((key, fact))
    if not commands:
        return 0
    status, output = host.run_shell_command(
        pyinfra_command.StringCommand(batch_script(commands)),
        print_output=False,
        print_input=False,
        **(connector_kwargs or {}),
    )
    if not status:
        return 0
    cached = 0
    for index, (rc, lines) in parse_batch(output.stdout_lines).items():
        key, fact = facts[index]
        if rc != 0:
            continue  # pyinfra's own read decides what a failure means
        try:
            value = fact.process(lines) if lines else fact.default()
        except Exception:
            continue
        _cache(host)[key] = value
        cached += 1
    return cached


def _read_batch_quietly(state, host, done: gevent.event.Event) -> None:
    try:
        count = read_batch(state, host, load_wanted(host))
        logger.debug("%s: %s facts read in one command", host.name, count)
    except Exception as e:  # never worse than no batch: the usual reads follow
        logger.debug("%s: batch read failed: %s", host.name, e)
    finally:
        done.set()


def prefetch(state, host) -> None:
    """Before a host's first fact, its batch read. pyinfra plans the hosts concurrently, so the
    first host to ask starts the batch of every connected host at once, and each host waits for
    its own."""
    done = getattr(host, _BATCHED_ATTR, None)
    if done is None and state is not None:
        for h in list(state.inventory):
            if h.connected and getattr(h, _BATCHED_ATTR, None) is None:
                event = gevent.event.Event()
                setattr(h, _BATCHED_ATTR, event)
                # Not state.pool: the planning greenlets may fill it, and wait here.
                gevent.spawn(_read_batch_quietly, state, h, event)
        done = getattr(host, _BATCHED_ATTR, None)
    if done is not None:
        done.wait()


# --- pyinfra hooks ---------------------------------------------------------------------------


def _cached_get_fact(original):
    def get_fact(self, name_or_cls, *args, **kwargs):
        state = getattr(self, "state", None)
        key = cache_key(state, self, name_or_cls, args, kwargs) if cacheable(name_or_cls) else None
        if key is None:
            return original(self, name_or_cls, *args, **kwargs)
        entries = wanted_entries(name_or_cls, args, kwargs)
        if entries:
            wanted = getattr(self, _WANTED_ATTR, None)
            if wanted is None:
                wanted = set()
                setattr(self, _WANTED_ATTR, wanted)
            wanted.update(entries)
        prefetch(state, self)
        cache = _cache(self)
        if key not in cache:
            cache[key] = original(self, name_or_cls, *args, **kwargs)
        return cache[key]

    return get_fact


def _forgetting_execute(original):
    def execute(self, state, host, connector_arguments):
        forget(host)
        try:
            return original(self, state, host, connector_arguments)
        finally:
            forget(host)  # what the command changed is visible to the next read

    return execute


def patch() -> None:
    """Idempotent: wraps Host.get_fact and the command classes' execute once per process."""
    wrap_once(Host, "get_fact", _cached_get_fact)
    for cls in COMMAND_CLASSES:
        wrap_once(cls, "execute", _forgetting_execute)


class SaveWanted(BaseStateCallback):
    @staticmethod
    def host_disconnect(state, host):
        # A reboot disconnects its host mid-run too: save at the final disconnect only.
        if state.current_stage == StateStage.Disconnect:
            save_wanted(host)
