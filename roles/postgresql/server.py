"""PostgreSQL for the Determined master, on the master node.

install:   PostgreSQL >= 13: the distribution's own where it is new enough (Debian 12: 15,
           Ubuntu 22.04: 14), else PGDG's 15 (Ubuntu 20.04 ships 12). For 20.04 that is PGDG's
           archive host: focal-pgdg left apt.postgresql.org after focal's end of life (see
           PGDG_ARCHIVED below and docs/operations.md)
configure: conf.d/50-determined.conf (database.port, max_connections >= 96, listen on
           localhost only: the master is on the same node); restart only when it changed
database:  Determined's role and database. The password never leaves the controller in clear:
           the role gets a SCRAM-SHA-256 verifier computed here, and the node is asked only for
           the current verifier's salt and an HMAC of it under a key kept on the node
           (deploy/facts/postgresql.py), so a changed password in cluster.yaml is noticed and
           set, an unchanged one is no change, and no output lets anyone test guesses.
backups:   roles/postgresql/backup.py (a nightly pg_dump into MinIO, and one before any change of the
           master's version)
"""

from __future__ import annotations

import io

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, postgres, systemd
from pyinfra.operations.util import any_changed

from deploy.cluster import Cluster, Node
from deploy.facts.trust import OpenPgpKeys
from deploy.postgresql_node import MIN_MAJOR
from roles.postgresql.db_role import digest_key, role
from roles.postgresql.db_role import (  # re-exported: the role's password handling, for its tests
    password_matches as password_matches,
)
from roles.postgresql.db_role import role_statement as role_statement
from roles.postgresql.db_role import scram_verifier as scram_verifier
from roles.shared.apt_lists import update_lists
from roles.shared.ops import packages
from roles.shared.scripts import script
from roles.shared.templates import render

# Determined's minimums (MIN_MAJOR, MIN_CONNECTIONS) are in deploy/postgresql_node.py: a few
# connections above its floor.
MAX_CONNECTIONS = 100
# (os-release ID, VERSION_ID) -> the major version that distribution ships.
DISTRIBUTION_MAJOR = {
    ("debian", "11"): 13,
    ("debian", "12"): 15,
    ("ubuntu", "20.04"): 12,
    ("ubuntu", "22.04"): 14,
    ("ubuntu", "24.04"): 16,
}
# Taken from PGDG when the distribution's is too old.
PGDG_MAJOR = 15
PGDG_URL = "https://apt.postgresql.org/pub/repos/apt"
# PGDG moves a distribution's DIST-pgdg suite, same name and signing key, to its archive host
# once the distribution is EOL (https://apt-archive.postgresql.org/: "Distribution releases are
# moved here from apt.postgresql.org after they have been EOLed by Debian or Ubuntu"); since
# mid-2025 apt.postgresql.org has no focal-pgdg (404), so `apt-get update` fails on that line.
# The archived suite is frozen: the last PostgreSQL 15 build for focal, no later minor releases.
# Chosen over Ubuntu 20.04's own PostgreSQL 12 because Determined 0.38 warns about 12 at every
# start (master/internal/db/setup.go: checkPostgresVersion, "Postgres 12 will reach it's end of
# life on November 14, 2024") and its 0.38 release notes ask for 13 or later.
PGDG_ARCHIVE_URL = "https://apt-archive.postgresql.org/pub/repos/apt"
PGDG_ARCHIVED = frozenset({"focal"})
PGDG_KEY_URL = "https://www.postgresql.org/media/keys/ACCC4CF8.asc"
PGDG_KEY_FINGERPRINT = "B97B0AFCAA1A47F044F244A07FCC7D46ACCC4CF8"
PGDG_KEY = "/usr/share/postgresql-common/pgdg/apt.postgresql.org.asc"
PGDG_LIST = "/etc/apt/sources.list.d/pgdg.list"


