"""deploy/pyinfra_ext/factcache.py against the installed pyinfra: the upgrade gate of the cache.

Most checks here run pyinfra's own code (the @local connector, pyinfra's get_fact, its
argument handling), so a pyinfra release that changes what the cache relies on fails here
before TESTED_PYINFRA in deploy/pyinfra_ext/__init__.py is raised.
"""

import json
import os
import stat
import subprocess
from types import SimpleNamespace

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.api.connect import connect_all
from pyinfra.api.facts import FactBase, get_fact
from pyinfra.connectors.util import CommandOutput
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Block, Directory, File, FindInFile, Sha1File
from pyinfra.facts.server import Date, Hostname, Which

from deploy.pyinfra_ext import factcache


@pytest.fixture
def hosts():
    """Two SSH hosts that are never connected: keys and the wrapper need no connection."""
    inventory = Inventory((["a", "b"], {}))
    state = State(inventory, Config())
    return state, inventory.get_host("a"), inventory.get_host("b")


def counting_get_fact():
    reads = []

    def original(host, cls, *args, **kwargs):
        reads.append((host.name, cls, args, kwargs))
        return len(reads)

    return factcache._cached_get_fact(original), reads


def in_operation(state, host, **global_arguments):
    """What pyinfra sets while an operation with these global arguments is planned or run."""
    host.current_op_global_arguments = pop_global_arguments(state, host, dict(global_arguments))[0]


def test_cached_until_a_command_runs_on_that_host(hosts):
    state, a, b = hosts
    get_fact_, _ = counting_get_fact()
    execute = factcache._forgetting_execute(lambda command, state, host, args: "ran")

    assert get_fact_(a, DebPackages) == get_fact_(a, DebPackages) == 1
    assert get_fact_(b, DebPackages) == 2  # per host
    assert get_fact_(a, File, path="/x") == get_fact_(a, File, path="/x") == 3
    assert get_fact_(a, File, "/x") == 3  # bound to the fact's signature, as pyinfra does
    assert get_fact_(a, File, path="/y") == 4  # other arguments, other fact
    assert execute(None, state, a, {}) == "ran"
    assert get_fact_(a, DebPackages) == 5  # re-read after a change on a
    assert get_fact_(b, DebPackages) == 2  # b did not change


def test_a_clock_and_unhashable_arguments_are_never_cached(hosts):
    _, a, _ = hosts
    get_fact_, _ = counting_get_fact()
    assert get_fact_(a, Date) != get_fact_(a, Date)
    assert get_fact_(a, File, path={"/x"}) != get_fact_(a, File, path={"/x"})
    # Lists (systemd facts take services=[...]) are cached, by value.
    assert get_fact_(a, Which, command=["a", "b"]) == get_fact_(a, Which, command=["a", "b"])


def test_connector_arguments_are_part_of_the_key(hosts):
    """A read as root and one as the login user are different facts (pyinfra 2.x's own cache
    hashed the executor arguments too); so are reads with another env, shell or directory."""
    state, a, _ = hosts
    get_fact_, reads = counting_get_fact()
    plain = get_fact_(a, File, path="/x")
    assert get_fact_(a, File, path="/x", _sudo=True) != plain
    assert get_fact_(a, File, path="/x", _sudo=True) == 2  # cached under its own key
    # Inside an operation, its global arguments apply to every fact it reads.
    in_operation(state, a, _sudo=True)
    try:
        assert get_fact_(a, File, path="/x") == 2
        assert get_fact_(a, File, path="/x", _sudo=False) == plain  # a per-call override wins
    finally:
        a.current_op_global_arguments = None
    assert get_fact_(a, File, path="/x") == plain
    assert len(reads) == 2

    base = factcache.cache_key(state, a, File, (), {"path": "/x"})
    variants = {
        "_sudo": True,
        "_sudo_user": "postgres",
        "_use_sudo_login": True,
        "_preserve_sudo_env": True,
        "_su_user": "nobody",
        "_shell_executable": "bash",
        "_chdir": "/tmp",
        "_env": {"LANG": "C"},
    }
    keys = {
        name: factcache.cache_key(state, a, File, (), {"path": "/x", name: v}) for name, v in variants.items()
    }
    assert base is not None and None not in keys.values()
    assert len({base, *keys.values()}) == len(variants) + 1, keys


