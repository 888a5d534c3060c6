"""tests/verify checks who it talks to and keeps secrets out of its output: host keys as pyinfra
checks them (against an in-process SSH server), -l/--showlocals refused, quiet loggers."""

import contextlib
import logging
import socket
import threading
from types import SimpleNamespace

import paramiko
import pytest

from tests.verify import __main__ as verify_main
from tests.verify import conftest as verify_conftest
from tests.verify.matrix import ssh_problem

HOST_KEY = paramiko.RSAKey.generate(2048)
OTHER_KEY = paramiko.RSAKey.generate(2048)


LOGINS: list[str] = []


class NoLogin(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        LOGINS.append(username)
        return paramiko.AUTH_FAILED


@pytest.fixture
def sshd():
    """An SSH server on 127.0.0.1 with HOST_KEY that accepts no login: getting as far as the
    login means the host key was accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(HOST_KEY)
            with contextlib.suppress(paramiko.SSHException, EOFError):
                transport.start_server(server=NoLogin())

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()


def ssh(known_hosts, strict: bool, port: int, key_file=None):
    return SimpleNamespace(
        user="root",
        port=port,
        key_file=key_file,
        known_hosts_file=str(known_hosts),
        strict_host_key_checking=strict,
    )


def connect(settings):
    backend = verify_conftest.CheckedParamikoBackend(
        f"root@127.0.0.1:{settings.port}", ssh=settings, timeout=5
    )
    try:
        backend.client  # noqa: B018  (the cached property connects)
    except Exception as e:
        return e
    return None


def known_hosts(tmp_path, port, key):
    path = tmp_path / "known_hosts"
    path.write_text(f"[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}\n")
    return path


def test_the_known_key_gets_as_far_as_the_login(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no agent keys, no ~/.ssh of the runner
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    LOGINS.clear()
    client_key = tmp_path / "id_rsa"
    OTHER_KEY.write_private_key_file(str(client_key))
    error = connect(ssh(known_hosts(tmp_path, sshd, HOST_KEY), True, sshd, str(client_key)))
    assert isinstance(error, paramiko.SSHException)
    assert not isinstance(error, (paramiko.BadHostKeyException, verify_conftest.UnknownHostKey))
    assert LOGINS == ["root"]  # as ssh.user, to the address and port of the node


@pytest.mark.parametrize("strict", [True, False])
def test_a_different_key_is_refused_strict_or_not(sshd, tmp_path, strict):
    error = connect(ssh(known_hosts(tmp_path, sshd, OTHER_KEY), strict, sshd))
    assert isinstance(error, paramiko.BadHostKeyException)
    kind, reason, _ = ssh_problem(error)
    assert (kind, reason.split(": ", 1)[1]) == ("hostkey", "host key does not match known_hosts")


def test_an_unknown_key_is_refused_with_strict_checking(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    empty = tmp_path / "empty"
    empty.write_text("")
    error = connect(ssh(empty, True, sshd))
    assert isinstance(error, verify_conftest.UnknownHostKey)
    kind, reason, _ = ssh_problem(error)
    assert kind == "hostkey" and "host key unknown" in reason
    # The lab's opt-out (strict_host_key_checking: false, known_hosts_file: /dev/null).
    error = connect(ssh("/dev/null", False, sshd))
    assert not isinstance(error, (paramiko.BadHostKeyException, verify_conftest.UnknownHostKey))


def test_the_header_says_how_host_keys_are_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    strict = SimpleNamespace(known_hosts_file=None, strict_host_key_checking=True)
    line = verify_conftest.host_keys_line(strict)
    assert (
        line == f"host keys: checked against {tmp_path}/.ssh/known_hosts; unknown or different keys refused"
    )
    lab = SimpleNamespace(known_hosts_file="/dev/null", strict_host_key_checking=False)
    assert verify_conftest.host_keys_line(lab) == (
        "host keys: NOT checked: no known keys in /dev/null and "
        "ssh.strict_host_key_checking: false accepts any"
    )
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    some = SimpleNamespace(known_hosts_file=str(known), strict_host_key_checking=False)
    assert "unknown keys ACCEPTED" in verify_conftest.host_keys_line(some)


@pytest.mark.parametrize(
    "args, refused",
    [
        (["-l"], True),
        (["--showlocals"], True),
        (["--showl"], True),
        (["-vl"], True),
        (["-x", "--tb=long", "-l"], True),
        (["-k", "slow"], False),
        (["-kslow"], False),
        (["-v", "--lf"], False),
    ],
)
def test_showlocals_is_refused(args, refused):
    assert verify_main.shows_locals(args) is refused


def test_verify_stops_with_one_line_on_showlocals(capsys):
    assert verify_main.main(["--cluster", "x.yaml", "-l"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--showlocals" in err[0]


def test_testinfra_and_paramiko_stay_above_debug():
    config = SimpleNamespace(
        getoption=lambda name, default=None: default if name == "showlocals" else "/nonexistent"
    )
    verify_conftest.pytest_configure(config)
    for name in ("testinfra", "paramiko", "paramiko.transport"):
        assert not logging.getLogger(name).isEnabledFor(logging.DEBUG)
