"""roles/postgresql/server.py on the Ubuntu releases the lab cannot boot: where PostgreSQL comes from.

Ubuntu 20.04 ships PostgreSQL 12, so the role takes PGDG's 15, from PGDG's archive host (focal-pgdg
left apt.postgresql.org after focal's end of life). Ubuntu 22.04 ships 14: no PGDG source at
all. The rendered line is handed to the controller's own apt-get, which prints the URLs it
would fetch: that is what apt on the node reads from the file the role writes.
"""

import shutil
import subprocess

import pytest

from roles.postgresql import server as postgresql

FOCAL = ("ubuntu", "20.04", "focal")
JAMMY = ("ubuntu", "22.04", "jammy")


def apt_uris(tmp_path, line: str) -> list[str]:
    """The index URLs `apt-get update` would fetch for a sources.list holding `line`."""
    (tmp_path / "lists/partial").mkdir(parents=True)
    listing = tmp_path / "pgdg.list"
    listing.write_text(line)
    proc = subprocess.run(
        [
            "apt-get",
            f"-oDir::Etc::sourcelist={listing}",
            "-oDir::Etc::sourceparts=-",
            f"-oDir::State::Lists={tmp_path / 'lists'}",
            "-oDebug::NoLocking=1",
            "-oAPT::Architecture=amd64",
            "-oAPT::Architectures=amd64",
            "--print-uris",
            "update",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line.split()[0].strip("'") for line in proc.stdout.splitlines() if line.startswith("'")]


def test_focal_takes_pgdg_15_from_the_archive_host():
    os_id, version, codename = FOCAL
    assert postgresql.major_for(os_id, version) == (15, True)
    assert postgresql.pgdg_source_line(codename) == (
        "deb [signed-by=/usr/share/postgresql-common/pgdg/apt.postgresql.org.asc] "
        "https://apt-archive.postgresql.org/pub/repos/apt focal-pgdg main\n"
    )


def test_jammy_uses_its_own_postgresql_14_and_no_pgdg_source():
    os_id, version, _ = JAMMY
    assert postgresql.major_for(os_id, version) == (14, False)


def test_a_supported_codename_stays_on_apt_postgresql_org():
    # Were PGDG ever needed on 22.04: its suite is still on the main host.
    assert " https://apt.postgresql.org/pub/repos/apt jammy-pgdg main\n" in postgresql.pgdg_source_line(
        "jammy"
    )


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get to read the line")
def test_apt_reads_the_focal_line_as_the_archive_suite(tmp_path):
    uris = apt_uris(tmp_path, postgresql.pgdg_source_line("focal"))
    base = "https://apt-archive.postgresql.org/pub/repos/apt/dists/focal-pgdg"
    assert uris[0] == f"{base}/InRelease"
    assert f"{base}/main/binary-amd64/Packages.xz" in uris
    assert not any("://apt.postgresql.org/" in u for u in uris)