def test_the_key_holds_what_pyinfra_runs_the_read_with(local_state, monkeypatch):
    """Contract: the connector arguments in the key are those pyinfra's get_fact hands the
    connector, operation arguments and per-call overrides merged the same way."""
    state, host = local_state
    seen = []

    def run_shell_command(command, print_output=False, print_input=False, **kwargs):
        seen.append(kwargs)
        return True, CommandOutput([])

    monkeypatch.setattr(host, "run_shell_command", run_shell_command)
    call = {"path": "/x", "_su_user": "nobody"}
    in_operation(state, host, _sudo=True, _env={"A": "1"})
    try:
        get_fact(state, host, File, kwargs=dict(call))
        _, connector_kwargs = factcache.resolve(state, host, File, (), call)
    finally:
        host.current_op_global_arguments = None
    assert seen == [connector_kwargs]
    assert (connector_kwargs["_sudo"], connector_kwargs["_su_user"]) == (True, "nobody")
    assert connector_kwargs["_env"]["A"] == "1"


def test_wanted_entries_round_trip_only_what_json_keeps():
    assert factcache.wanted_entry(File, (), {"path": "/x"}) is not None
    assert factcache.wanted_entry(File, (), {"paths": ("/x", "/y")}) is not None  # as a list
    assert factcache.wanted_entry(File, (), {"path": object()}) is None
    assert factcache.wanted_entry(File, (), {"path": "/x", "_sudo": True}) is None


def test_wanted_facts_are_saved_per_host_and_loaded_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host = SimpleNamespace(name="gpu1", data={"ssh_hostname": "10.0.0.1"})
    setattr(
        host,
        factcache._WANTED_ATTR,
        {
            factcache.wanted_entry(File, (), {"path": "/etc/hosts"}),
            factcache.wanted_entry(DebPackages, (), {}),
        },
    )
    factcache.save_wanted(host)
    assert factcache.record_path(host).parent == tmp_path / "gpu-cluster" / "facts"
    assert sorted(factcache.load_wanted(host), key=str) == sorted(
        [(DebPackages, (), {}), (File, (), {"path": "/etc/hosts"})], key=str
    )
    # A fact class that no longer exists is dropped, not an error.
    factcache.record_path(host).write_text('[["pyinfra.facts.files:Gone", [], {}]]')
    assert factcache.load_wanted(host) == []
    other = SimpleNamespace(name="gpu2", data={})
    assert factcache.load_wanted(other) == []


def lines_as_pyinfra_reads_them(command: str) -> tuple[int, list[str]]:
    out = subprocess.run(["sh", "-c", command], check=False, capture_output=True, text=True)
    return out.returncode, [line.rstrip("\n") for line in out.stdout.splitlines(keepends=True)]


@pytest.mark.parametrize(
    "commands",
    [
        ["printf 'a\\nb\\n'", "printf 'no newline'", "true", "printf '\\n'", "printf 'x\\n\\n'"],
        ["exit 3", "echo kept; false", "echo after"],
        ["echo '--8<-- gpu-cluster fact 7'", "echo ok"],  # a marker look-alike in the output
    ],
)
def test_batch_output_splits_into_what_each_command_alone_gives(commands):
    script = factcache.batch_script(commands)
    out = subprocess.run(["sh", "-c", script], check=False, capture_output=True, text=True).stdout
    parsed = factcache.parse_batch([line.rstrip("\n") for line in out.splitlines(keepends=True)])
    for i, command in enumerate(commands):
        if "fact 7" in command:
            continue  # its output is its own business; the next fact must still be right
        assert parsed[i] == lines_as_pyinfra_reads_them(command), command


@pytest.fixture
def local_state():
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    return state, inventory.get_host("@local")


def test_a_batch_reads_the_same_values_as_pyinfra_fact_by_fact(local_state, tmp_path):
    state, host = local_state
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n# BEGIN m\n10.0.0.1 a\n# END m\n")
    (tmp_path / "dir").mkdir()
    wanted = [
        (Sha1File, (), {"path": str(tmp_path / "hosts")}),
        (Sha1File, (), {"path": str(tmp_path / "missing")}),
        (File, (), {"path": str(tmp_path / "hosts")}),
        (Directory, (), {"path": str(tmp_path / "dir")}),
        (Directory, (), {"path": str(tmp_path / "missing")}),
        (FindInFile, (), {"path": str(tmp_path / "hosts"), "pattern": "^10\\."}),
        (Block, (), {"path": str(tmp_path / "hosts"), "marker": "# {mark} m"}),
        (Which, (), {"command": "sh"}),
        (Hostname, (), {}),
    ]
    assert factcache.read_batch(state, host, wanted) == len(wanted)
    cache = factcache._cache(host)
    for cls, args, kwargs in wanted:
        expected = get_fact(state, host, cls, args=list(args), kwargs=dict(kwargs))
        assert cache[factcache.cache_key(state, host, cls, args, kwargs)] == expected, (cls, kwargs)


