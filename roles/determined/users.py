"""Determined's built-in users, on the master node once roles/determined/master has it running.

Determined 0.38 creates `admin` and `determined` at the master's first start and gives both
security.initial_user_password (master/internal/core.go; its master-config reference: "Applies
on first launch"); a later change of that setting changes nothing on the server, and a
restored database keeps whatever it had. So, through the master's REST API on 127.0.0.1
(files/determined/master-users.py, run with python3 from roles/postgresql/backup; with determined.tls
over https, checking master_host against /etc/determined/certs/master-ca.crt):
- admin: the deploy logs in with determined.admin_password (master.yaml holds it, 0600). If
  the master refuses it, the deploy logs in as DET_USER/DET_PASS from the controller's
  environment (as the `det` CLI and deploy.rebuild read them) and sets admin's password to
  determined.admin_password; without them it stops this host with one line naming them.
- determined: deactivated (Determined's docs/manage/users.rst: "To ensure that no one can
  access the Determined cluster as the determined user, deactivate it"), and its password,
  admin's initial one, replaced by a random one nobody holds.
- cluster-smoke (SMOKE_USER): created without admin rights, for verify's smoke experiments.
  Determined gives every task its submitter's session token (DET_USER_TOKEN,
  master/pkg/tasks/task.go), so a smoke submitted as admin would hand an admin token to every
  trial container and to whoever controls the task image. Its password is made on the master
  node once, kept in /etc/determined/smoke-user.json (0600 root) and read from there by verify.
The state is read first (MasterUsers: four words, no secret), so a second deploy changes
nothing. DET_USER/DET_PASS reach the node only in a 0600 file that exists for one command.
"""

from __future__ import annotations

import io
import json
import os
import shlex

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, deploy, operation

from deploy.cluster import Cluster, Node
from deploy.cluster.determined import SMOKE_USER
from deploy.facts.determined_users import MasterUsers, program_command
from roles.determined import tls as determined_tls
from roles.determined.master import MASTER_YAML
from roles.shared.ops import fail

REFUSED = (
    "the master refuses admin's login with determined.admin_password (changed after the master's "
    "first start, or a restored database): deploy again with DET_USER/DET_PASS set to an admin "
    "login that works, and the deploy sets admin's password to determined.admin_password"
)


def operator_login() -> dict | None:
    """DET_USER (default admin) and DET_PASS from the controller's environment, if DET_PASS is set."""
    password = os.environ.get("DET_PASS")
    if not password:
        return None
    return {"username": os.environ.get("DET_USER") or "admin", "password": password}


def settled(state: dict | None) -> bool:
    state = state or {}
    return (
        state.get("admin") == "ok"
        and state.get("determined") in ("inactive", "absent")
        and state.get("smoke") == "ok"
    )


@operation()
def built_in_users(port: int, config: str, cert_name: str = "", cert_file: str = ""):
    """admin logs in with the configured password, `determined` is inactive; over https by
    cert_name against cert_file when both are given (determined.tls)."""
    tls = (cert_name, cert_file) if cert_name and cert_file else None
    over_tls = {"cert_name": cert_name, "cert_file": cert_file} if tls else {}
    state = host.get_fact(MasterUsers, port=port, config=config, **over_tls)
    if settled(state):
        host.noop(
            f"admin logs in with determined.admin_password; the determined user is inactive; "
            f"{SMOKE_USER} is no admin and logs in"
        )
        return
    if not state or state.get("admin") not in ("refused", "inactive"):
        # First start (the password already applies) or only `determined` to deactivate; the
        # program also waits for a master that is still starting.
        yield StringCommand(program_command("apply", port, config, tls=tls))
        return
    login = operator_login()
    if login is None:
        yield fail(REFUSED)
        return
    temp = host.get_temp_filename("determined-login.json")
    quoted = shlex.quote(temp)
    yield StringCommand(f"install -m 600 /dev/null {quoted}")
    yield FileUploadCommand(
        io.BytesIO(json.dumps(login).encode()), temp, remote_temp_filename=host.get_temp_filename(temp)
    )
    yield StringCommand(
        f"{program_command('apply', port, config, temp, tls=tls)}; status=$?; rm -f {quoted}; exit $status"
    )


@deploy("Determined users")
def apply(cluster: Cluster, node: Node) -> None:
    built_in_users(
        name=(
            "Determined users: admin's password is determined.admin_password, `determined` "
            f"inactive, {SMOKE_USER} (verify's smoke) no admin"
        ),
        port=cluster.master_port,
        config=MASTER_YAML,
        # master-ca.crt is on the master node too (roles/determined/tls.py).
        cert_name=cluster.master_host if determined_tls.enabled(cluster) else "",
        cert_file=determined_tls.MASTER_CA if determined_tls.enabled(cluster) else "",
    )
