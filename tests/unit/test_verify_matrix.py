"""The verify matrix plugin (tests/verify/matrix.py), run in-process by pytester on fake checks.

The fake cluster has three nodes on loopback addresses; gpu-2's SSH port is a closed local
port, so its checks fail with a real paramiko NoValidConnectionsError (connection refused), the
way an unreachable node does. No root, no lab.
"""

import ast
import itertools
import socket
from pathlib import Path

import paramiko
import pytest

from tests.verify import matrix
from tests.verify.hints import FALLBACK, HINTS, hint_for

pytest_plugins = ["pytester"]

VERIFY = Path(__file__).resolve().parents[1] / "verify"

CONFTEST = """
import collections
import pytest
import testinfra

Node = collections.namedtuple("Node", "hostname address port roles")
NODES = [
    Node("n1", "127.0.0.11", None, ("master",)),
    Node("gpu-1", "127.0.0.12", None, ("agent",)),
    Node("gpu-2", "127.0.0.13", {port}, ("agent",)),
]
ROLE_FIXTURES = {{"node": None, "peer": None, "agent": "agent"}}


def pytest_generate_tests(metafunc):
    for fixture, role in ROLE_FIXTURES.items():
        if fixture in metafunc.fixturenames:
            nodes = [n for n in NODES if role is None or role in n.roles]
            metafunc.parametrize(fixture, nodes, ids=[n.hostname for n in nodes], scope="session")


@pytest.fixture(scope="session")
def host_of():
    def get(node):
        if node.port:  # gpu-2: a real paramiko connection to a closed port
            return testinfra.get_host(f"paramiko://root@{{node.address}}:{{node.port}}", timeout=2)
        return testinfra.get_host("local://")
    return get
"""

CHECKS = """
import socket
import pytest


def test_hostname(node, host_of):
    assert host_of(node).run("true").rc == 0


def test_ib_ports_active(node, host_of):
    host_of(node).run("true")
    assert node.hostname != "gpu-1", "mlx5_0 port 1: State Down"


def test_driver_version_on_every_gpu(agent, host_of):
    assert host_of(agent).run("true").rc == 0


def test_reaches_peer_on_ipoib(node, peer, host_of):
    host_of(node).run("true")
    assert (node.hostname, peer.hostname) != ("gpu-1", "n1"), f"cannot reach {{peer.hostname}}-ib0"


def test_secret_files_are_0600_root(node):
    if "master" not in node.roles:
        pytest.skip(f"{{node.hostname}} holds no secrets")


def test_minio_ready_from_controller(node):
    # A refused connection made by the check itself is a finding, not an unreachable node.
    if node.hostname == "n1":
        socket.create_connection((node.address, {port}), timeout=2)


def test_bucket_exists_in_region():
    pass


def test_brand_new_check(node):
    assert node.hostname != "n1", "something new broke"


@pytest.fixture(scope="module")
def registered():
    raise AssertionError("login as admin -> 503")


def test_agent_registered_with_its_slots(agent, registered):
    pass
"""

EXPECTED_ROWS = [
    "| check | n1 | gpu-1 | gpu-2 | (cluster) |",
    "|---|---|---|---|---|",
    "| `test_fake.py::test_hostname` | ok | ok | **SSH** | n/a |",
    "| `test_fake.py::test_ib_ports_active` | ok | **FAIL** | **SSH** | n/a |",
    "| `test_fake.py::test_driver_version_on_every_gpu` | n/a | ok | **SSH** | n/a |",
    "| `test_fake.py::test_reaches_peer_on_ipoib` | ok | **FAIL** | **SSH** | n/a |",
    "| `test_fake.py::test_secret_files_are_0600_root` | ok | skip | skip | n/a |",
    "| `test_fake.py::test_minio_ready_from_controller` | **FAIL** | ok | ok | n/a |",
    "| `test_fake.py::test_bucket_exists_in_region` | n/a | n/a | n/a | ok |",
    "| `test_fake.py::test_brand_new_check` | **FAIL** | ok | ok | n/a |",
    "| `test_fake.py::test_agent_registered_with_its_slots` | n/a | **FAIL** | **FAIL** | n/a |",
]