class Failing(FactBase):
    def command(self):
        return "echo partial; exit 2"


class NeedsMissingTool(FactBase):
    requires_command = "no-such-tool-gpu-cluster"

    def command(self):
        return "no-such-tool-gpu-cluster --list"


def test_a_fact_the_batch_cannot_read_is_left_to_pyinfra(local_state):
    state, host = local_state
    wanted = [(Failing, (), {}), (NeedsMissingTool, (), {}), (Hostname, (), {})]
    assert factcache.read_batch(state, host, wanted) == 1
    cache = factcache._cache(host)
    assert factcache.cache_key(state, host, Failing, (), {}) not in cache
    assert factcache.cache_key(state, host, NeedsMissingTool, (), {}) not in cache
    assert factcache.cache_key(state, host, Hostname, (), {}) in cache
    # Read without sudo: an operation reading it with sudo does not get that value.
    assert factcache.cache_key(state, host, Hostname, (), {"_sudo": True}) not in cache


def test_a_file_read_predicts_its_checksum_read():
    entries = factcache.wanted_entries(File, (), {"path": "/etc/x"})
    assert entries == [
        factcache.wanted_entry(File, (), {"path": "/etc/x"}),
        factcache.wanted_entry(Sha1File, (), {"path": "/etc/x"}),
    ]
    assert factcache.wanted_entries(Directory, (), {"path": "/etc"}) == [
        factcache.wanted_entry(Directory, (), {"path": "/etc"})
    ]


# --- the file of wanted facts is code the next run executes: what it may name ---------------


def saved_host(tmp_path, monkeypatch, entries):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host = SimpleNamespace(name="gpu1", data={"ssh_hostname": "10.0.0.1"})
    setattr(host, factcache._WANTED_ATTR, {factcache.wanted_entry(DebPackages, (), {})})
    factcache.save_wanted(host)
    factcache.record_path(host).write_text(json.dumps(entries))
    return host


def test_the_file_is_written_0600_in_a_0700_directory(tmp_path, monkeypatch):
    host = saved_host(tmp_path, monkeypatch, [["pyinfra.facts.deb:DebPackages", [], {}]])
    path = factcache.record_path(host)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert factcache.load_wanted(host) == [(DebPackages, (), {})]


@pytest.mark.parametrize(
    "name",
    [
        "pyinfra.facts.server:Command",  # runs its argument as root
        "pyinfra.facts.apt:SimulateOperationWillChange",  # an apt-get command line
        "os:system",
        "subprocess:Popen",
        "tests.unit.test_factcache:Planted",  # a FactBase outside the allowed modules
        "pyinfra.facts.server:Hostname.__init__.__globals__",
    ],
)
def test_a_planted_fact_class_is_not_run(tmp_path, monkeypatch, name):
    host = saved_host(tmp_path, monkeypatch, [[name, ["id > /tmp/pwned"], {}], [name, [], {"command": "id"}]])
    assert factcache.load_wanted(host) == []


class Planted(FactBase):
    def command(self):
        return "id"


def test_a_pyinfra_fact_the_toolkit_does_not_read_is_not_run(tmp_path, monkeypatch):
    """PipPackages runs its `pip` argument: a plain path that every argument check accepts."""
    host = saved_host(tmp_path, monkeypatch, [["pyinfra.facts.pip:PipPackages", [], {"pip": "/var/tmp/x"}]])
    assert factcache.load_wanted(host) == []


