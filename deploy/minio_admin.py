"""The deploy's own MinIO users: Determined's (the checkpoint bucket) and pg-backup's (the
database backups), never MinIO's root user.

MinIO's root keys (storage.access_key / secret_key) stay in /etc/default/minio and in the
deploy. master.yaml's checkpoint_storage (which Determined hands to every trial container)
and the master's S3 environment get Determined's user (storage.determined_user): it may read,
write and delete objects in the checkpoint bucket and nothing else: no other bucket, no bucket
creation, no admin API, and nothing under backups/ (an explicit Deny, which no Allow can
lift). The nightly PostgreSQL dumps (roles/postgresql/backup.py) sign with their own user
(storage.backup_user), whose keys only the master's root has (/etc/pg-backup/s3.env): put,
get, delete and list under backups/postgresql/, nothing else. So a trial's code can neither
read a dump (password hashes, experiment metadata) nor overwrite or delete one.

Users, their canned policies and the mappings between them are made through MinIO's admin API
(/minio/admin/v3/..., minio-py's MinioAdmin) from the controller, with the root keys, the same
way deploy/s3.py makes the bucket: the controller already reaches MinIO over the management
network and has minio-py; doing it on the storage node would need MinIO's `mc` there (one more
binary to pin) and the root keys on its command line or in its config.

The state read back (policy document, user status and policy, and whether the user's secret
signs) decides whether anything is done, so a second deploy changes nothing and a user whose
policy or secret was changed on the server is repaired. Messages never contain a secret: they
name the user, the policy and MinIO's error code only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import urllib3
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin

from deploy import s3
from deploy.cluster import Cluster
from deploy.cluster.model import Storage
from deploy.secrets import Secret

# Where roles/postgresql/backup.py puts the database dumps (its PREFIX), and the part of the bucket
# Determined's user is denied: everything under backups/, so a later kind of backup is covered
# too. deploy/cluster/rules.py keeps storage.prefix out of it.
BACKUP_PREFIX = "backups/postgresql/"
RESERVED_PREFIX = "backups/"

# What Determined's checkpoint storage does with S3 (boto3 in the trials, the master's
# checkpoint GC): objects in, out, deleted, listed; boto3's upload_file switches to a multipart
# upload above 8 MiB, which needs the multipart actions too.
BUCKET_ACTIONS = ("s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads")
OBJECT_ACTIONS = (
    "s3:AbortMultipartUpload",
    "s3:DeleteObject",
    "s3:GetObject",
    "s3:ListMultipartUploadParts",
    "s3:PutObject",
)
# What files/postgresql/pg-backup does, and no more: one PUT per dump (a single request, never
# multipart), a ListObjectsV2 with prefix=backups/postgresql/, GETs for a restore, DELETEs of
# the oldest. It signs for the region in its settings and never asks GetBucketLocation.
BACKUP_OBJECT_ACTIONS = ("s3:DeleteObject", "s3:GetObject", "s3:PutObject")
# MinIO lets any user set its own password through the admin API unless a policy denies it
# (minio/minio cmd/admin-handlers-users.go AddUser: `checkDenyOnly := accessKey ==
# cred.AccessKey`): one trial could lock the master and every other trial out. Likewise it
# lets a user make service accounts (access keys) for itself (AddServiceAccount's deny-only
# check, targetUser == cred.AccessKey): a key minted by one trial would outlive the next
# rotation of this user's secret, which the deploy could not see. Both users are denied both.
DENIED_ADMIN_ACTIONS = ("admin:CreateServiceAccount", "admin:CreateUser")

# MinIO's limits for a user's keys (minio/minio internal/auth/credentials.go:
# secretKeyMinLen 8; secretKeyMaxLen 40 is the longest it generates).
SECRET_KEY_LENGTH = 40


class IamError(Exception):
    """The user or its policy cannot be made; one line, no secrets."""


@dataclass(frozen=True)
class User:
    """One MinIO user the deploy makes: its name, its canned policy's name and document, and
    its secret key (the model's, computed once: storage.determined_secret / backup_secret)."""

    name: str
    policy: str
    document: dict[str, Any] = field(compare=False, hash=False, repr=False)
    scope: str  # what the policy allows, for operation names and messages
    secret: Secret = field(compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return f"MinIO user {self.name}"


def _deny_admin() -> dict[str, Any]:
    # Admin actions take no Resource (MinIO's own consoleAdmin policy has none).
    return {"Effect": "Deny", "Action": list(DENIED_ADMIN_ACTIONS)}


def determined_policy(storage: Storage) -> dict[str, Any]:
    """Determined's canned policy: the checkpoint bucket's objects (under storage.prefix),
    never the backups.

    The Deny statements win over any Allow (minio/pkg policy/policy.go Policy.IsAllowed checks
    every Deny first). Objects: any s3 action on a key under backups/ (GetObject, PutObject,
    DeleteObject, the multipart ones; CopyObject checks GetObject on its source and the
    multi-object delete DeleteObject per key: minio/minio cmd/object-handlers.go,
    cmd/bucket-handlers.go). Listing: ListBucket with a prefix under backups/; MinIO puts the
    request's query parameters into the condition values (cmd/bucket-policy.go
    getConditionValues), so s3:prefix is ListObjects' `prefix`. A listing of the whole bucket
    (no prefix) still shows the backups' names, not their content.
    """
    bucket = f"arn:aws:s3:::{storage.bucket}"
    prefix = (storage.prefix or "").strip("/")
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": list(BUCKET_ACTIONS), "Resource": [bucket]},
            {
                "Effect": "Allow",
                "Action": list(OBJECT_ACTIONS),
                "Resource": [f"{bucket}/{prefix}/*" if prefix else f"{bucket}/*"],
            },
            {"Effect": "Deny", "Action": ["s3:*"], "Resource": [f"{bucket}/{RESERVED_PREFIX}*"]},
            {
                "Effect": "Deny",
                "Action": ["s3:ListBucket"],
                "Resource": [bucket],
                "Condition": {"StringLike": {"s3:prefix": [f"{RESERVED_PREFIX}*"]}},
            },
            _deny_admin(),
        ],
    }


