"""Determined's built-in users (roles/determined/users.py, files/determined/master-users.py).

Without PostgreSQL: what the operation yields for each state the MasterUsers fact reports,
and that DET_PASS reaches no command line. With a local PostgreSQL (`pg` marker): the node
program against the determined-master stand-in, from a fresh database to a changed password.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand

from deploy.facts.determined_users import PROGRAM, MasterUsers
from roles.determined import users as determined_users
from tests.unit.optest import Facts, run_op
from tests.unit.test_standin_determined import MasterProcess, _psql, base_config, postgres  # noqa: F401

SETTLED = {"master": "up", "admin": "ok", "determined": "inactive", "smoke": "ok"}
OPERATOR_PASSWORD = "Old-Passw0rd 'with' $(quotes)"


def run_users(state) -> tuple[list, list[str], list]:
    """The operation's commands, no-op notes and fact reads with MasterUsers giving `state`."""
    facts = Facts({MasterUsers: state})
    commands, noops = run_op(
        determined_users.built_in_users, facts, port=8080, config="/etc/determined/master.yaml"
    )
    return commands, noops, facts.asked


@pytest.fixture(autouse=True)
def _no_operator_login(monkeypatch):
    monkeypatch.delenv("DET_USER", raising=False)
    monkeypatch.delenv("DET_PASS", raising=False)


@pytest.mark.parametrize("determined", ["inactive", "absent"])
def test_settled_master_is_no_change(determined):
    commands, noops, asked = run_users({**SETTLED, "determined": determined})
    assert commands == [] and noops
    assert asked == [(MasterUsers, {"port": 8080, "config": "/etc/determined/master.yaml"})]


@pytest.mark.parametrize(
    "state",
    [
        None,  # no python3 (yet)
        {"master": "down", "admin": "error", "determined": "unknown"},  # first deploy: no master yet
        {"master": "up", "admin": "ok", "determined": "active"},
        {"master": "up", "admin": "error", "determined": "unknown"},
    ],
)
def test_other_states_run_the_program_once(state):
    [command] = run_users(state)[0]
    text = str(command)
    assert text.startswith("python3 -c ") and text.endswith(" apply 8080 /etc/determined/master.yaml")


@pytest.mark.parametrize("admin", ["refused", "inactive"])
def test_refused_without_det_pass_fails_with_one_line_naming_them(admin):
    [command] = run_users({"master": "up", "admin": admin, "determined": "unknown"})[0]
    assert str(command).endswith("exit 1") and "DET_USER/DET_PASS" in str(command)
    assert "\n" not in determined_users.REFUSED


def test_refused_with_det_pass_uploads_it_in_a_0600_file_only(monkeypatch):
    monkeypatch.setenv("DET_USER", "ops")
    monkeypatch.setenv("DET_PASS", OPERATOR_PASSWORD)
    commands, _, _ = run_users({"master": "up", "admin": "refused", "determined": "unknown"})
    create, upload, run = commands
    assert isinstance(create, StringCommand) and str(create).startswith("install -m 600 /dev/null /tmp/")
    assert isinstance(upload, FileUploadCommand)
    assert json.loads(upload.src.getvalue()) == {"username": "ops", "password": OPERATOR_PASSWORD}
    temp = upload.dest
    assert str(run).endswith(
        f" apply 8080 /etc/determined/master.yaml {temp}; status=$?; rm -f {temp}; exit $status"
    )
    shown = "\n".join(str(c) for c in (create, run)) + repr(upload)
    assert "Old-Passw0rd" not in shown


def test_det_user_defaults_to_admin(monkeypatch):
    monkeypatch.setenv("DET_PASS", OPERATOR_PASSWORD)
    upload = run_users({"master": "up", "admin": "refused", "determined": "unknown"})[0][1]
    assert json.loads(upload.src.getvalue())["username"] == "admin"


def test_fact_parses_the_program_line_and_nothing_else():
    fact = MasterUsers()
    assert (
        fact.process(['{"admin": "ok", "determined": "inactive", "master": "up", "smoke": "ok"}']) == SETTLED
    )
    assert fact.process(["Traceback (most recent call last):"]) is None
    command = fact.command(port=8080, config="/etc/determined/master.yaml")
    assert command.startswith("python3 -c '") and command.endswith(
        "' status 8080 /etc/determined/master.yaml"
    )


def test_program_parses_as_python_38():
    # Ubuntu 20.04's python3 is 3.8.
    ast.parse(PROGRAM.read_text(), str(PROGRAM), feature_version=(3, 8))


# --------------------------------------------------------------------------- with PostgreSQL


def program(mode: str, port: int, config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM.read_text(), mode, str(port), str(config), *extra],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


