# Run on the master node by roles/determined/users.py (`python3 -c`; nothing is installed).
"""Determined's built-in users through the master's own REST API on 127.0.0.1.

With DET_MASTER_CERT_NAME and DET_MASTER_CERT_FILE in the environment (determined.tls, named as
Determined's own client reads them: harness/determined/common/api/certs.py), over https to
127.0.0.1, the certificate checked for that name against that CA file.

  status PORT CONFIG          one JSON line and exit 0, no secret in it:
                              {"master": "up"|"down", "admin": "ok"|"refused"|"inactive"|
                               "unconfigured"|"error", "determined": "active"|"inactive"|
                               "absent"|"unknown", "smoke": "ok"|"absent"|"admin"|"inactive"|
                               "refused"|"nofile"|"unknown"}
  apply PORT CONFIG [LOGIN]   admin's password made the configured one, `determined`
                              deactivated, the smoke user made; LOGIN is a 0600 JSON file
                              {"username", "password"} of an admin login that works
                              (DET_USER/DET_PASS), needed only when admin's password is another

The smoke user (SMOKE_USER): the non-admin user verify's smoke experiments run as. Determined
hands every task its submitter's session token (DET_USER_TOKEN), so a smoke submitted as admin
would put an admin token into trial containers. Its login is SMOKE_FILE beside CONFIG (0600
root, {"username", "password"}): a random password made here once, never shown; verify reads
it from the node as it reads master.yaml. The user is created (PostUser) or repaired (PatchUser:
not admin, active, that password) through admin's session.

The configured password is master.yaml's security.initial_user_password (CONFIG: 0600 root,
a JSON string written by roles/determined/master.py), where the node already holds it.
The requests are those of Determined's own Python client (harness/determined/common/api/
authentication.py and common/experimental/user.py at v0.38.0): the password salted and hashed
on the client (sha512 hex of a fixed salt + password) with isHashed; PATCH /api/v1/users/{id}
with {"password", "isHashed"} or {"active": false}. Standard library only (Python 3.8 on
Ubuntu 20.04); secrets are read from files, never taken from the command line.
"""

import contextlib
import functools
import hashlib
import http.client
import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.request

SMOKE_USER = "cluster-smoke"  # deploy/cluster/determined.py SMOKE_USER
SMOKE_FILE = "smoke-user.json"  # beside CONFIG: /etc/determined/smoke-user.json
SALT = "GubPEmmotfiK9TMD6Zdw"  # authentication.py PASSWORD_SALT; user/passwords.go on the master
WAIT = 120  # seconds the master may take to answer (a restart after a configuration change)


def salt_and_hash(password):
    # authentication.salt_and_hash: a blank password stays blank.
    return hashlib.sha512((SALT + password).encode()).hexdigest() if password else ""


def die(message):
    print(message, file=sys.stderr)
    sys.exit(1)


class NamedHTTPSConnection(http.client.HTTPSConnection):
    """To 127.0.0.1, checking the certificate for the master's name."""

    def __init__(self, *args, server_name, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_name = server_name

    def connect(self):
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.server_name)


class NamedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context, server_name):
        super().__init__(context=context)
        self.tls_context, self.server_name = context, server_name

    def https_open(self, req):
        connection = functools.partial(NamedHTTPSConnection, server_name=self.server_name)
        return self.do_open(connection, req, context=self.tls_context)


class Master:
    def __init__(self, port):
        name = os.environ.get("DET_MASTER_CERT_NAME")
        cafile = os.environ.get("DET_MASTER_CERT_FILE")
        if name and cafile:
            self.url = f"https://127.0.0.1:{port}"
            context = ssl.create_default_context(cafile=cafile)
            self.open = urllib.request.build_opener(NamedHTTPSHandler(context, name)).open
        else:
            self.url = f"http://127.0.0.1:{port}"
            self.open = urllib.request.urlopen

    def call(self, method, path, body=None, token=None):
        """(HTTP status, parsed body); status None when the master does not answer."""
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = "Bearer " + token
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with self.open(request, timeout=15) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {}
        except (OSError, ValueError):
            return None, {}

    def login(self, username, password):
        body = {"username": username, "password": salt_and_hash(password), "isHashed": True}
        return self.call("POST", "/api/v1/auth/login", body)

    def users(self, token):
        status, body = self.call("GET", "/api/v1/users", token=token)
        if status != 200:
            die(f"GET /api/v1/users on {self.url}: {reason(status, body)}")
        return {u.get("username"): u for u in body.get("users") or []}

    def patch(self, token, user, fields, what):
        status, body = self.call("PATCH", f"/api/v1/users/{user['id']}", fields, token)
        if status != 200:
            die(f"{what} (PATCH /api/v1/users/{user['id']}): {reason(status, body)}")

    def logout(self, token):
        self.call("POST", "/api/v1/auth/logout", token=token)