def backup_policy(storage: Storage) -> dict[str, Any]:
    """pg-backup's canned policy: its own objects under backups/postgresql/ and the listing of
    that prefix only (s3:prefix is valid for ListBucket: minio/pkg policy/action.go
    createActionConditionKeyMap)."""
    bucket = f"arn:aws:s3:::{storage.bucket}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [bucket],
                "Condition": {"StringLike": {"s3:prefix": [f"{BACKUP_PREFIX}*"]}},
            },
            {
                "Effect": "Allow",
                "Action": list(BACKUP_OBJECT_ACTIONS),
                "Resource": [f"{bucket}/{BACKUP_PREFIX}*"],
            },
            _deny_admin(),
        ],
    }


def determined(storage: Storage) -> User:
    return User(
        storage.determined_user,
        f"{storage.determined_user}-checkpoints",
        determined_policy(storage),
        f"bucket {storage.bucket} except {RESERVED_PREFIX}",
        storage.determined_secret,
    )


def backup(storage: Storage) -> User:
    return User(
        storage.backup_user,
        f"{storage.backup_user}-postgresql",
        backup_policy(storage),
        f"{storage.bucket}/{BACKUP_PREFIX} only",
        storage.backup_secret,
    )


def users(storage: Storage) -> tuple[User, ...]:
    return determined(storage), backup(storage)


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return sorted(value) if isinstance(value, list) else [value]


def _conditions(value: Any) -> Any:
    # MinIO prints each condition's values as a JSON array in set order (minio/pkg
    # policy/condition valueset.go MarshalJSON): sorted here, a lone string made a list.
    if not isinstance(value, dict):
        return value
    return {
        op: {k: _as_list(v) for k, v in keys.items()} if isinstance(keys, dict) else keys
        for op, keys in value.items()
    }


def canonical(policy: Any) -> str:
    """A policy as a comparable string: MinIO answers with its own order and layout
    (Action and Resource are sets there, printed sorted), so equal policies compare equal."""
    if not isinstance(policy, dict):
        return json.dumps(policy, sort_keys=True)
    statements = []
    raw = policy.get("Statement")
    for st in raw if isinstance(raw, list) else [raw]:
        if not isinstance(st, dict):
            statements.append(json.dumps(st, sort_keys=True))
            continue
        norm = {
            k: (_as_list(v) if k in ("Action", "NotAction", "Resource", "NotResource") else v)
            for k, v in st.items()
        }
        if "Condition" in norm:
            norm["Condition"] = _conditions(norm["Condition"])
        norm = {k: v for k, v in norm.items() if v not in ([], {}, "")}
        statements.append(json.dumps(norm, sort_keys=True))
    rest = {k: v for k, v in policy.items() if k != "Statement"}
    return json.dumps({**rest, "Statement": sorted(statements)}, sort_keys=True)


def secret_source(storage: Storage, user: str) -> str:
    """Where a user's secret key comes from, for messages (never the key)."""
    for key in ("determined_secret_key", "backup_secret_key"):
        if getattr(storage, key) is not None and user == getattr(storage, key.replace("secret_key", "user")):
            return f"storage.{key}"
    return "the one the deploy derives from storage.secret_key"


def admin_client(cluster: Cluster, timeout: float = 10.0, retries: int = 2) -> MinioAdmin:
    """MinIO's admin API with the root keys, signing for storage.region."""
    storage = cluster.storage
    return MinioAdmin(
        endpoint=s3.endpoint(cluster),
        credentials=StaticProvider(storage.access_key.value, storage.secret_key.value),
        region=storage.region,
        secure=s3.secure(cluster),  # storage.tls: https, checked like deploy/s3.py's client
        http_client=s3.pool(cluster, timeout, retries),
    )