def status(port: int, config: Path) -> dict:
    run = program("status", port, config)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def master_yaml(path: Path, password: str) -> Path:
    """The lines of roles/determined/master.py's master.yaml the program reads."""
    path.write_text(f"port: 8080\nsecurity:\n  initial_user_password: {json.dumps(password)}\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def database(postgres):  # noqa: F811
    """The module's database, emptied: each test starts a master on a fresh one (first start)."""
    _psql(
        postgres["port"],
        f"DROP SCHEMA public CASCADE;\nCREATE SCHEMA public AUTHORIZATION {postgres['user']};\n",
        database=postgres["name"],
    )
    return postgres


def login(master: MasterProcess, username: str, password: str) -> int:
    return master.request("POST", "/api/v1/auth/login", {"username": username, "password": password})[0]


@pytest.mark.pg
def test_program_against_the_standin(tmp_path, database):
    config = base_config(tmp_path, database["port"])
    config["db"] = dict(database)
    first, second = "Admin-Passw0rd", "Second-Passw0rd"
    conf = master_yaml(tmp_path / "deployed.yaml", first)
    master = MasterProcess(tmp_path, config)
    try:
        master.wait_healthy()
        port = master.port
        # First start: both built-in users have the initial password (core.go).
        assert status(port, conf) == {
            "master": "up",
            "admin": "ok",
            "determined": "active",
            "smoke": "absent",
        }
        assert login(master, "determined", first) == 200
        run = program("apply", port, conf)
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines() == [
            "determined: deactivated, with a random password nobody holds",
            "cluster-smoke: created, not an admin (verify's smoke experiments run as it)",
        ]
        assert status(port, conf) == SETTLED
        # The smoke user's login: 0600 beside master.yaml, a password nobody typed, no admin.
        smoke_file = tmp_path / "smoke-user.json"
        assert smoke_file.stat().st_mode & 0o777 == 0o600
        smoke = json.loads(smoke_file.read_text())
        assert smoke["username"] == "cluster-smoke" and smoke["password"] not in run.stdout + run.stderr
        code, body = master.request(
            "POST", "/api/v1/auth/login", {"username": "cluster-smoke", "password": smoke["password"]}
        )
        assert code == 200 and body["user"]["admin"] is False and body["user"]["active"] is True
        # Made an admin, deactivated, or its file lost: the status says so and apply repairs it.
        _, admin_login = master.login(first)
        smoke_id = body["user"]["id"]
        master.request("PATCH", f"/api/v1/users/{smoke_id}", {"admin": True}, admin_login["token"])
        assert status(port, conf)["smoke"] == "admin"
        master.request(
            "PATCH", f"/api/v1/users/{smoke_id}", {"admin": False, "active": False}, admin_login["token"]
        )
        assert status(port, conf)["smoke"] == "inactive"
        assert program("apply", port, conf).stdout.splitlines() == ["cluster-smoke: active set"]
        smoke_file.unlink()
        assert status(port, conf)["smoke"] == "nofile"
        assert program("apply", port, conf).stdout.splitlines() == ["cluster-smoke: password set"]
        assert status(port, conf) == SETTLED
        assert login(master, "cluster-smoke", smoke["password"]) == 401  # the lost one
        # Blank and wrong passwords: 401; determined no longer takes admin's initial password.
        for user, password in (("admin", ""), ("determined", ""), ("determined", first)):
            assert login(master, user, password) == 401, (user, password)
        again = program("apply", port, conf)
        assert again.returncode == 0 and again.stdout == "", again.stderr

        # determined.admin_password changed in cluster.yaml: master.yaml says the new one.
        changed = master_yaml(tmp_path / "changed.yaml", second)
        assert status(port, changed) == {
            "master": "up",
            "admin": "refused",
            "determined": "unknown",
            "smoke": "unknown",
        }
        refused = program("apply", port, changed)
        assert refused.returncode == 1 and refused.stdout == ""
        assert len(refused.stderr.strip().splitlines()) == 1 and "DET_USER/DET_PASS" in refused.stderr
        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps({"username": "admin", "password": "Not-The-0ne"}))
        refused = program("apply", port, changed, str(wrong))
        assert (
            refused.returncode == 1
            and "DET_USER/DET_PASS: the master refuses that login too" in refused.stderr
        )
        operator = tmp_path / "login.json"
        operator.write_text(json.dumps({"username": "admin", "password": first}))
        run = program("apply", port, changed, str(operator))
        assert run.returncode == 0, run.stderr
        assert "admin: password set to determined.admin_password" in run.stdout
        # DET_USER was admin: its previous password (DET_PASS) is tried and must be refused.
        assert "admin: the previous password (DET_PASS) is refused" in run.stdout
        assert status(port, changed) == SETTLED
        assert login(master, "admin", first) == 401 and login(master, "admin", second) == 200
        assert first not in run.stdout + run.stderr and second not in run.stdout + run.stderr
    finally:
        master.kill()
    assert second not in (tmp_path / "master.log").read_text()


