"""cluster.yaml's `storage` section (MinIO, its bucket, users and TLS): the `Storage` model and
the specs of its keys that need more than a line.

`console`: where MinIO's web console listens. `determined_user`: the bucket-only MinIO user
Determined signs with (deploy/minio_admin.py); its name follows MinIO's access key rules
(minio/minio internal/auth/credentials.go: 3 to 20 characters, none of the reserved `=,`).
`endpoint_url`: computed https when storage.tls is set (deploy/cluster/storage_tls.py).
`determined_secret_key`, `backup_secret_key`: optional secrets of those users; unset, each is
derived from the root password (user_secrets, below: Storage.determined_secret and
backup_secret, which every consumer reads).
"""

import base64
import functools
import hashlib
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from deploy.cluster import checks, storage_tls
from deploy.cluster.keys import Computed, Key, Required, SecretKey
from deploy.secrets import Secret, SecretRef

CONSOLE = Key(
    checks.choice(("localhost", "all", "disabled")),
    "localhost",
    "where MinIO's web console listens: `localhost` (127.0.0.1:`console_port` on the storage "
    "node; reach it with `ssh -L`), `all` interfaces, or `disabled` (MINIO_BROWSER=off)",
)

DETERMINED_USER = Key(
    checks.matching(
        r"[A-Za-z0-9][A-Za-z0-9._-]{2,19}", "3 to 20 letters, digits, '.', '_' or '-'", rule="MinIO user name"
    ),
    "determined",
    "the MinIO user in master.yaml's checkpoint_storage (so in every trial): the bucket's objects "
    "only, made by the deploy; not `access_key`. Its secret key is `determined_secret_key`, or "
    "derived from `secret_key` (scrypt)",
)

ENDPOINT_URL = Key(
    checks.url(("http", "https"), trailing_slash=False, path_allowed=False),
    Computed("`http://<storage host>:<port>`; `https://` with `tls`"),
    "where S3 clients reach MinIO",
)

# pg-backup's own user (deploy/minio_admin.py, roles/postgresql/backup.py): same name rules.
BACKUP_USER = Key(
    DETERMINED_USER.check,
    "pg-backup",
    "the MinIO user the master's nightly database backup signs with (its keys only in the "
    "master's root-only /etc/pg-backup/s3.env): `backups/postgresql/` in the bucket only, made "
    "by the deploy; not `access_key` nor `determined_user` (which is denied `backups/`). Its "
    "secret key is `backup_secret_key`, or derived from `secret_key`",
)


# MinIO's user secret keys: 8 characters at least (internal/auth/credentials.go IsSecretKeyValid,
# checked by cmd/iam.go CreateUser) and at most 40 (secretKeyMaxLen: CreateNewCredentials refuses
# longer ones). They land quoted in master.yaml and in pg-backup's environment file: the
# characters of a base64 or hex key and `._~-` only.
_USER_SECRET = re.compile(r"[A-Za-z0-9+/=._~-]{8,40}", re.ASCII)


def user_secret_problem(text: str) -> str | None:
    if not _USER_SECRET.fullmatch(text):
        return "must be 8 to 40 letters, digits or '+/=._~-' (MinIO's secret key length)"
    return None


DETERMINED_SECRET_KEY = SecretKey(
    "the secret key of storage.determined_user",
    "the secret key of `determined_user`, which every trial holds (`openssl rand -base64 30`); "
    "unset: derived from `secret_key` with scrypt, so a guessable root password could be "
    "guessed from a trial's key",
    optional=True,
    content=user_secret_problem,
)

BACKUP_SECRET_KEY = SecretKey(
    "the secret key of storage.backup_user",
    "the secret key of `backup_user` (the master's root-only /etc/pg-backup/s3.env); unset: "
    "derived from `secret_key` like `determined_user`'s",
    optional=True,
    content=user_secret_problem,
)


# What a derived secret names as its origin in a repr (never the value): not a reference a
# cluster.yaml can hold, so it cannot be mistaken for the root password's own.
DERIVED = SecretRef("derived", "storage.secret_key")