def test_every_fact_the_lab_deploy_reads_is_allowed():
    """The pyinfra facts a lab deploy recorded (pyinfra 3.10, this toolkit's roles): each one
    on the allow-list, or the next run reads it the slow way."""
    recorded = {
        "pyinfra.facts.deb:DebPackages",
        "pyinfra.facts.docker:DockerImage",
        "pyinfra.facts.files:Block",
        "pyinfra.facts.files:Directory",
        "pyinfra.facts.files:File",
        "pyinfra.facts.files:FileContents",
        "pyinfra.facts.files:FindInFile",
        "pyinfra.facts.files:Link",
        "pyinfra.facts.files:Sha1File",
        "pyinfra.facts.files:Sha256File",
        "pyinfra.facts.postgres:PostgresDatabases",
        "pyinfra.facts.server:Groups",
        "pyinfra.facts.server:Hostname",
        "pyinfra.facts.server:Kernel",
        "pyinfra.facts.server:KernelVersion",
        "pyinfra.facts.server:LinuxDistribution",
        "pyinfra.facts.server:Os",
        "pyinfra.facts.server:Port",
        "pyinfra.facts.server:Users",
        "pyinfra.facts.server:Which",
        "pyinfra.facts.systemd:SystemdEnabled",
        "pyinfra.facts.systemd:SystemdStatus",
    }
    assert recorded <= factcache.PYINFRA_FACTS
    assert all(factcache.fact_class(name) is not None for name in factcache.PYINFRA_FACTS)


@pytest.mark.parametrize(
    "entry",
    [
        ["pyinfra.facts.files:File", [], {"path": "/x; id"}],  # text pyinfra may not quote
        ["pyinfra.facts.files:File", [], {"path": "$(id)"}],
        ["pyinfra.facts.files:FindFiles", [], {"path": "/etc", "args": ["-exec", "id", ";"]}],
        [
            "pyinfra.facts.files:FindInFile",
            [],
            {"path": "/x", "pattern": "$(id)", "interpolate_variables": True},
        ],
        ["pyinfra.facts.files:Block", [], {"path": "/x", "marker": 'x/ {system("id")} /'}],
        ["pyinfra.facts.files:File", [], {"path": "/x", "_sudo": True}],  # connector arguments
        ["pyinfra.facts.files:File", [], {"path": {"nested": "dict"}}],
        # An option where the command takes a path: `find -delete -type f` (the review's L1).
        ["pyinfra.facts.files:FindFiles", [], {"path": "-delete"}],
        ["pyinfra.facts.files:FindFiles", ["-delete"], {}],
        ["pyinfra.facts.files:File", [], {"path": "relative/x"}],
        ["pyinfra.facts.files:FindFiles", [], {"path": "/etc", "quote_path": False}],
        ["pyinfra.facts.files:FindFiles", [], {"path": "/etc", "fname": "-newer"}],
        ["pyinfra.facts.deb:DebPackage", ["-x"], {}],
        ["pyinfra.facts.files:File", [], {"path": "/x", "no_such_argument": 1}],
        "not an entry",
    ],
)
def test_entries_with_unsafe_arguments_are_left_out(tmp_path, monkeypatch, entry):
    host = saved_host(tmp_path, monkeypatch, [entry, ["pyinfra.facts.deb:DebPackages", [], {}]])
    assert factcache.load_wanted(host) == [(DebPackages, (), {})]


def test_arguments_pyinfra_quotes_may_hold_any_printable_text(tmp_path, monkeypatch):
    entries = [
        ["pyinfra.facts.files:FindInFile", [], {"path": "/etc/hosts", "pattern": r"^127\.0\.1\.1\s.*$"}],
        ["pyinfra.facts.files:Block", [], {"path": "/etc/hosts", "marker": "# {mark} managed hosts"}],
        ["pyinfra.facts.server:Which", [], {"command": "hostnamectl"}],
        ["pyinfra.facts.files:FindFiles", [], {"path": "/etc/netplan", "quote_path": True}],
        ["pyinfra.facts.files:FindInFile", [], {"path": "/etc/hosts", "pattern": "-x"}],  # after -e
    ]
    host = saved_host(tmp_path, monkeypatch, entries)
    assert [cls.__name__ for cls, _, _ in factcache.load_wanted(host)] == [
        "FindInFile",
        "Block",
        "Which",
        "FindFiles",
        "FindInFile",
    ]


@pytest.mark.parametrize("target", ["file", "directory"])
def test_a_file_others_may_write_is_ignored(tmp_path, monkeypatch, target):
    host = saved_host(tmp_path, monkeypatch, [["pyinfra.facts.deb:DebPackages", [], {}]])
    path = factcache.record_path(host)
    (path if target == "file" else path.parent).chmod(0o666 if target == "file" else 0o777)
    assert factcache.load_wanted(host) == []


def test_a_file_of_another_owner_is_ignored(tmp_path, monkeypatch):
    host = saved_host(tmp_path, monkeypatch, [["pyinfra.facts.deb:DebPackages", [], {}]])
    monkeypatch.setattr(factcache.os, "getuid", lambda: os.geteuid() + 1)
    assert factcache.load_wanted(host) == []