def closed_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_checks(pytester):
    port = closed_port("127.0.0.13")
    pytester.makeconftest(CONFTEST.format(port=port))
    pytester.makepyfile(test_fake=CHECKS.format(port=closed_port("127.0.0.11")))
    return port


def run_verify(pytester, *args):
    # The warning: this module imported the plugin before the inner run could rewrite it.
    result = pytester.runpytest(
        "-p",
        "tests.verify.matrix",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        *args,
    )
    return result, (pytester.path / "reports" / "verify-matrix.md").read_text()


def section(markdown: str, title: str) -> list[str]:
    lines = markdown.splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [line for line in lines[start:end] if line]


def test_matrix_markdown_and_terminal(pytester, fake_checks):
    result, md = run_verify(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED

    assert [r for r in section(md, "Checks x nodes") if r.startswith("|")] == EXPECTED_ROWS
    nodes = section(md, "Nodes")
    assert nodes[0] == "| node | status | ok | FAIL | SSH | n/p | skip | why |"
    assert nodes[2] == (
        "| n1 | **FAIL** | 4 | 2 | 0 | 0 | 0 | test_minio_ready_from_controller, test_brand_new_check |"
    )
    assert nodes[3] == (
        "| gpu-1 | **FAIL** | 4 | 3 | 0 | 0 | 1 | test_ib_ports_active, "
        "test_reaches_peer_on_ipoib, test_agent_registered_with_its_slots |"
    )
    assert nodes[4].startswith(
        f"| gpu-2 | **UNREACHABLE** | 2 | 1 | 4 | 0 | 1 | SSH to 127.0.0.13:"
        f"{fake_checks}: connection refused: node up but nothing on the SSH"
    )
    assert nodes[5] == "| (cluster) | ok | 1 | 0 | 0 | 0 | 0 |  |"

    red = "\n".join(section(md, "Red cells: symptom and first thing to do"))
    assert f"| (every check over SSH) | gpu-2 | SSH to 127.0.0.13:{fake_checks}: connection refused |" in red
    assert (
        "| `test_fake.py::test_ib_ports_active` | gpu-1 | ib0 port Down (State Initializing "
        "= no subnet manager): 'AllReduce timeout' | check cabling and the subnet manager "
        "(ibstat, iblinkinfo); reseat fibre / SFP | `mlx5_0 port 1: State Down` |"
    ) in red
    # Cross-node: the source node's row, the peer in the detail (ids "gpu-1-n1" are not parsed).
    assert "| `test_fake.py::test_reaches_peer_on_ipoib` | gpu-1 |" in red
    assert "`peer n1: cannot reach n1-ib0`" in red
    assert "ConnectionRefusedError" in red  # the check's own refused connection: a finding
    assert f"| `test_fake.py::test_brand_new_check` | n1 | {FALLBACK.symptom} |" in red
    # A fixture that failed: the check's own symptom was never tested, say so.
    assert (
        "| `test_fake.py::test_agent_registered_with_its_slots` | gpu-2 | setup failed, the "
        "check did not run | fix what the setup error says first; then: journalctl -u "
        "determined-agent on gpu-2;"
    ) in red
    assert "`login as admin -> 503`" in red
    assert [line for line in red.splitlines() if "| gpu-2 |" in line and "SSH" not in line] == [
        line for line in red.splitlines() if "test_agent_registered_with_its_slots` | gpu-2" in line
    ]

    out = result.stdout.str()
    assert "verify matrix: 9 checks x 3 nodes" in out
    result.stdout.fnmatch_lines(
        [
            " *n1 *gpu-1 *gpu-2 *cluster",
            "test_fake.py",
            "  hostname *ok *ok *SSH *n/a",
            "  ib_ports_active *ok *FAIL *SSH *n/a",
            f"UNREACHABLE gpu-2: SSH to 127.0.0.13:{fake_checks}: connection refused",
            "    first: node up but nothing on the SSH port*",
            "FAIL test_ib_ports_active on gpu-1: ib0 port Down*",
            "    first: check cabling and the subnet manager (ibstat, iblinkinfo)*",
            "    seen on gpu-1: mlx5_0 port 1: State Down",
            "matrix: *reports/verify-matrix.md",
            # The summary line: the dead node first, with the first thing to look at.
            "UNREACHABLE gpu-2 (SSH to *: connection refused): first: node up but nothing on the "
            "SSH port* -- wall time *: 11 ok, 6 FAIL, 0 n/p, 2 skip, 1 unreachable nodes",
        ]
    )
    # One line per SSH failure, not a paramiko traceback each.
    assert "paramiko/client.py" not in out
    result.stdout.fnmatch_lines(
        [
            "*_ test_hostname?gpu-2? _*",
            (
                f"SSH to 127.0.0.13:{fake_checks}: connection refused  "
                "[[]paramiko.ssh_exception.NoValidConnectionsError: *]"
            ),
        ]
    )


def test_same_matrix_under_xdist(pytester, fake_checks):
    serial, md_serial = run_verify(pytester)
    parallel, md_parallel = run_verify(pytester, "-n", "2")
    assert parallel.ret == serial.ret == pytest.ExitCode.TESTS_FAILED
    assert "2 workers" in parallel.stdout.str()
    for title in ("Nodes", "Checks x nodes", "Red cells: symptom and first thing to do"):
        assert section(md_parallel, title) == section(md_serial, title)
    parallel.stdout.fnmatch_lines([f"UNREACHABLE gpu-2: SSH to 127.0.0.13:{fake_checks}: *"])


NOT_PROBED_CHECKS = """
import pytest
from tests.verify.matrix import NOT_PROBED_PREFIX, P_NOT_PROBED


def test_reaches_peer_on_management(node, record_property):
    if node.hostname == "gpu-1":
        why = "could not probe its peers: python3 -c PROBE: SSHException: Timeout opening channel."
        record_property(P_NOT_PROBED, why)
        pytest.skip(NOT_PROBED_PREFIX + why)


def test_secret_files_are_0600_root(node):
    if node.hostname != "n1":
        pytest.skip("holds no secrets")  # a plain skip stays a skip
{extra}
"""


@pytest.fixture
def not_probed_checks(pytester):
    def write(extra: str = "") -> None:
        pytester.makeconftest(CONFTEST.format(port=closed_port("127.0.0.13")))
        pytester.makepyfile(test_np=NOT_PROBED_CHECKS.format(extra=extra))

    return write


def test_not_probed_is_its_own_state_and_exit_status(pytester, not_probed_checks):
    not_probed_checks()
    result, md = run_verify(pytester)
    assert result.ret == matrix.EXIT_NOT_PROBED  # nothing failed, but not everything was looked at
    assert "- result: **n/p** (pytest exit status 10):" in md
    assert [r for r in section(md, "Checks x nodes") if r.startswith("|")][2:] == [
        "| `test_np.py::test_reaches_peer_on_management` | ok | **n/p** | ok |",
        "| `test_np.py::test_secret_files_are_0600_root` | ok | skip | skip |",
    ]
    nodes = section(md, "Nodes")
    assert nodes[0] == "| node | status | ok | FAIL | SSH | n/p | skip | why |"
    assert nodes[3] == "| gpu-1 | **n/p** | 0 | 0 | 0 | 1 | 1 | not probed: test_reaches_peer_on_management |"
    assert section(md, "Red cells: symptom and first thing to do") == ["None."]
    unprobed = section(md, "Not probed: the node answered, the check could not look")
    assert unprobed[2].startswith(
        "| `test_np.py::test_reaches_peer_on_management` | gpu-1 | `could not probe its peers: "
        "python3 -c PROBE: SSHException: Timeout opening channel.` | the reason in the detail;"
    )
    assert "load on gpu-1" in unprobed[2]
    result.stdout.fnmatch_lines(
        [
            "  reaches_peer_on_management *ok *n/p *ok",
            "NOT PROBED test_reaches_peer_on_management on gpu-1: not probed: the node answered SSH*",
            "    first: the reason in the detail;*",
            "    on gpu-1: could not probe its peers: python3 -c PROBE: SSHException: Timeout*",
            "wall time *: 3 ok, 0 FAIL, 1 n/p, 2 skip, 0 unreachable nodes",
        ]
    )
    # Under xdist (as python -m tests.verify runs): the property crosses to the controller.
    parallel, md_parallel = run_verify(pytester, "-n", "2")
    assert parallel.ret == matrix.EXIT_NOT_PROBED
    assert section(md_parallel, "Nodes") == nodes
    # Plain pytest (no matrix plugin): a skip whose reason says so, pytest's own exit status.
    plain = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    assert plain.ret == pytest.ExitCode.OK
    plain.stdout.fnmatch_lines(["SKIPPED *not probed: could not probe its peers: *"])


def test_a_failure_outranks_not_probed_in_the_exit_status(pytester, not_probed_checks):
    not_probed_checks("\n\ndef test_hostname(node):\n    assert node.hostname != 'n1', 'wrong name'\n")
    result, md = run_verify(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "- result: **FAIL** (pytest exit status 1):" in md and "1 red cells, 1 n/p cells" in md


def test_main_names_the_exit_statuses():
    from tests.verify.__main__ import run_verdict

    assert run_verdict(0) == "all checks passed"
    assert run_verdict(matrix.EXIT_NOT_PROBED).startswith("no check failed, but some cells were not probed")
    assert run_verdict(1) == "FAILED (exit status 1)"


def test_cross_node_cell_of_a_node_not_probed():
    """tests/verify/test_cross_node.py: n/p when nothing is blamed, FAIL (saying both) when its
    peers found a path to it broken."""
    from types import SimpleNamespace

    from tests.verify import test_cross_node

    class Seen:
        def __init__(self, blamed):
            self.blamed = blamed

        def blame_of(self, hostname, network):
            return self.blamed

        def not_probed(self, hostname):
            return "could not probe its peers: timed out"

    node, recorded = SimpleNamespace(hostname="g1"), []
    with pytest.raises(pytest.skip.Exception, match="^not probed: could not probe its peers: timed out$"):
        test_cross_node.test_reaches_peer_on_ipoib(node, Seen([]), lambda *p: recorded.append(p))
    assert recorded == [(matrix.P_NOT_PROBED, "could not probe its peers: timed out")]
    with pytest.raises(AssertionError, match=r"none of its 3 peers reach g1-ib0 \(its own probe did not run"):
        test_cross_node.test_reaches_peer_on_ipoib(
            node, Seen(["majority: none of its 3 peers reach g1-ib0"]), lambda *p: None
        )


def test_plain_pytest_run_is_unaffected(pytester, fake_checks):
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "verify matrix" not in result.stdout.str()
    assert not (pytester.path / "reports").exists()
    assert "paramiko" in result.stdout.str()  # tracebacks untouched


def test_all_green_exits_zero(pytester):
    pytester.makepyfile(test_green="def test_fine():\n    pass\n")
    result, md = run_verify(pytester)
    assert result.ret == pytest.ExitCode.OK
    assert "- result: **ok** (pytest exit status 0)" in md
    assert section(md, "Red cells: symptom and first thing to do") == ["None."]


def test_collection_error_is_reported(pytester):
    pytester.makepyfile(test_broken="import no_such_module_here\n")
    result, md = run_verify(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "no_such_module_here" in "\n".join(section(md, "Collection errors (no check ran from these)"))
    result.stdout.fnmatch_lines(
        [
            ("collection error: test_broken.py: ModuleNotFoundError: No module named 'no_such_module_here'"),
            "no check ran",
        ]
    )


# --- the SSH classifier on real paramiko failures ------------------------------------------


def _raised(fn):
    try:
        fn()
    except BaseException as e:
        return e
    raise AssertionError("did not raise")


def test_ssh_problem_refused():
    port = closed_port("127.0.0.1")
    client = paramiko.SSHClient()
    exc = _raised(
        lambda: client.connect("127.0.0.1", port, timeout=2, look_for_keys=False, allow_agent=False)
    )
    assert isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError)
    assert matrix.ssh_problem(exc) == (
        "refused",
        f"SSH to 127.0.0.1:{port}: connection refused",
        f"127.0.0.1:{port}",
    )


def test_ssh_problem_no_banner():
    # A listener that never speaks SSH: paramiko gives up waiting for the banner.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = paramiko.SSHClient()
        exc = _raised(
            lambda: client.connect(
                "127.0.0.1", port, timeout=2, banner_timeout=0.3, look_for_keys=False, allow_agent=False
            )
        )
    kind, reason, target = matrix.ssh_problem(exc)
    assert (kind, target) == ("timeout", f"127.0.0.1:{port}")
    assert reason.startswith(f"SSH to 127.0.0.1:{port}: no SSH banner")


def test_ssh_problem_ignores_connections_made_by_checks():
    exc = _raised(lambda: socket.create_connection(("127.0.0.1", closed_port("127.0.0.1")), 2))
    assert isinstance(exc, ConnectionRefusedError)
    assert matrix.ssh_problem(exc) is None
    assert matrix.ssh_problem(_raised(lambda: 1 / 0)) is None


def test_ssh_problem_auth_without_target():
    def fail():
        raise paramiko.AuthenticationException("Authentication failed.")

    assert matrix.ssh_problem(_raised(fail)) == ("auth", "SSH: authentication failed", None)


# --- hints ---------------------------------------------------------------------------------


def verify_check_names() -> set[str]:
    names = set()
    for path in VERIFY.glob("test_*.py"):
        tree = ast.parse(path.read_text(), str(path))
        names |= {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
    return names


def test_every_verify_check_has_a_hint():
    names = verify_check_names()
    assert len(names) > 30
    assert sorted(names - set(HINTS)) == [], "add a Hint to tests/verify/hints.py"
    assert sorted(set(HINTS) - names) == [], "hint for a check that no longer exists"


def test_hint_lookup():
    assert hint_for("test_gpu_stack.py::test_ib_ports_active") == HINTS["test_ib_ports_active"]
    assert hint_for("test_x.py::test_unknown", "n7") == FALLBACK.format("n7")
    assert "journalctl -u determined-agent on lab-gpu2" in hint_for("test_agent_service", "lab-gpu2").action


def test_report_message_first_line():
    class Crash:
        message = "AssertionError: lab-gpu1 -> lab-gpu2\nassert False"

    class Repr:
        reprcrash = Crash()

    class Report:
        longrepr = Repr()

    assert matrix.report_message(Report()) == "lab-gpu1 -> lab-gpu2"
    Crash.message = (
        "assert (True and False)\n +  where True = <service x>.is_enabled\n"
        " +  and   False = <service x>.is_running"
    )
    assert matrix.report_message(Report()) == "assert (True and False) (where True = <service x>.is_enabled)"
    # testinfra's check_output failure: the command, its exit status and its last stderr line.
    Crash.message = (
        "Unexpected exit code 127 for CommandResult(backend=<testinfra.backend."
        "paramiko.ParamikoBackend object at 0x7f>, exit_status=127, command=b'ibstat"
        " -l', _stdout=b'', _stderr=b\"x\\nbash: line 1: ibstat: command not found"
        '\\n")'
    )
    assert matrix.report_message(Report()) == "ibstat -l -> exit 127: bash: line 1: ibstat: command not found"
    Report.longrepr = ("f.py", 3, "Skipped: no secrets")
    assert matrix.report_message(Report()) == "no secrets"


def test_main_loads_the_plugin_and_keeps_user_args():
    from tests.verify.__main__ import pytest_command

    cmd = pytest_command("c.yaml", "4", Path("/r"), ["-k", "gpu"])
    assert ("-p", "tests.verify.matrix") in list(itertools.pairwise(cmd))
    assert "--verify-matrix=/r/verify-matrix.md" in cmd and "--tb=short" in cmd
    assert cmd[-2:] == ["-k", "gpu"]
    assert "--tb=short" not in pytest_command("c.yaml", "4", Path("/r"), ["--tb=long"])


def test_seen_lines_name_each_node_in_cluster_order():
    import json

    from tests.verify.matrix import seen_lines

    values = [
        json.dumps({"what": "IPoIB interface", "node": "lab-gpu3", "value": "ibp65s0 (netplan)"}),
        json.dumps({"what": "IPoIB interface", "node": "lab-master", "value": "ib0"}),
        json.dumps({"what": "IPoIB interface", "node": "lab-master", "value": "ib0 mtu 2044 (ifupdown)"}),
    ]
    assert seen_lines(values, {"lab-master": 0, "lab-gpu3": 3}) == [
        "--> IPoIB interface: lab-master ib0 mtu 2044 (ifupdown), lab-gpu3 ibp65s0 (netplan)"
    ]
    assert seen_lines([]) == []
