"""tests/verify sends each node's checks to one xdist worker (`--dist loadgroup`); pytest 9.2
with pytest-xdist 3.8 silently stopped doing that (pyproject.toml pins pytest below 9.2)."""

import os
import subprocess
import sys
import textwrap


def test_loadgroup_keeps_a_group_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(
        textwrap.dedent("""
        import os
        import pytest

        @pytest.mark.parametrize("i", range(12))
        @pytest.mark.xdist_group("one-node")
        def test_check(i):
            with open(os.environ["WORKERS_FILE"], "a") as f:
                f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    """)
    )
    out = tmp_path / "workers"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "3",
            "--dist",
            "loadgroup",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={**os.environ, "WORKERS_FILE": str(out)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workers = out.read_text().split()
    assert len(workers) == 12 and len(set(workers)) == 1, workers
