"""deploy.cluster never answers with a traceback: seeded mutations of real files, and nasty files
through the command line. Either a Cluster or a ClusterError whose problems are single lines."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.cluster import Cluster, ClusterError, load_cluster
from deploy.cluster.loader import MAX_DEPTH, MAX_NODES

from .test_cluster import CORPUS_ENV, LAB, MINIMAL, REPO

# The lab file with its secret files swapped for the corpus' variables: no files needed.
LAB_TEXT = (
    LAB.read_text()
    .replace("{file: /var/lib/dtlab/secrets/minio_access_key}", "{env: DTTEST_ACCESS_KEY}")
    .replace("{file: /var/lib/dtlab/secrets/minio_secret_key}", "{env: DTTEST_SECRET_KEY}")
    .replace("{file: /var/lib/dtlab/secrets/db_password}", "{env: DTTEST_DB_PASSWORD}")
    .replace("{file: /var/lib/dtlab/secrets/admin_password}", "{env: DTTEST_ADMIN_PASSWORD}")
    # The lab registry's CA exists only once the lab is built; the registry needs none.
    .replace("  registry_ca: /var/lib/dtlab/registry/ca.crt\n", "")
)
assert "{file:" not in LAB_TEXT

CONTROL = [chr(c) for c in range(32)] + ["\x7f", "\x85", "\u2028", "\u2029", "\ufeff", "\u200b", "\udcff"]
TOKENS = [
    ": ", "- ", "{", "}", "[", "]", ",", "&a ", "*a", "!!", "!!int ", "!!python/object ", "? ", "|",
    ">", "#", "'", '"', "%YAML 1.1\n", "---\n", "...\n", "@", "`", "\t", "\\", "<<: ", "\n", "  ",
]  # fmt: skip
VALUES = [
    "9" * 30, "9" * 150, "-" + "9" * 99, "1e999", "-.inf", ".nan", "0x1F", "0o17", "0b101", "023457",
    "09000", "1:30", "1_000", "yes", "No", "on", "y", "~", "''", '""', "null", "=", "<<", "2022-01-01",
    "x" * 5000, "'a\\nb'", '"a\\u0000b"', '"\\e[2J"', "[" * 100 + "]" * 100, "{a: " * 70 + "1" + "}" * 70,
    "&r [*r]", "*undefined", "!!binary AAAA", "!!timestamp x", "!!float x", "!!int 0x", "!!bool maybe",
    "{env: X}", "{file: /etc/shadow}", "{file: /dev/zero}", "[agent, agent]", "localhost", "0x7f000001",
    "'http://[::1/x'", "'http://u:p@h:1/'", "'http://h:99999/'", "'/mnt/a b'", "'/../..'", "-1", "0",
    "65536", "true", "1.5", "'ｗｉｄｅ'", "'\u2028'",
]  # fmt: skip


def _lines_with_values(text: str) -> list[int]:
    lines = text.split("\n")
    return [i for i, line in enumerate(lines) if ": " in line and not line.lstrip().startswith("#")]


def mutate(rnd: random.Random, text: str) -> str:
    kind = rnd.randrange(11)
    n = len(text)
    at = rnd.randrange(n + 1)
    if kind == 0:  # truncate
        return text[:at]
    if kind == 1:  # splice a slice of the file in elsewhere
        a = rnd.randrange(n + 1)
        b = min(n, a + rnd.randrange(200))
        return text[:at] + text[a:b] + text[at:]
    if kind == 2:  # delete a slice
        return text[:at] + text[at + rnd.randrange(60) :]
    if kind == 3:  # control characters
        return text[:at] + "".join(rnd.choice(CONTROL) for _ in range(rnd.randint(1, 3))) + text[at:]
    if kind == 4:  # YAML syntax
        return text[:at] + rnd.choice(TOKENS) + text[at:]
    lines = text.split("\n")
    candidates = _lines_with_values(text)
    if not candidates:
        return text + "\n" + rnd.choice(VALUES)
    i = rnd.choice(candidates)
    key, _, value = lines[i].partition(": ")
    if kind == 5:  # swap values between two keys
        j = rnd.choice(candidates)
        key_j, _, value_j = lines[j].partition(": ")
        lines[i], lines[j] = f"{key}: {value_j}", f"{key_j}: {value}"
    elif kind == 6:  # a nasty value
        lines[i] = f"{key}: {rnd.choice(VALUES)}"
    elif kind == 7:  # nest the value
        depth = rnd.choice([1, 2, 5, MAX_DEPTH - 3, MAX_DEPTH + 1, 500])
        opener, closer = rnd.choice([("[", "]"), ("{k: ", "}")])
        lines[i] = f"{key}: {opener * depth}{value}{closer * depth}"
    elif kind == 8:  # duplicate a line
        lines.insert(i, lines[i])
    elif kind == 9:  # indentation
        lines[i] = " " * rnd.choice([0, 1, 3, 8]) + lines[i].lstrip()
    else:  # an anchor here, aliases elsewhere
        lines[i] = f"{key}: &v {value or '{}'}"
        for j in rnd.sample(candidates, min(len(candidates), 3)):
            if j != i:
                lines[j] = lines[j].partition(": ")[0] + ": *v"
    return "\n".join(lines)


def check_outcome(path: Path, label: str) -> str:
    """'ok' or 'problems'; fails the test on anything else."""
    try:
        cluster = load_cluster(path)
    except ClusterError as e:
        assert e.problems, label
        for problem in e.problems:
            assert isinstance(problem, str), label
            assert "\n" not in problem and "\r" not in problem, (label, problem)
            assert problem.isprintable(), (label, problem)
            assert problem.startswith((f"{path}: ", f"{path}:")), (label, problem)
        return "problems"
    except Exception as e:  # the point of the test: nothing but ClusterError
        pytest.fail(f"{label}: {type(e).__name__}: {e}\n--- input ---\n{path.read_bytes()[:2000]!r}")
    assert isinstance(cluster, Cluster), label
    return "ok"


@pytest.mark.parametrize("base_name, seed", [("minimal", 1), ("minimal", 2), ("lab", 3), ("lab", 4)])
def test_mutated_files_give_a_cluster_or_clean_problems(tmp_path, monkeypatch, base_name, seed):
    """4 x 500 = 2,000 seeded cases, 1-3 mutations each."""
    for name, value in CORPUS_ENV.items():
        monkeypatch.setenv(name, value)
    base = MINIMAL if base_name == "minimal" else LAB_TEXT
    rnd = random.Random(seed)
    path = tmp_path / "cluster.yaml"
    outcomes = {"ok": 0, "problems": 0}
    for case in range(500):
        text = base
        for _ in range(rnd.randint(1, 3)):
            text = mutate(rnd, text)
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        outcomes[check_outcome(path, f"{base_name} seed {seed} case {case}")] += 1
    # The mutations are neither all harmless nor all fatal.
    assert outcomes["ok"] > 0 and outcomes["problems"] > 400, outcomes


def billion_laughs(levels: int, width: int) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels, width", [(9, 9), (30, 10), (3, 500)])
def test_alias_bombs_are_refused_at_once(tmp_path, levels, width):
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs(levels, width))
    start = time.monotonic()
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    assert time.monotonic() - start < 1.0
    (problem,) = e.value.problems
    assert f"more than {MAX_NODES} nodes once aliases are expanded" in problem
    assert problem.startswith(f"{path}:")


def test_aliases_within_the_budget_still_work(tmp_path, monkeypatch):
    for name, value in CORPUS_ENV.items():
        monkeypatch.setenv(name, value)
    text = MINIMAL.replace(
        "network: {management: 192.0.2.0/24, ipoib: {subnet: 198.51.100.0/24}}",
        "network: {management: &net 192.0.2.0/24, ipoib: {subnet: 198.51.100.0/24}}\n"
        "preflight: {allowed_os: {'Ubuntu 22.04': &kernels ['5.15.*'], 'Ubuntu 20.04': *kernels}}",
    )
    c = load_cluster(_write(tmp_path, text))
    assert dict(c.preflight.allowed_os) == {"Ubuntu 22.04": ("5.15.*",), "Ubuntu 20.04": ("5.15.*",)}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 3_000, 200_000])
def test_deep_nesting_is_refused_with_a_line(tmp_path, depth):
    path = _write(tmp_path, "preflight:\n  x: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    assert e.value.problems == [
        f"{path}:2: YAML refused: nested deeper than {MAX_DEPTH} levels (column {MAX_DEPTH + 4})"
    ]


def test_nesting_up_to_the_limit_is_read(tmp_path):
    path = _write(tmp_path, "x: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "\n")
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    assert "YAML refused" not in str(e.value)  # only the cluster's own problems


def test_large_file_is_refused(tmp_path):
    path = _write(tmp_path, "# " + "x" * 1_100_000 + "\n")
    with pytest.raises(ClusterError) as e:
        load_cluster(path)
    assert e.value.problems == [f"{path}: cannot read the file: larger than 1000000 bytes"]


# --- the command line, as an operator sees it --------------------------------------------------

NASTY_FILES = {
    "bomb.yaml": billion_laughs(9, 9),
    "deep.yaml": "a: " + "[" * 10_000 + "]" * 10_000 + "\n",
    "recursive.yaml": "a: &a {b: *a}\n",
    "huge.yaml": "master_port: " + "9" * 10_000 + "\n",
    "tags.yaml": "master_port: !!python/object/apply:os.system [id]\n",
    "timestamp.yaml": "master_port: !!timestamp soon\n",
    "binary.bin": "\x00\x01\x02",
    "not-utf8.yaml": None,  # written as bytes below
    "ipv6.yaml": MINIMAL.replace("http://mirror.test/minio", "'http://[::1/minio'"),
    "yaml11.yaml": MINIMAL + "master_port: 023457\nreboot: no\n",
    "proxy.yaml": MINIMAL.replace("sources:\n", "sources:\n  apt_proxy: 'http://p:1\";\n'\n", 1),
}


def test_check_command_never_prints_a_traceback(tmp_path):
    files = []
    for name, text in NASTY_FILES.items():
        path = tmp_path / name
        if text is None:
            path.write_bytes(b"master_host: \xff\xfe\n")
        else:
            path.write_text(text)
        files.append(str(path))
    env = {**os.environ, "PYTHONPATH": str(REPO), **CORPUS_ENV}
    run = subprocess.run(
        [sys.executable, "-m", "deploy.cluster", "check", *files],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # deploy.cluster's status for "the file has problems" is 2 (docs/cluster-yaml.md).
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert run.stdout == ""
    note, *lines = run.stderr.splitlines()  # the old command's alias note, then the problems
    assert note.startswith("note: `python -m deploy.cluster check` is an alias"), note
    for file in files:
        assert any(line.startswith(file + ":") for line in lines), file
    assert all(line.startswith(tuple(files)) for line in lines)
