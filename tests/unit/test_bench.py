"""tests/lab/bench.py's counters: upstream bytes, controller CPU, operations, the fit check."""

import sys

from tests.lab import bench

NODES = ["10.77.40.10", "10.77.40.11"]
CACHES = {"127.0.0.1", "10.77.40.1"}


def test_upstream_bytes_split_cache_and_direct_from_the_three_logs(tmp_path, monkeypatch):
    mirror, registry, acng = tmp_path / "mirror.log", tmp_path / "registry.log", tmp_path / "acng.log"
    for name, path in (("MIRROR_LOG", mirror), ("REGISTRY_LOG", registry), ("ACNG_LOG", acng)):
        monkeypatch.setattr(bench, name, path)
    # What was there before the step is not counted.
    mirror.write_text('10.77.40.10 - - [30/Nov/2026:16:51:40 +0000] "GET /old HTTP/1.1" 200 999999\n')
    registry.write_text("")
    acng.write_text("1796057470|I|888888|10.77.40.10|debrep/old\n")
    offsets = bench.log_offsets()
    with open(mirror, "a") as f:
        f.write('10.77.40.10 - - [30/Nov/2026:16:51:40 +0000] "GET /mofed/x.tgz HTTP/1.1" 200 1000\n')
        f.write('10.77.40.11 - - [30/Nov/2026:16:51:40 +0000] "GET /mofed/x.tgz HTTP/1.1" 200 1000\n')
        f.write('10.77.40.1 - - [30/Nov/2026:16:51:40 +0000] "GET /cuda/a.deb HTTP/1.1" 200 500\n')
        f.write('10.77.0.12 - - [30/Nov/2026:16:51:40 +0000] "GET /other-lab HTTP/1.1" 200 7\n')
    with open(registry, "a") as f:
        f.write(
            'time="2026-11-30T16:51:40Z" level=info msg="response completed" '
            'http.request.remoteaddr="10.77.40.11:1" http.response.written=300\n'
        )
        f.write(
            '10.77.40.11 - - [30/Nov/2026:16:51:40 +0000] "GET /v2/x/blobs/sha256:ab HTTP/1.1" 200 300 "" '
            '"docker/20.10.24+dfsg1"\n'
        )
    with open(acng, "a") as f:
        f.write("1796057470|I|40|10.77.40.10|debrep/pool/a.deb\n")  # fetched from Debian once
        f.write("1796057470|O|40|10.77.40.10|debrep/pool/a.deb\n")
        f.write("1796057471|O|40|10.77.40.11|debrep/pool/a.deb\n")  # served from the cache
    via_cache, direct = bench.upstream_bytes(offsets, NODES, CACHES)
    assert direct == 1000 + 1000 + 300  # the mirror and the registry, to each node
    assert via_cache == 500 + 40  # the mirror to the caching point, Debian to apt-cacher-ng


def test_controller_cpu_counts_the_command_and_its_children():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    # The work happens in a grandchild, as pyinfra's under python -m deploy.shards.
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}], check=True)"
    result = bench.timed([sys.executable, "-c", parent])
    assert result["rc"] == 0
    assert result["cpu_controller"] >= 0.25


def test_peak_memory_is_the_commands_own_not_the_bench_processs():
    """A command's peak RSS once counted the bench's own size at fork (Linux keeps the
    high-water mark across fork and exec); the launcher keeps it to the command's."""
    ballast = bytearray(400 * 1024 * 1024)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touched: resident in the bench process
    small = bench.timed(["true"])
    big = bench.timed(
        [sys.executable, "-c", "x = bytearray(150 * 1024 * 1024); x[::4096] = b'y' * len(x[::4096])"]
    )
    assert small["rc"] == big["rc"] == 0
    assert small["peak_mb"] < 50, small["peak_mb"]
    assert 150 < big["peak_mb"] < 300, big["peak_mb"]
    del ballast


def test_operations_counts_one_debug_line_per_operation_and_host():
    out = "\n".join(
        [
            "--> Starting operation: Hosts | Hostname ",
            '    [pyinfra.api.operations] Starting operation {"Hosts | Hostname"} on b4-master',
            '[shard 1/2]     [pyinfra.api.operations] Starting operation {"Hosts | Hostname"} on b4-gpu1',
            '    [pyinfra.api.operations] Starting operation {"A | {b}"} on b4-gpu2  ',
        ]
    )
    assert bench.operations(out) == 3