def error_code(e: MinioAdminException) -> str:
    """The Code of MinIO's JSON error body (minio/minio cmd/api-errors.go APIErrorResponse), else the
    HTTP status; the body itself is never shown."""
    try:
        body = json.loads(e._body)  # minio-py keeps the response body there, unparsed
        return str(body.get("Code")) if isinstance(body, dict) and body.get("Code") else f"HTTP {e._code}"
    except (ValueError, TypeError, AttributeError):
        return f"HTTP {getattr(e, '_code', '?')}"


@dataclass
class State:
    """What MinIO has, as far as it differs from what cluster.yaml wants."""

    policy: str | None = None  # why the policy must be written, or None
    user: str | None = None  # why the user must be (re)written (missing, disabled, secret)
    mapping: str | None = None  # why the policy must be set on the user

    @property
    def problems(self) -> list[str]:
        return [p for p in (self.policy, self.user, self.mapping) if p]


def _secret_signs(cluster: Cluster, user: User) -> str | None:
    """None when the user's keys sign a request MinIO accepts, else MinIO's error code.

    GetBucketLocation: MinIO checks the signature before the policy (cmd/auth-handler.go
    checkRequestAuthType), so AccessDenied (pg-backup's user may not ask it) also means the
    secret signs; a wrong one is SignatureDoesNotMatch or InvalidAccessKeyId.
    """
    storage = cluster.storage
    client = s3.client(cluster, user.name, user.secret.value, timeout=5.0, retries=0)
    try:
        s3.bucket_location(client, storage.bucket, storage.region)
    except S3Error as e:
        return e.code
    return None


def read_state(cluster: Cluster, user: User | None = None, admin: MinioAdmin | None = None) -> State:
    """Read `user`'s policy, the user and whether its secret works (Determined's user when
    none is given). Raises IamError when MinIO cannot be reached or refuses the root keys."""
    user = user or determined(cluster.storage)
    admin = admin or admin_client(cluster, timeout=5.0, retries=0)
    name = user.policy
    state = State()
    try:
        try:
            current = json.loads(admin.policy_info(name))
            if canonical(current) != canonical(user.document):
                state.policy = f"policy {name} differs from the one cluster.yaml implies"
        except MinioAdminException as e:
            if error_code(e) != "XMinioAdminNoSuchPolicy":
                raise
            state.policy = f"policy {name} does not exist"
        try:
            info = json.loads(admin.user_info(user.name))
        except MinioAdminException as e:
            if error_code(e) != "XMinioAdminNoSuchUser":
                raise
            state.user = f"user {user.name} does not exist"
            state.mapping = f"user {user.name} has no policy"
            return state
    except MinioAdminException as e:
        raise IamError(
            f"MinIO at {s3.endpoint(cluster)} refused the admin API: {error_code(e)}; check "
            "MINIO_ROOT_USER/PASSWORD in /etc/default/minio on the storage node"
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise IamError(f"MinIO at {s3.endpoint(cluster)} is not reachable: {s3.unreachable(e)}") from None
    if info.get("status") != "enabled":
        state.user = f"user {user.name} is {info.get('status') or 'not enabled'}"
    policies = sorted(p for p in str(info.get("policyName") or "").split(",") if p)
    if policies != [name]:
        state.mapping = f"user {user.name} has policies {policies or 'none'}, not [{name}]"
    if state.user is None:
        try:
            refused = _secret_signs(cluster, user)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise IamError(f"MinIO at {s3.endpoint(cluster)} is not reachable: {s3.unreachable(e)}") from None
        # Another refusal (AccessDenied) comes from the policy or mapping, read above.
        if refused in ("SignatureDoesNotMatch", "InvalidAccessKeyId"):
            source = secret_source(cluster.storage, user.name)
            state.user = f"user {user.name}'s secret key is not {source} ({refused})"
    return state


def ensure(cluster: Cluster, user: User | None = None) -> list[str]:
    """Make MinIO's `user` (Determined's when none is given) match cluster.yaml; returns what
    was done (empty when nothing)."""
    user = user or determined(cluster.storage)
    admin = admin_client(cluster)
    state = read_state(cluster, user, admin)
    name = user.policy
    done = []
    try:
        if state.policy:
            admin.policy_add(name, policy=user.document)
            done.append(f"wrote policy {name} ({state.policy})")
        if state.user:
            # add-user creates the user or replaces its secret and status; its policy stays.
            admin.user_add(user.name, user.secret.value)
            done.append(f"wrote user {user.name} ({state.user})")
        if state.mapping:
            # set-user-or-group-policy replaces the user's policies: exactly this one remains.
            admin.policy_set(name, user=user.name)
            done.append(f"set policy {name} on user {user.name} ({state.mapping})")
    except MinioAdminException as e:
        raise IamError(
            f"MinIO at {s3.endpoint(cluster)} refused to update {user.name}: {error_code(e)}"
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise IamError(f"MinIO at {s3.endpoint(cluster)} is not reachable: {s3.unreachable(e)}") from None
    left = read_state(cluster, user, admin).problems
    if left:
        raise IamError(f"MinIO still differs after the update: {'; '.join(left)}")
    return done
