"""Some storage.* keys of deploy/cluster/model.py, declared here to keep model.py short.

`console`: where MinIO's web console listens. `determined_user`: the bucket-only MinIO user
Determined signs with (deploy/minio_iam.py); its name follows MinIO's access key rules
(minio/minio internal/auth/credentials.go: 3 to 20 characters, none of the reserved `=,`).
`endpoint_url`: computed https when storage.tls is set (deploy/cluster/storage_tls.py).
"""

from deploy.cluster import checks
from deploy.cluster.keys import Computed, Key

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
    "only, made by the deploy; not `access_key`. Its secret key is derived from `secret_key` "
    "(scrypt): make that long and random",
)

ENDPOINT_URL = Key(
    checks.url(("http", "https"), trailing_slash=False, path_allowed=False),
    Computed("`http://<storage host>:<port>`; `https://` with `tls`"),
    "where S3 clients reach MinIO",
)

# pg-backup's own user (deploy/minio_iam.py, roles/pg_backup.py): same name rules.
BACKUP_USER = Key(
    DETERMINED_USER.check,
    "pg-backup",
    "the MinIO user the master's nightly database backup signs with (its keys only in the "
    "master's root-only /etc/pg-backup/s3.env): `backups/postgresql/` in the bucket only, made "
    "by the deploy; not `access_key` nor `determined_user` (which is denied `backups/`). Its "
    "secret key is derived from `secret_key` like `determined_user`'s",
)
