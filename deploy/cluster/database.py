"""cluster.yaml's `database` section: Determined's PostgreSQL database and its backups."""

from dataclasses import dataclass
from typing import Annotated

from deploy.cluster import checks
from deploy.cluster.keys import Key, SecretKey
from deploy.secrets import Secret

_IDENTIFIER = checks.matching(
    r"[A-Za-z_][A-Za-z0-9_]{0,62}",
    "a PostgreSQL identifier (letters, digits, '_')",
    rule="PostgreSQL identifier",
)


@dataclass(frozen=True)
class Database:
    name: Annotated[str, Key(_IDENTIFIER, "determined", "Determined's PostgreSQL database")]
    user: Annotated[str, Key(_IDENTIFIER, "determined", "Determined's PostgreSQL user")]
    port: Annotated[int, Key(checks.port, 5432, "PostgreSQL's port on the master host")]
    backup_keep: Annotated[
        int,
        Key(
            checks.integer(1, 3650),
            14,
            "how many nightly (and pre-upgrade) `pg_dump` backups stay in the bucket under "
            "`backups/postgresql/`; older ones are deleted after each backup",
        ),
    ]
    password: Annotated[
        Secret,
        SecretKey(
            "the PostgreSQL password of the Determined user",
            "the PostgreSQL password of that user; only letters, digits and "
            "`-._~!$&'()*+,;=:@` (it goes unescaped into Determined's database URL)",
        ),
    ]
