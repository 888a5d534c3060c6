"""Trust odds and ends: PGDG's keyring holds exactly the pinned key, secret files are
compared without a hash anyone could test guesses against, and the mirror's and apt proxy's
logins reach apt and curl through root-only files, never a URL or a command line.

gpg, curl and apt's own apt-helper run for real where the controller has them.
"""

from __future__ import annotations

import base64
import functools
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand

from deploy.cluster import ClusterError, load_cluster
from deploy.facts.trust import OpenPgpKeys, SecretFileState
from deploy.secrets import credentials_problem
from roles.apt import proxy as apt_proxy
from roles.postgresql import server as postgresql
from roles.shared import ops as shared_ops
from roles.shared.templates import files_path
from tests.lab.aptrepo import throwaway_keys
from tests.unit.optest import Facts, run_op
from tests.unit.test_cluster import MINIMAL

needs_gpg = pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg")
needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
APT_HELPER = "/usr/lib/apt/apt-helper"


def commands_of(op, facts: Facts, *args, **kwargs) -> list:
    return run_op(op, facts, *args, **kwargs)[0]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two throwaway OpenPGP keys: {"a": (fingerprint, armored), "b": ...}."""
    return throwaway_keys(tmp_path_factory.mktemp("gnupg"), ("a", "b"))


def read_fact(path: Path):
    fact = OpenPgpKeys()
    run = subprocess.run(["sh", "-c", fact.command(str(path))], capture_output=True, text=True, check=True)
    return fact.process(run.stdout.splitlines())


@needs_gpg
def test_the_fact_lists_every_primary_key_of_the_file(keys, tmp_path):
    (fa, a), (fb, b) = keys["a"], keys["b"]
    one, two, spoiled = tmp_path / "one.asc", tmp_path / "two.asc", tmp_path / "spoiled.asc"
    one.write_bytes(a)
    two.write_bytes(a + b)
    spoiled.write_bytes(a + b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nnot a key\n")
    assert read_fact(one) == [fa]  # its subkey-less fpr, upper case as gpg prints it
    assert read_fact(two) == [fa, fb]
    assert read_fact(spoiled) == [""]
    assert read_fact(tmp_path / "absent.asc") is None


@pytest.mark.parametrize(
    "found, fetches",
    [(["F" * 40], False), (["F" * 40, "E" * 40], True), (["E" * 40], True), ([""], True), (None, True)],
)
def test_pgdg_key_is_left_alone_only_when_it_is_exactly_the_pinned_key(found, fetches):
    commands = commands_of(
        postgresql.pgdg_key, Facts({OpenPgpKeys: found}), "http://k/key.asc", "F" * 40, "/etc/k.asc"
    )
    assert bool(commands) is fetches
    if fetches:
        assert str(commands[0]).endswith(f"pgdg-key.sh http://k/key.asc {'F' * 40} /etc/k.asc")


class Served(http.server.SimpleHTTPRequestHandler):
    """A directory over HTTP; paths under /auth/ and proxy requests need LOGIN (Basic)."""

    login = "mirror-user:S3cret-pw!"

    def log_message(self, *args):
        pass

    def do_GET(self):
        proxied = self.path.startswith("http://")
        header = "Proxy-Authorization" if proxied else "Authorization"
        if proxied or self.path.startswith("/auth/"):
            expected = "Basic " + base64.b64encode(self.login.encode()).decode()
            if self.headers.get(header) != expected:
                self.send_response(407 if proxied else 401)
                self.send_header("Proxy-Authenticate" if proxied else "WWW-Authenticate", 'Basic realm="t"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.path = (
                "/" + self.path.split("/auth/", 1)[-1] if not proxied else "/" + self.path.split("/", 3)[3]
            )
        super().do_GET()


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Served, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def pgdg_script(url: str, fingerprint: str, dest: Path):
    script = files_path("postgresql/pgdg-key.sh").read_text()
    return subprocess.run(
        ["sh", "-c", script, "pgdg-key.sh", url, fingerprint, str(dest)],
        check=False,
        capture_output=True,
        text=True,
    )


@needs_gpg
@needs_curl
def test_pgdg_key_script_replaces_a_keyring_with_an_extra_key_and_refuses_a_two_key_download(
    keys, served, tmp_path
):
    (fa, a), (_, b) = keys["a"], keys["b"]
    root, base = served
    dest = tmp_path / "keys" / "pgdg.asc"
    dest.parent.mkdir()
    dest.write_bytes(a + b)  # a planted second key beside the pinned one
    (root / "one.asc").write_bytes(a)
    ok = pgdg_script(f"{base}/one.asc", fa, dest)
    assert ok.returncode == 0, ok.stderr
    assert dest.read_bytes() == a and read_fact(dest) == [fa]
    assert dest.stat().st_mode & 0o777 == 0o644
    (root / "two.asc").write_bytes(a + b)
    refused = pgdg_script(f"{base}/two.asc", fa, dest)
    assert refused.returncode == 1
    assert f"holds 2 key(s), not exactly the one with fingerprint {fa}: refused, {dest} left as it was" in (
        refused.stderr
    )
    assert dest.read_bytes() == a and sorted(p.name for p in dest.parent.iterdir()) == ["pgdg.asc"]
    # No good key to be had and a planted one in place: apt is left with no PGDG key at all.
    dest.write_bytes(a + b)
    removed = pgdg_script(f"{base}/two.asc", fa, dest)
    assert removed.returncode == 1 and f"{dest} held other keys and was removed" in removed.stderr
    assert list(dest.parent.iterdir()) == []
    dest.write_bytes(a)
    (root / "junk.asc").write_text("not a key\n")
    assert "holds 0 key(s)" in pgdg_script(f"{base}/junk.asc", fa, dest).stderr
    assert "holds 0 key(s)" in pgdg_script(f"{base}/absent.asc", fa, dest).stderr


# --- secret files: compared by reading them back, never by a printed hash ----------------------


def test_secret_file_unchanged_is_no_change_and_no_hash_fact_is_read():
    secret = shared_ops.SecretBytes("same")
    state = {"user": "root", "group": "root", "mode": "600"}
    facts = Facts({SecretFileState: state}, {"/etc/x": b"same"})
    assert commands_of(shared_ops.secret_file, facts, "/etc/x", secret) == []
    # no Sha1File / Sha256File: nothing to print
    assert [cls for cls, _ in facts.asked] == [SecretFileState]
    drift = Facts({SecretFileState: {**state, "mode": "644"}}, {"/etc/x": b"same"})
    assert [str(c) for c in commands_of(shared_ops.secret_file, drift, "/etc/x", secret)] == [
        "chmod 600 /etc/x"
    ]
    owner = Facts({SecretFileState: {**state, "group": "minio"}}, {"/etc/x": b"same"})
    assert [str(c) for c in commands_of(shared_ops.secret_file, owner, "/etc/x", secret)] == [
        "chown root:root /etc/x"
    ]


@pytest.mark.parametrize("files", [{"/etc/x": b"old"}, {"/etc/x": b"same\n"}, {}])
def test_secret_file_changed_or_unreadable_is_written_mode_first(files):
    secret = shared_ops.SecretBytes("same")
    state = {"user": "root", "group": "root", "mode": "600"}
    commands = commands_of(shared_ops.secret_file, Facts({SecretFileState: state}, files), "/etc/x", secret)
    assert [type(c) for c in commands] == [StringCommand, FileUploadCommand]
    assert str(commands[0]) == "touch /etc/x && chown root:root /etc/x && chmod 600 /etc/x"
    assert commands[1].src.read() == b"same"


def test_secret_file_state_fact_reads_owner_and_mode_only(tmp_path):
    path = tmp_path / "s.env"
    path.write_text("KEY=value\n")
    path.chmod(0o600)
    fact = SecretFileState()
    run = subprocess.run(["sh", "-c", fact.command(str(path))], capture_output=True, text=True, check=True)
    state = fact.process(run.stdout.splitlines())
    assert state is not None and state["mode"] == "600" and "value" not in run.stdout
    assert fact.process([]) is None


# --- the mirror's and the apt proxy's logins --------------------------------------------------

MIRROR = "http://mirror.test:8077/cuda/repos/{distro}/x86_64/"


def cluster_with(tmp_path, monkeypatch, sources: str, env: dict[str, str]):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name, value in {
        "DTTEST_ACCESS_KEY": "minio-corpus",
        "DTTEST_SECRET_KEY": "Corpus-Secret-9",
        "DTTEST_DB_PASSWORD": "corpus-db-pass",
        "DTTEST_ADMIN_PASSWORD": "Corpus-Admin-1",
    }.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "cluster.yaml"
    path.write_text(MINIMAL.replace("sources:\n", "sources:\n" + sources))
    return load_cluster(str(path))


def test_logins_go_to_root_only_files_in_apt_and_curl_formats(tmp_path, monkeypatch):
    cluster = cluster_with(
        tmp_path,
        monkeypatch,
        f"  cuda_repo: {MIRROR}\n  mirror_credentials: {{env: T_MIRROR}}\n"
        "  apt_proxy: http://proxy.test:3128\n  apt_proxy_credentials: {env: T_PROXY}\n",
        {"T_MIRROR": "site:M1rr0r-pw!", "T_PROXY": "px:Pr0xy#pw\n"},
    )
    assert "M1rr0r" not in repr(cluster.sources) and "Pr0xy" not in repr(cluster.sources)
    assert apt_proxy.auth_conf(cluster) == (
        "# gpu-cluster (roles/apt/proxy.py): logins from cluster.yaml\n"
        "machine http://mirror.test:8077 login site password M1rr0r-pw!\n"
        "machine http://proxy.test:3128 login px password Pr0xy#pw\n"
    )
    assert apt_proxy.download_netrc(cluster) == "machine mirror.test login site password M1rr0r-pw!\n"
    conf = apt_proxy.apt_conf(cluster.sources.apt_proxy, ["mirror.test"])
    assert "px" not in conf and "Pr0xy" not in conf  # apt.conf.d is world-readable


def test_without_logins_there_are_no_login_files(tmp_path, monkeypatch):
    cluster = cluster_with(tmp_path, monkeypatch, "", {})
    assert apt_proxy.auth_conf(cluster) is None and apt_proxy.download_netrc(cluster) is None


@pytest.mark.parametrize(
    "value, problem",
    [
        ("nocolon-Zq9", "must be user:password (no ':' found)"),
        (":pw-Zq9", "both non-empty"),
        ("user-Zq9:", "both non-empty"),
        ("us er:pw-Zq9", "printable ASCII without spaces"),
        ('user:"pw-Zq9', "double quotes"),
        ("user:pw\\x-Zq9", "backslashes"),
        ("usér:pw-Zq9", "printable ASCII"),
        ("user:#pw-Zq9", "must not start with '#'"),
        ("#user:pw-Zq9", "must not start with '#'"),
    ],
)
def test_a_malformed_login_is_one_line_without_the_value(tmp_path, monkeypatch, value, problem):
    assert problem in (credentials_problem(value) or "")
    with pytest.raises(ClusterError) as e:
        cluster_with(
            tmp_path,
            monkeypatch,
            f"  cuda_repo: {MIRROR}\n  mirror_credentials: {{env: T_M}}\n",
            {"T_M": value},
        )
    assert e.value.problems == [
        f"{tmp_path / 'cluster.yaml'}: sources.mirror_credentials: {{env: T_M}}: {credentials_problem(value)}"
    ]
    assert value not in str(e.value)


def test_a_login_needs_its_mirror_or_proxy(tmp_path, monkeypatch):
    with pytest.raises(ClusterError) as e:
        cluster_with(
            tmp_path,
            monkeypatch,
            "  mirror_credentials: {env: T_M}\n  apt_proxy_credentials: {env: T_M}\n",
            {"T_M": "u:Secret-1"},
        )
    f, NVIDIA = tmp_path / "cluster.yaml", "developer.download.nvidia.com"
    assert e.value.problems == [
        f"{f}: sources.mirror_credentials: {{env: T_M}}: for a site mirror, not {NVIDIA}",
        f"{f}: sources.apt_proxy_credentials: {{env: T_M}}: a login without apt_proxy",
    ]


@pytest.mark.parametrize("host", ["developer.download.nvidia.com.", "nvidia.com"])
def test_a_login_is_never_for_nvidia_however_the_host_is_written(tmp_path, monkeypatch, host):
    with pytest.raises(ClusterError) as e:
        cluster_with(
            tmp_path,
            monkeypatch,
            f"  cuda_repo: https://{host}/compute/cuda/repos/{{distro}}/x86_64/\n"
            "  mirror_credentials: {env: T_M}\n",
            {"T_M": "u:Secret-1"},
        )
    assert any("sources.mirror_credentials" in p and "for a site mirror, not" in p for p in e.value.problems)


def apt_helper(url: str, dest: Path, authdir: Path, *options: str):
    return subprocess.run(
        [
            APT_HELPER,
            "-o",
            f"Dir::Etc::netrcparts={authdir}",
            "-o",
            "Dir::Etc::netrc=/dev/null",
            "-o",
            "APT::Sandbox::User=root",
            "-o",
            "Acquire::Retries=0",
            *options,
            "download-file",
            url,
            str(dest),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(not os.path.exists(APT_HELPER), reason="needs apt's apt-helper")
def test_apt_logs_in_to_the_mirror_and_the_proxy_from_the_auth_conf_we_write(served, tmp_path, monkeypatch):
    root, base = served
    (root / "Release").write_text("served\n")
    port = base.rsplit(":", 1)[1]
    cluster = cluster_with(
        tmp_path,
        monkeypatch,
        f"  cuda_repo: http://127.0.0.1:{port}/auth/{{distro}}/\n  mirror_credentials: {{env: T_M}}\n"
        f"  apt_proxy: http://127.0.0.1:{port}\n  apt_proxy_credentials: {{env: T_M}}\n",
        {"T_M": Served.login},
    )
    authdir = tmp_path / "auth.conf.d"
    authdir.mkdir()
    empty = tmp_path / "empty.d"
    empty.mkdir()
    (authdir / "90gpu-cluster.conf").write_text(apt_proxy.auth_conf(cluster) or "")
    got = apt_helper(f"{base}/auth/Release", tmp_path / "direct", authdir)
    assert got.returncode == 0, got.stdout + got.stderr
    assert (tmp_path / "direct").read_text() == "served\n"
    refused = apt_helper(f"{base}/auth/Release", tmp_path / "no-login", empty)
    assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr
    # Through the proxy (the proxy wants Proxy-Authorization; the file is served by it).
    proxy = ("-o", f"Acquire::http::Proxy=http://127.0.0.1:{port}")
    via = apt_helper("http://repo.invalid/Release", tmp_path / "via", authdir, *proxy)
    assert via.returncode == 0, via.stdout + via.stderr
    denied = apt_helper("http://repo.invalid/Release", tmp_path / "denied", empty, *proxy)
    assert denied.returncode != 0 and "407" in denied.stdout + denied.stderr


@needs_curl
def test_fetch_verified_logs_in_from_the_netrc_file_never_from_its_command_line(served, tmp_path):
    import hashlib

    root, base = served
    (root / "tool").write_bytes(b"tool\n")
    pin = hashlib.sha256(b"tool\n").hexdigest()
    netrc = tmp_path / "download.netrc"
    script = files_path("shared/fetch-verified.sh").read_text()
    assert f"netrc={shared_ops.DOWNLOAD_NETRC}\n" in script  # one path, stated twice
    local = script.replace(shared_ops.DOWNLOAD_NETRC, str(netrc))
    dest = tmp_path / "tool"

    def fetch():
        return subprocess.run(
            ["sh", "-c", local, "fetch-verified.sh", f"{base}/auth/tool", str(dest), "Tool", pin],
            check=False,
            capture_output=True,
            text=True,
        )

    without = fetch()
    assert without.returncode == 1 and "Tool: download failed" in without.stderr and not dest.exists()
    user, password = Served.login.split(":", 1)
    netrc.write_text(f"machine 127.0.0.1 login {user} password {password}\n")
    ok = fetch()
    assert ok.returncode == 0, ok.stderr
    assert dest.read_bytes() == b"tool\n"
    # The command pyinfra runs (and prints) holds no login: the file is read on the node.
    command = str(shared_ops.fetch_verified(f"{base}/auth/tool", "/x", artifact="Tool", sha256=pin))
    assert password not in command and user not in command and " -u " not in script