@functools.lru_cache(maxsize=8)
def derive_secret(root_secret: str, user: str) -> str:
    """A user's secret key derived from MinIO's root password with scrypt, salted with the
    user's name (so each user's differs).

    One-way, so holding it (as every trial holds Determined's) does not give the root password
    nor another user's key away; a guessable root password could still be guessed from it,
    hence the docs ask for a long random storage.secret_key. 40 characters of [A-Za-z0-9_-]:
    safe in YAML and env files. Cached: a process loads the same cluster.yaml again and again.
    """
    raw = hashlib.scrypt(
        root_secret.encode(), salt=f"gpu-cluster/minio/{user}".encode(), n=2**14, r=8, p=1, dklen=30
    )
    return base64.urlsafe_b64encode(raw).decode()


def _user_secret(given: Secret | None, root: Secret | None, user: str | None) -> Secret | None:
    if given is not None:
        return given
    if root is None or user is None:
        return None  # a problem with that key: no Cluster is built
    # Unresolved (load_cluster(resolve_secrets=False)) like the root password it comes from.
    return Secret(DERIVED, derive_secret(root.value, user) if root.resolved else None)


def user_secrets(storage: Any) -> dict[str, Secret | None]:
    """The secret keys of the deploy's MinIO users (deploy/minio_admin.py), by the model's field
    names: the one cluster.yaml gives (storage.determined_secret_key / backup_secret_key), else
    derived from MinIO's root password."""
    return {
        "determined_secret": _user_secret(
            storage.determined_secret_key, storage.secret_key, storage.determined_user
        ),
        "backup_secret": _user_secret(storage.backup_secret_key, storage.secret_key, storage.backup_user),
    }


@dataclass(frozen=True)
class Storage:
    host: Annotated[
        str,
        Key(
            checks.hostname,
            Computed("`master_host`"),
            "hostname of a declared node; that node gets the `storage` role and runs MinIO",
        ),
    ]
    bucket: Annotated[
        str,
        Key(
            checks.bucket,
            Required("the S3 bucket for checkpoints"),
            "the bucket for Determined's checkpoints",
        ),
    ]
    region: Annotated[
        str,
        Key(
            checks.matching(
                r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", "a region name like 'us-east-1'", rule="region name"
            ),
            "us-east-1",
            "MinIO's site region and every S3 client's signing region (see below)",
        ),
    ]
    port: Annotated[int, Key(checks.port, 9000, "MinIO's S3 API port")]
    console_port: Annotated[int, Key(checks.port, 9001, "MinIO's console port; not `storage.port`")]
    console: Annotated[str, CONSOLE]
    data_dir: Annotated[str, Key(checks.abs_path, "/mnt/data", "where MinIO keeps the objects; not `/`")]
    data_on_root_disk: Annotated[
        bool,
        Key(
            checks.boolean,
            False,
            "`true` lets MinIO keep its objects on the root disk; `false`: `data_dir` must be a "
            "mount point (preflight refuses the storage node otherwise, and MinIO's unit will not "
            "start without that mount)",
        ),
    ]
    endpoint_url: Annotated[str, ENDPOINT_URL]
    prefix: Annotated[str | None, Key(checks.key_prefix, None, "object key prefix for checkpoints")]
    access_key: Annotated[
        Secret,
        SecretKey("MinIO's root user (S3 access key)", "MinIO's root user (S3 access key); ≥ 3 characters"),
    ]
    secret_key: Annotated[
        Secret,
        SecretKey(
            "MinIO's root password (S3 secret key)", "MinIO's root password (S3 secret key); ≥ 8 characters"
        ),
    ]
    determined_user: Annotated[str, DETERMINED_USER]
    backup_user: Annotated[str, BACKUP_USER]
    determined_secret_key: Annotated[Secret | None, DETERMINED_SECRET_KEY]
    backup_secret_key: Annotated[Secret | None, BACKUP_SECRET_KEY]
    tls: Annotated[storage_tls.StorageTls, storage_tls.SECTION]
    # Not keys: the secret keys of determined_user and backup_user, each the one given above or
    # derived from secret_key (user_secrets), once, here; every consumer reads these.
    determined_secret: Secret = field(init=False, repr=False, compare=False)
    backup_secret: Secret = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, secret in user_secrets(self).items():
            object.__setattr__(self, name, secret)  # frozen: set once, as __init__ sets a field
