"""Determined's built-in users on the lab (roles/determined/users.py).

After the deploy a blank admin login is refused, `determined` is inactive and refuses the
admin password, and the configured one logs in. determined.admin_password changed in a copy
of cluster.yaml: without DET_USER/DET_PASS the master fails alone with one line naming them;
with the old login in them the new password works and the old one is refused, verify is
green and a second deploy changes nothing; then back to the lab's own password the same way.
"""

import json
import secrets
import urllib.error
import urllib.request

import yaml

from deploy.cluster.determined import SMOKE_USER
from roles.determined.users import REFUSED

from .conftest import run_verify

MASTER_CHECKS = ("-k", "test_master or determined_user or postgresql")


def login(lab, username: str, password: str) -> int:
    url = f"http://{lab.master_node.address}:{lab.master_port}/api/v1/auth/login"
    body = json.dumps({"username": username, "password": password}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def users(lab, password: str) -> dict[str, dict]:
    base = f"http://{lab.master_node.address}:{lab.master_port}/api/v1"
    body = json.dumps({"username": "admin", "password": password}).encode()
    request = urllib.request.Request(
        f"{base}/auth/login", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=15) as response:
        token = json.loads(response.read())["token"]
    request = urllib.request.Request(f"{base}/users", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=15) as response:
        return {u["username"]: u for u in json.loads(response.read())["users"]}


def test_built_in_users_after_the_deploy(deployed, lab):
    password = lab.determined.admin_password.value
    assert login(lab, "admin", "") == 401
    assert login(lab, "admin", password) == 200
    listed = users(lab, password)
    assert listed["determined"]["active"] is False
    # verify's smoke user: made by the deploy, active, no admin (its trials hold its token).
    assert listed[SMOKE_USER]["active"] is True and listed[SMOKE_USER]["admin"] is False
    # Its password is no longer admin's initial one: refused as a wrong password, not as inactive.
    assert login(lab, "determined", password) == 401
    assert login(lab, "determined", "") == 401


def _copy(lab, tmp_path, password: str):
    secret = tmp_path / "admin_password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    raw = yaml.safe_load(lab.path.read_text())
    raw["determined"]["admin_password"] = {"file": str(secret)}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(raw, sort_keys=False))
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"from deploy.inventory import groups\nglobals().update(groups({str(cluster)!r}))\n")
    return cluster, inventory


def test_changed_admin_password_is_applied_through_the_api(deployed, deploy, lab, tmp_path, monkeypatch):
    master = lab.master_host
    original = lab.determined.admin_password.value
    changed = f"Lab-Changed-{secrets.token_hex(6)}-Pw0"
    cluster, inventory = _copy(lab, tmp_path, changed)
    monkeypatch.delenv("DET_USER", raising=False)
    monkeypatch.delenv("DET_PASS", raising=False)
    try:
        refused = deploy(inventory=inventory, limit=master)
        # The master is the only host of this run: pyinfra then stops with "No hosts remaining".
        assert refused.returncode == 1, refused.stderr[-4000:]
        assert f"[{master}] {REFUSED}" in refused.stderr, refused.stderr[-3000:]
        assert login(lab, "admin", original) == 200 and login(lab, "admin", changed) == 401

        monkeypatch.setenv("DET_USER", "admin")
        monkeypatch.setenv("DET_PASS", original)
        run = deploy(inventory=inventory, limit=master)
        assert run.returncode == 0, run.stderr[-4000:]
        assert login(lab, "admin", changed) == 200
        assert login(lab, "admin", original) == 401 and login(lab, "admin", "") == 401
        assert original not in run.stdout + run.stderr and changed not in run.stdout + run.stderr
        verify = run_verify(*MASTER_CHECKS, cluster=cluster)
        assert verify.returncode == 0, verify.stdout[-4000:]
        monkeypatch.delenv("DET_USER")
        monkeypatch.delenv("DET_PASS")
        again = deploy(inventory=inventory, limit=master)
        assert again.returncode == 0, again.stderr[-4000:]
        assert again.results["totals"]["success"] == 0, again.changed_operations()
    finally:
        monkeypatch.setenv("DET_USER", "admin")
        monkeypatch.setenv("DET_PASS", changed)
        restored = deploy(limit=master)
        monkeypatch.delenv("DET_USER")
        monkeypatch.delenv("DET_PASS")
    assert restored.returncode == 0, restored.stderr[-4000:]
    assert login(lab, "admin", original) == 200 and login(lab, "admin", changed) == 401
    verify = run_verify(*MASTER_CHECKS)
    assert verify.returncode == 0, verify.stdout[-4000:]
    second = deploy(limit=master)
    assert second.returncode == 0, second.stderr[-4000:]
    assert second.results["totals"]["success"] == 0, second.changed_operations()
