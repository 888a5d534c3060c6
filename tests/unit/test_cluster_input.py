"""deploy.cluster's input rules (nothing that reaches a node needs quoting): URLs, paths, names,
the storage endpoint, YAML 1.2 with YAML 1.1's surprises refused, and the lab's own files."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import pytest
import yaml

from deploy.cluster import ClusterError, checks, load_cluster
from deploy.cluster.loader import Loader, surprise
from deploy.cluster.reader import Reader

from .labfiles import lab_text
from .test_cluster import CORPUS_ENV, LAB, MINIMAL


@pytest.fixture
def env(monkeypatch):
    for name, value in CORPUS_ENV.items():
        monkeypatch.setenv(name, value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def run_check(check, value):
    r = Reader("f", resolve_secrets=False)
    return check(r, "k", value), r.problems


# --- URLs ---------------------------------------------------------------------------------------

HTTP = checks.url(("http", "https"))


@pytest.mark.parametrize(
    "url",
    [
        "http://mirror.test/minio",
        "https://mirror.test:8443/a/b%20c?x=1&y=2",
        "http://[::1]:3142",
        "http://10.77.0.1:8077/cuda/",
        "HTTP://Mirror.Test/x",
        "http://mirror.test./x",
    ],
)
def test_clean_urls_are_returned_as_written(url):
    assert run_check(HTTP, url) == (url, [])


@pytest.mark.parametrize(
    "url, why",
    [
        (
            "http://mirror.test/a b",
            "must not contain whitespace, quotes or control characters (found a space)",
        ),
        ("http://mirror.test/\u00a0", "must not contain whitespace, quotes or control characters"),
        ("http://mirror.test/x\x00", "must not contain whitespace, quotes or control characters"),
        ("http://mirror.test/x\u202e", "must not contain whitespace, quotes or control characters"),
        ("http://[::1/", "not a valid URL: Invalid IPv6 URL"),
        ("http://[::1]x/", "not a valid URL"),
        ("http://h:65536/", "not a valid URL: Port out of range"),
        ("http://h:-1/", "not a valid URL"),
        ("http://a..b/", "not a valid host name"),
        ("http://-a/", "not a valid host name"),
        ("ftp://h/", "must be a http:// or https:// URL"),
        ("//h/x", "must be a http:// or https:// URL"),
        ("http://h/{x}", "unknown placeholder {x}"),
        ("http://h/{", "unbalanced { } in the URL template"),
    ],
)
def test_malformed_urls_give_one_line(url, why):
    value, problems = run_check(HTTP, url)
    assert value is None
    assert len(problems) == 1 and "\n" not in problems[0]
    assert why in problems[0]


@pytest.mark.parametrize(
    "url", ["http://user:hunter2@h/", "http://hunter2@h/", "https://a:hunter2@h:1/x", "http://:hunter2@h/"]
)
def test_credentials_in_urls_are_refused_and_masked(url):
    value, problems = run_check(HTTP, url)
    assert value is None
    assert "hunter2" not in problems[0]
    assert "***@" in problems[0] and "must not hold user:password@" in problems[0]


# --- paths and names ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/mnt/data", "/mnt/data/", "/srv/minio+1/x_y-z.d", "/.hidden/a..b"])
def test_safe_paths(path):
    assert run_check(checks.abs_path, path) == (path, [])


@pytest.mark.parametrize(
    "path",
    ["/a b", "/a;b", "/a'b", '/a"b', "/a$b", "/a`b", "/a\nb", "/a\\b", "/a*", "/ä", "//a", "/a/../b", "/a/."],
)
def test_unsafe_paths(path):
    value, problems = run_check(checks.abs_path, path)
    assert value is None and len(problems) == 1


@pytest.mark.parametrize(
    "name",
    ["localhost", "LOCALHOST", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "broadcasthost"],
)
def test_reserved_hostnames(name):
    value, problems = run_check(checks.hostname, name)
    assert value is None and "a reserved name" in problems[0]


@pytest.mark.parametrize("name", ["10.0.0.1", "::1", "12345", "0x7f000001", "0", "017700000001"])
def test_hostnames_that_are_addresses(name):
    value, problems = run_check(checks.hostname, name)
    assert value is None
    assert "an IP address, not a name" in problems[0] or "resolvers read it as the address" in problems[0]


@pytest.mark.parametrize("name", ["gpu-node1", "m1", "a", "0a", "dead-beef", "lab-master", "b64-gpu63"])
def test_ordinary_hostnames(name):
    assert run_check(checks.hostname, name) == (name, [])


@pytest.mark.parametrize("prefix", ["runs", "team-a/ckpt", "team_a/2024.1/", "a.b"])
def test_prefixes(prefix):
    assert run_check(checks.key_prefix, prefix) == (prefix, [])


@pytest.mark.parametrize("prefix", ["/runs", "a//b", "../x", "a/./b", "a b", "a\nb", "", "a$b"])
def test_bad_prefixes(prefix):
    assert run_check(checks.key_prefix, prefix)[0] is None


# --- storage.endpoint_url -----------------------------------------------------------------------


def with_storage(extra: str) -> str:
    return MINIMAL.replace("storage: {bucket", "storage: {" + extra + ", bucket")


@pytest.mark.parametrize(
    "extra, url",
    [
        ("endpoint_url: 'http://m1:9000'", "http://m1:9000"),
        ("endpoint_url: 'http://M1:9000'", "http://M1:9000"),
        ("endpoint_url: 'http://192.0.2.10:9000'", "http://192.0.2.10:9000"),
        ("endpoint_url: 'http://198.51.100.10:9000'", "http://198.51.100.10:9000"),
        ("endpoint_url: 'http://m1-ib0:9000'", "http://m1-ib0:9000"),
        ("port: 80, endpoint_url: 'http://m1'", "http://m1"),
        ("host: a1, endpoint_url: 'http://a1:9000'", "http://a1:9000"),
        ("host: a1, port: 9100", "http://a1:9100"),
        ("port: 80", "http://m1:80"),
    ],
)
def test_endpoints_that_reach_minio(tmp_path, env, extra, url):
    assert load_cluster(write(tmp_path, with_storage(extra))).storage.endpoint_url == url


@pytest.mark.parametrize(
    "extra, why",
    [
        ("port: 443, endpoint_url: 'http://m1'", "has no port, so S3 clients would use 80"),
        ("console_port: 9100, endpoint_url: 'http://m1:9100'", "port 9100 is storage.console_port"),
        ("endpoint_url: 'http://a1-ib0:9000'", "points at a1-ib0, not at the storage node m1"),
        ("endpoint_url: 'http://minio:9000'", "points at minio, not at the storage node m1"),
        ("endpoint_url: 'http://[::1]:9000'", "points at ::1, not at the storage node m1"),
    ],
)
def test_endpoints_that_miss_minio(tmp_path, env, extra, why):
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, with_storage(extra)))
    (problem,) = e.value.problems
    assert "storage.endpoint_url" in problem and why in problem


# --- YAML ---------------------------------------------------------------------------------------


def load(text: str) -> object:
    return Loader(text).load()[1]


def test_yaml_12_core_schema():
    text = "a: 023\nb: 0o17\nc: 0x1f\nd: yes\ne: 1:30\nf: 1_0\ng: true\nh: ~\ni: 1e3\nj: .inf\nk: -7\n"
    assert load(text + "l: 2022-01-01") == {
        "a": 23,
        "b": 15,
        "c": 31,
        "d": "yes",
        "e": "1:30",
        "f": "1_0",
        "g": True,
        "h": None,
        "i": 1000.0,
        "j": math.inf,
        "k": -7,
        "l": "2022-01-01",
    }
    assert load("<<: {a: 1}\nb: 2") == {"a": 1, "b": 2}  # merge keys still work


@pytest.mark.parametrize(
    "text", ["023457", "09000", "0o17", "0x16", "0b1", "yes", "No", "ON", "off", "y", "N", "1:30", "1_000",
             "2022-01-01", "1e3", "="]
)  # fmt: skip
def test_yaml_11_surprises(text):
    assert surprise(text)


@pytest.mark.parametrize(
    "text", ["0", "10", "-1", "1.5", "true", "False", "null", "~", "", "11.7.1", "10.0.0.1", "abc", "0.38.0"]
)
def test_plain_scalars_both_versions_agree_on(text):
    assert surprise(text) is None


def test_quoted_or_tagged_scalars_are_never_surprises(tmp_path, env):
    text = MINIMAL + "reboot: 'no'\nmaster_port: !!int 023457\n"
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, text))
    assert e.value.problems == [f"{tmp_path}/cluster.yaml: reboot: 'no': must be one of auto, never"]


def test_yaml_11_surprise_is_one_line_per_value(tmp_path, env):
    """The check of the value itself stays silent: `reboot: no` is one problem, not two."""
    with pytest.raises(ClusterError) as e:
        load_cluster(write(tmp_path, MINIMAL + "reboot: no\nssh: {strict_host_key_checking: off}\n"))
    assert len(e.value.problems) == 2
    assert all("YAML 1.1 reads an unquoted" in p for p in e.value.problems)


def test_loader_is_pyyaml_safe():
    with pytest.raises(yaml.YAMLError):
        load("x: !!python/object/apply:os.system [id]")


# --- the lab's own files ------------------------------------------------------------------------


def lab_secrets(tmp_path: Path, text: str) -> str:
    """`text` with the lab's secret files in tmp_path, written by the lab's own code."""
    text = lab_text(tmp_path, text)
    made = sorted((tmp_path / "dtlab" / "secrets").iterdir())
    assert len(made) == 4
    for secret in made:
        assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    return text


def test_lab_secret_files_are_accepted(tmp_path):
    c = load_cluster(write(tmp_path, lab_secrets(tmp_path, LAB.read_text())))
    assert c.storage.secret_key.value.startswith("Lab") and "\n" not in c.storage.secret_key.value


@pytest.mark.parametrize("size", [4, 16, 64])
def test_bench_cluster_files_are_valid(tmp_path, size):
    from tests.lab.bench import cluster_yaml

    text = lab_secrets(tmp_path, cluster_yaml(size, 5))
    c = load_cluster(write(tmp_path, text))
    assert len(c.nodes) == size
    assert c.storage.endpoint_url == f"http://b{size}-master:9000"


@pytest.mark.parametrize("char", ["\ufeff", "\u200b", "\u202e", "\u2066", "\udcff", "\x85", "\u2028"])
def test_invisible_characters_are_escaped_in_problem_lines(char):
    from deploy.cluster.reader import one_line

    shown = one_line(f"secret{char}key")
    assert char not in shown and shown.startswith("secret\\") and shown.endswith("key")