def test_sizes_that_do_not_fit_are_refused_before_booting():
    assert bench.fit_problems(4, 23.0, 77.0) == []
    assert bench.fit_problems(64, 23.0, 77.0) == [
        f"64 nodes need ~102 GB of disk under {bench.STATE}, 77 GB free (8 GB kept for the rest)"
    ]
    # On compressed node storage (node_storage) they fit.
    assert bench.fit_problems(64, 23.0, 77.0, bench.NODE_DISK_GB_COMPRESSED) == []
    assert bench.fit_problems(128, 23.0, 500.0) == ["128 nodes need ~32 GB of memory, 23 GB available"]
    assert bench.main(["--sizes", "4,100000", "--out", "/nonexistent/x.md"]) == 2


def test_table_has_the_new_columns():
    row = {
        "size": 4,
        "step": "no-op re-deploy, 2 shards",
        "wall": 3.0,
        "cmds_per_host": 4,
        "mb_per_node": 0.0,
        "peak_mb": 70,
        "cpu_controller": 2.0,
        "cpu_ms_per_node": 500.0,
        "cpu_ms_per_op": 1.45,
        "cpu_nodes": 1.0,
        "upstream_cache_mb": 0.0,
        "upstream_direct_mb": 12.5,
        "items_per_node": None,
        "rc": 0,
    }
    header, _, line = bench.table([row]).splitlines()
    assert "CPU ms controller/op·host" in header and "upstream MB direct" in header
    cells = (
        "| 4 | no-op re-deploy, 2 shards | 3.0 | 4 | 0.0 | 70 | 2.0 | 500 | 1.45 | 1.0 | 0.0 | 12.5 | - | 0 |"
    )
    assert line == cells
    # The boot row has none of them.
    boot = {k: None for k in row} | {
        "size": 4,
        "step": "lab up (boot)",
        "wall": 2.0,
        "mb_per_node": 0,
        "rc": 0,
    }
    assert (
        bench.table([boot]).splitlines()[2]
        == "| 4 | lab up (boot) | 2.0 | - | 0.0 | - | - | - | - | - | - | - | - | 0 |"
    )


def test_pytest_items_counts_every_outcome_of_the_summary_line():
    out = "matrix: x\n178 passed, 13 skipped in 13.48s\nverify x: all checks passed\n"
    assert bench.pytest_items(out) == 191
    assert bench.pytest_items("==== 3 failed, 1 passed, 2 errors in 1.00s ====") == 6
    assert bench.pytest_items("pyinfra output, no summary") is None


def test_bench_clusters_fetch_through_the_caching_point():
    text = bench.cluster_yaml(4, 41)
    assert "http://10.77.41.1:3142/labmirror/mofed/" in text
    assert "registry: 10.77.41.1:5001" in text
    assert ":8077" not in text and "10.77.0." not in text


def test_what_apt_cacher_ng_fetched_from_the_lab_mirror_is_counted_once(tmp_path, monkeypatch):
    # Through /labmirror/ the mirror's log already counts the bytes (to the cache, 127.0.0.1):
    # apt-cacher-ng's own "I" line for them is not upstream a second time.
    for name in ("MIRROR_LOG", "REGISTRY_LOG", "ACNG_LOG", "REGISTRY_CACHE_LOG"):
        monkeypatch.setattr(bench, name, tmp_path / name)
    offsets = bench.log_offsets()
    (tmp_path / "MIRROR_LOG").write_text(
        '127.0.0.1 - - [30/Nov/2026:16:51:40 +0000] "GET /mofed/x.tgz HTTP/1.1" 200 1000\n'
    )
    (tmp_path / "ACNG_LOG").write_text(
        "1796057470|I|1000|10.77.40.10|labmirror/mofed/x.tgz\n"
        "1796057470|O|1000|10.77.40.10|labmirror/mofed/x.tgz\n"
        "1796057470|O|1000|10.77.40.11|labmirror/mofed/x.tgz\n"
    )
    assert bench.upstream_bytes(offsets, NODES, CACHES) == (1000, 0)


def test_each_command_gets_the_benchs_environment_of_the_moment(monkeypatch):
    """The launcher starts once; a variable set afterwards must still reach the command."""
    bench.timed(["true"])
    monkeypatch.setenv("DTLAB_BENCH_PROBE", "later")
    result = bench.timed([sys.executable, "-c", "import os; print(os.environ['DTLAB_BENCH_PROBE'])"])
    assert result["rc"] == 0 and result["out"].strip() == "later", result["out"]


def test_verify_spread_line():
    rows = [
        {"size": 4, "step": "verify", "wall": 17.0},
        {"size": 4, "step": "verify, again", "wall": 15.0},
        {"size": 4, "step": "verify, again", "wall": 21.0},
        {"size": 4, "step": bench.BUSY_STEP, "wall": 18.0},
        {"size": 4, "step": "cold deploy", "wall": 300.0},
    ]
    assert bench.verify_spread(rows) == (
        "- 4 nodes: verify over 3 healthy runs: min 15.0 s, median 17.0 s, max 21.0 s; "
        "every slot busy: 18.0 s (1.06x the median)"
    )