def reason(status, body):
    if status is None:
        return "the master does not answer"
    error = body.get("error") if isinstance(body, dict) else None
    detail = error.get("error") if isinstance(error, dict) else None
    return f"HTTP {status}: {detail}" if detail else f"HTTP {status}"


def configured(path):
    """security.initial_user_password of master.yaml, or None."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"^\s+initial_user_password:\s*(.*?)\s*$", text, re.M)
    if not m:
        return None
    try:
        value = json.loads(m.group(1))
    except ValueError:
        return None
    return value if isinstance(value, str) and value else None


def determined_state(users):
    user = users.get("determined")
    if user is None:
        return "absent"
    return "active" if user.get("active") else "inactive"


def smoke_path(config):
    return os.path.join(os.path.dirname(config), SMOKE_FILE)


def smoke_login(config):
    """The smoke user's login ({"username", "password"}) from SMOKE_FILE, or None (also when
    others may read the file: the login is made again, 0600)."""
    try:
        with open(smoke_path(config)) as f:
            if os.fstat(f.fileno()).st_mode & 0o077:
                return None
            login = json.load(f)
    except (OSError, ValueError):
        return None
    password = login.get("password") if isinstance(login, dict) else None
    ok = (
        isinstance(login, dict)
        and login.get("username") == SMOKE_USER
        and isinstance(password, str)
        and password
    )
    return login if ok else None


def new_smoke_login(config):
    """A random password for the smoke user (Determined's policy: upper, lower and a digit),
    written to SMOKE_FILE 0600 before any user has it."""
    login = {"username": SMOKE_USER, "password": "Smoke-" + os.urandom(18).hex() + "-7"}
    path = smoke_path(config)
    temp = path + ".new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)  # a stale one (or a link left there): O_EXCL below creates it afresh
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(login, f)
    os.replace(temp, path)
    return login


def smoke_state(master, users, login):
    user = users.get(SMOKE_USER)
    if user is None:
        return "absent"
    if user.get("admin"):
        return "admin"
    if not user.get("active"):
        return "inactive"
    if login is None:
        return "nofile"
    code, body = master.login(SMOKE_USER, login["password"])
    if code != 200:
        return "refused"
    master.logout(body["token"])
    return "ok"


def status(master, password, config):
    state = {"master": "down", "admin": "error", "determined": "unknown", "smoke": "unknown"}
    if password is None:
        state["admin"] = "unconfigured"
        return state
    code, body = master.login("admin", password)
    if code is None:
        return state
    state["master"] = "up"
    if code == 200:
        state["admin"] = "ok"
        listed, users = master.call("GET", "/api/v1/users", token=body["token"])
        if listed == 200:
            by_name = {u.get("username"): u for u in users.get("users") or []}
            state["determined"] = determined_state(by_name)
            state["smoke"] = smoke_state(master, by_name, smoke_login(config))
        master.logout(body["token"])
    elif code == 401:
        state["admin"] = "refused"
    elif code == 403:  # grpcutil.ErrNotActive: the password is right, the user deactivated
        state["admin"] = "inactive"
    return state


def admin_token(master, password, login_path):
    """A token of admin logged in with `password`, setting that password first (as the
    operator's DET_USER/DET_PASS login) when the master refuses it."""
    deadline = time.monotonic() + WAIT
    code, body = master.login("admin", password)
    while code is None or code >= 500:
        if time.monotonic() > deadline:
            die(f"the Determined master on {master.url}: {reason(code, body)} within {WAIT} s")
        time.sleep(2)
        code, body = master.login("admin", password)
    if code == 200:
        return body["token"]
    if code not in (401, 403):
        die(f"login as admin on {master.url}: {reason(code, body)}")
    if login_path is None:
        die(
            f"the master refuses admin's login with determined.admin_password ({reason(code, body)}; "
            "it was changed after the master's first start, or the database was restored): run the "
            "deploy with DET_USER/DET_PASS set to an admin login that works, and it sets admin's "
            "password to determined.admin_password"
        )
    with open(login_path) as f:
        login = json.load(f)
    code, body = master.login(login["username"], login["password"])
    if code != 200:
        die(
            f"DET_USER/DET_PASS: the master refuses that login too ({reason(code, body)}): set them "
            "to an admin login that works"
        )
    operator = body["token"]
    admin = master.users(operator).get("admin")
    if admin is None:
        die("the master has no user admin (DET_USER/DET_PASS logged in); create it, then deploy again")
    # An inactive admin is made active again: the deploy, verify and deploy.rebuild log in as it.
    fields = {"password": salt_and_hash(password), "isHashed": True}
    if not admin.get("active"):
        fields["active"] = True
    master.patch(operator, admin, fields, "setting admin's password as DET_USER")
    print("admin: password set to determined.admin_password (logged in as DET_USER)")
    master.logout(operator)  # refused when DET_USER is admin: the change ended its sessions
    code, body = master.login("admin", password)
    if code != 200:
        die(f"login as admin with its new password: {reason(code, body)}")
    if login["username"] == "admin" and login["password"] != password:
        # DET_PASS was admin's previous password: it must be refused from now on.
        old_code, old_body = master.login("admin", login["password"])
        if old_code != 401:
            why = reason(old_code, old_body)
            die(f"admin's previous password (DET_PASS) is not refused after the change: {why}")
        print("admin: the previous password (DET_PASS) is refused")
    return body["token"]


def ensure_smoke_user(master, token, users, config):
    """The smoke user exists, is active, is no admin and logs in with SMOKE_FILE's password."""
    login = smoke_login(config)
    user = users.get(SMOKE_USER)
    if user is None:
        login = login or new_smoke_login(config)
        body = {
            "user": {"username": SMOKE_USER, "admin": False, "active": True},
            "password": salt_and_hash(login["password"]),
            "isHashed": True,
        }
        code, answer = master.call("POST", "/api/v1/users", body, token)
        if code != 200:
            die(f"creating the user {SMOKE_USER} (POST /api/v1/users): {reason(code, answer)}")
        print(f"{SMOKE_USER}: created, not an admin (verify's smoke experiments run as it)")
        return
    fields = {}
    if user.get("admin"):
        fields["admin"] = False
    if not user.get("active"):
        fields["active"] = True
    # 403 is the right password of an inactive user (api_auth.go Login checks it first).
    if login is None or master.login(SMOKE_USER, login["password"])[0] not in (200, 403):
        login = login or new_smoke_login(config)
        fields.update({"password": salt_and_hash(login["password"]), "isHashed": True})
    if fields:
        master.patch(token, user, fields, f"repairing the user {SMOKE_USER}")
        print(f"{SMOKE_USER}: {', '.join(sorted(k for k in fields if k != 'isHashed'))} set")


def apply(master, password, login_path, config):
    if password is None:
        die("no security.initial_user_password in the master's configuration")
    token = admin_token(master, password, login_path)
    users = master.users(token)
    user = users.get("determined")
    if user is not None and user.get("active"):
        # Its own password first: the built-in user was given admin's (security.
        # initial_user_password sets both), and nobody is to hold this one.
        random = salt_and_hash(os.urandom(32).hex())
        fields = {"active": False, "password": random, "isHashed": True}
        master.patch(token, user, fields, "deactivating the determined user")
        print("determined: deactivated, with a random password nobody holds")
    # After `determined`: a smoke user the master refuses to make must not leave it active.
    ensure_smoke_user(master, token, users, config)
    master.logout(token)


def main(argv):
    if len(argv) < 4 or argv[1] not in ("status", "apply"):
        die("usage: master-users.py status|apply PORT CONFIG [LOGIN]")
    master = Master(int(argv[2]))
    password = configured(argv[3])
    if argv[1] == "status":
        print(json.dumps(status(master, password, argv[3]), sort_keys=True))
    else:
        apply(master, password, argv[4] if len(argv) > 4 else None, argv[3])


if __name__ == "__main__":
    main(sys.argv)