@pytest.mark.pg
def test_a_smoke_user_the_master_will_not_repair_leaves_determined_deactivated(tmp_path, database):
    """The smoke user comes after `determined`: a remote cluster-smoke (its password cannot be
    set) fails the run with one line, and `determined` is inactive all the same."""
    config = base_config(tmp_path, database["port"])
    config["db"] = dict(database)
    conf = master_yaml(tmp_path / "deployed.yaml", "Admin-Passw0rd")
    master = MasterProcess(tmp_path, config)
    try:
        master.wait_healthy()
        _, body = master.login("Admin-Passw0rd")
        remote = {"user": {"username": "cluster-smoke", "admin": False, "active": True, "remote": True}}
        assert master.request("POST", "/api/v1/users", remote, body["token"])[0] == 200
        run = program("apply", master.port, conf)
        assert run.returncode == 1 and "repairing the user cluster-smoke" in run.stderr, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1
        assert status(master.port, conf)["determined"] == "inactive"
        # A login file others may read counts as none (apply makes a new one, 0600).
        smoke_file = tmp_path / "smoke-user.json"
        smoke_file.write_text(json.dumps({"username": "cluster-smoke", "password": "Seen-by-all-1"}))
        smoke_file.chmod(0o644)
        assert status(master.port, conf)["smoke"] == "nofile"
    finally:
        master.kill()


@pytest.mark.pg
def test_standin_user_endpoints_refuse_as_the_real_master(tmp_path, database):
    config = base_config(tmp_path, database["port"])
    config["db"] = dict(database)
    master = MasterProcess(tmp_path, config)
    try:
        master.wait_healthy()
        status_code, body = master.login("Admin-Passw0rd")
        admin = body["token"]
        status_code, body = master.request("GET", "/api/v1/users", token=admin)
        assert status_code == 200
        users = {u["username"]: u for u in body["users"]}
        assert sorted(users) == ["admin", "determined"] and users["admin"]["admin"]
        assert not users["determined"]["admin"] and users["determined"]["active"]
        who = users["determined"]["id"]
        code, body = master.request(
            "POST", "/api/v1/auth/login", {"username": "determined", "password": "Admin-Passw0rd"}
        )
        determined = body["token"]
        # PostUser: admins only (CanCreateUser), a taken name is echo's error as Internal.
        new_user = {"user": {"username": "alice", "admin": False, "active": True}, "password": "Al1ce-pass"}
        code, body = master.request("POST", "/api/v1/users", new_user, determined)
        assert code == 403 and body["error"]["error"] == "only admin privileged users can create users"
        code, body = master.request("POST", "/api/v1/users", new_user, admin)
        assert code == 200 and body["user"]["username"] == "alice" and body["user"]["admin"] is False
        assert login(master, "alice", "Al1ce-pass") == 200
        code, body = master.request("POST", "/api/v1/users", new_user, admin)
        assert code == 500 and body["error"] == {
            "code": 13,
            "reason": "Internal",
            "error": "code=400, message=user already exists",
        }
        code, body = master.request("POST", "/api/v1/users", {"user": {"username": "x"}}, admin)
        assert code == 400 and body["error"]["error"] == "Display name or username value has minimum length."
        # basic authz: a non-admin may not deactivate anyone (CanSetUsersActive).
        code, body = master.request(
            "PATCH", f"/api/v1/users/{users['admin']['id']}", {"active": False}, determined
        )
        assert code == 403 and body["error"]["error"] == "only admin privileged users can update users"
        assert master.request("PATCH", "/api/v1/users/999", {"active": False}, admin)[0] == 404
        code, body = master.request("PATCH", f"/api/v1/users/{who}", {"active": False}, admin)
        assert code == 200 and body["user"]["active"] is False
        # A deactivated user's session: PermissionDenied (grpcutil.GetUser); its login: "user is
        # not active" after the password check, a wrong password still 401 (api_auth.go Login).
        assert master.request("GET", "/api/v1/me", token=determined)[0] == 403
        code, body = master.request(
            "POST", "/api/v1/auth/login", {"username": "determined", "password": "Admin-Passw0rd"}
        )
        assert code == 403 and body["error"]["error"] == "user is not active"
        assert login(master, "determined", "") == 401
        # SetUserPassword: the body is the password string; sessions of that user end.
        conn_code, _ = master.request(
            "POST", f"/api/v1/users/{users['admin']['id']}/password", "New-Passw0rd", admin
        )
        assert conn_code == 200
        assert master.request("GET", "/api/v1/me", token=admin)[0] == 401
        assert (
            login(master, "admin", "Admin-Passw0rd") == 401 and login(master, "admin", "New-Passw0rd") == 200
        )
        code, body = master.login("New-Passw0rd")
        assert master.request("POST", "/api/v1/auth/logout", token=body["token"])[0] == 200
        assert master.request("GET", "/api/v1/me", token=body["token"])[0] == 401
    finally:
        master.kill()