def major_for(os_id: str, os_version: str) -> tuple[int, bool]:
    """(major version to install, whether it comes from PGDG)."""
    shipped = DISTRIBUTION_MAJOR.get((os_id, os_version))
    if shipped is not None and shipped >= MIN_MAJOR:
        return shipped, False
    return PGDG_MAJOR, True


def pgdg_source_line(codename: str) -> str:
    """The sources.list line for PGDG's suite of `codename` (the archive host once it is EOL)."""
    url = PGDG_ARCHIVE_URL if codename in PGDG_ARCHIVED else PGDG_URL
    return f"deb [signed-by={PGDG_KEY}] {url} {codename}-pgdg main\n"


def conf_content(port: int) -> str:
    return render("postgresql/50-determined.conf.j2", port=port, max_connections=MAX_CONNECTIONS)


@operation()
def pgdg_key(url: str = PGDG_KEY_URL, fingerprint: str = PGDG_KEY_FINGERPRINT, dest: str = PGDG_KEY):
    """PGDG's signing key at `dest`, re-checked on every run: the file must hold exactly one
    key, the pinned one (apt trusts every key of a signed-by keyring, so a second key planted
    beside it would sign packages too). Otherwise it is fetched again and kept only if it is
    that one key (files/postgresql/pgdg-key.sh). pyinfra's apt.key installs whatever key the
    URL serves, and adds to a keyring rather than replacing it."""
    found = host.get_fact(OpenPgpKeys, path=dest)
    if found == [fingerprint]:
        host.noop(f"{dest} holds exactly the pinned key {fingerprint}")
        return
    yield script("postgresql/pgdg-key.sh", url, fingerprint, dest)


def _pgdg_source(codename: str) -> None:
    key = pgdg_key(name="PGDG signing key (fingerprint-checked)")
    source = files.put(
        name="PGDG apt source",
        src=io.StringIO(pgdg_source_line(codename)),
        dest=PGDG_LIST,
        mode="644",
    )
    update_lists(name="Refresh apt lists for PGDG", _if=any_changed(key, source))


@deploy("PostgreSQL for Determined")
def apply(cluster: Cluster, node: Node) -> None:
    db = cluster.database
    release = host.get_fact(LinuxDistribution)["release_meta"]
    major, from_pgdg = major_for(release.get("ID", ""), release.get("VERSION_ID", ""))

    # install
    if from_pgdg:
        # Ubuntu 20.04's own PostgreSQL is 12. Not exercised by the lab (Debian 12 nodes).
        packages(["curl", "ca-certificates", "gnupg"], "tools to add the PGDG repository")
        _pgdg_source(release.get("VERSION_CODENAME", ""))
    packages([f"postgresql-{major}"], f"PostgreSQL {major}")

    # configure
    conf = files.put(
        name=f"PostgreSQL settings for Determined (max_connections = {MAX_CONNECTIONS})",
        src=io.StringIO(conf_content(db.port)),
        dest=f"/etc/postgresql/{major}/main/conf.d/50-determined.conf",
        user="postgres",
        group="postgres",
        mode="644",
    )

    # activate. Port, max_connections and listen_addresses take effect only on a restart.
    unit = f"postgresql@{major}-main.service"
    systemd.service(
        name="Restart PostgreSQL for its new settings",
        service=unit,
        running=True,
        restarted=True,
        _if=conf.did_change,
    )
    systemd.service(
        name="PostgreSQL enabled and running", service="postgresql.service", running=True, enabled=True
    )
    systemd.service(name=f"PostgreSQL cluster {major}/main running", service=unit, running=True)

    # database
    digest_key(name="Node key for the keyed digest of the role's password")
    role(
        name=f"Database role {db.user} (password from cluster.yaml)",
        role=db.user,
        password=db.password,
        port=db.port,
    )
    postgres.database(
        name=f"Database {db.name} owned by {db.user}",
        database=db.name,
        owner=db.user,
        psql_port=db.port,
        # As the postgres superuser over the local socket (peer authentication), from /.
        _su_user="postgres",
        _chdir="/",
    )
