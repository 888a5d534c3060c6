"""Determined's own MinIO user: the checkpoint bucket only, never MinIO's root user.

MinIO's root keys (storage.access_key / secret_key) stay in /etc/default/minio and in the
deploy; master.yaml's checkpoint_storage (which Determined hands to every trial container)
and the master's S3 environment get this user's keys instead. A trial can then read, write
and delete objects in the checkpoint bucket and nothing else: no other bucket, no bucket
creation, no admin API.

The user, its canned policy and the mapping between them are made through MinIO's admin API
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

import base64
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import urllib3
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error
from minio.minioadmin import MinioAdmin

from deploy import s3
from deploy.cluster import Cluster
from deploy.cluster.model import Storage

# roles/pg_backup.py's PREFIX: the nightly database dumps go into the checkpoint bucket with
# the master's keys (these), so the policy must cover them when storage.prefix is set.
BACKUP_PREFIX = "backups/postgresql/"

# What Determined's checkpoint storage does with S3 (boto3 in the trials, the master's
# checkpoint GC, pg-backup): objects in, out, deleted, listed; boto3's upload_file switches to
# a multipart upload above 8 MiB, which needs the multipart actions too.
BUCKET_ACTIONS = ("s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads")
OBJECT_ACTIONS = (
    "s3:AbortMultipartUpload",
    "s3:DeleteObject",
    "s3:GetObject",
    "s3:ListMultipartUploadParts",
    "s3:PutObject",
)
# MinIO lets any user set its own password through the admin API unless a policy denies it
# (minio/minio cmd/admin-handlers-users.go AddUser: `checkDenyOnly := accessKey ==
# cred.AccessKey`): one trial could lock the master and every other trial out. Likewise it
# lets a user make service accounts (access keys) for itself (AddServiceAccount's deny-only
# check, targetUser == cred.AccessKey): a key minted by one trial would outlive the next
# rotation of this user's secret, which the deploy could not see.
DENIED_ADMIN_ACTIONS = ("admin:CreateServiceAccount", "admin:CreateUser")

# MinIO's limits for a user's keys (minio/minio internal/auth/credentials.go:
# secretKeyMinLen 8; secretKeyMaxLen 40 is the longest it generates).
SECRET_KEY_LENGTH = 40


class IamError(Exception):
    """The user or its policy cannot be made; one line, no secrets."""


def policy_name(storage: Storage) -> str:
    return f"{storage.determined_user}-checkpoints"


def policy_document(storage: Storage) -> dict[str, Any]:
    """The canned policy of Determined's user: the checkpoint bucket and its objects only."""
    bucket = f"arn:aws:s3:::{storage.bucket}"
    prefix = (storage.prefix or "").strip("/")
    objects = [f"{bucket}/{prefix}/*", f"{bucket}/{BACKUP_PREFIX}*"] if prefix else [f"{bucket}/*"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": list(BUCKET_ACTIONS), "Resource": [bucket]},
            {"Effect": "Allow", "Action": list(OBJECT_ACTIONS), "Resource": objects},
            # Admin actions take no Resource (MinIO's own consoleAdmin policy has none).
            {"Effect": "Deny", "Action": list(DENIED_ADMIN_ACTIONS)},
        ],
    }


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return sorted(value) if isinstance(value, list) else [value]


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
        norm = {k: v for k, v in norm.items() if v not in ([], {}, "")}
        statements.append(json.dumps(norm, sort_keys=True))
    rest = {k: v for k, v in policy.items() if k != "Statement"}
    return json.dumps({**rest, "Statement": sorted(statements)}, sort_keys=True)


@functools.lru_cache(maxsize=8)
def _derive(root_secret: str, user: str) -> str:
    raw = hashlib.scrypt(
        root_secret.encode(), salt=f"gpu-cluster/minio/{user}".encode(), n=2**14, r=8, p=1, dklen=30
    )
    return base64.urlsafe_b64encode(raw).decode()


def determined_secret_key(storage: Storage) -> str:
    """The secret key of Determined's user: derived from MinIO's root password with scrypt.

    One-way, so holding it (as every trial does) does not give the root password away; a
    guessable root password could still be guessed from it, hence the docs ask for a long
    random storage.secret_key. 40 characters of [A-Za-z0-9_-]: safe in YAML and env files.
    """
    return _derive(storage.secret_key.value, storage.determined_user)


def _pool(timeout: float, retries: int) -> urllib3.PoolManager:
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=timeout, read=timeout),
        retries=urllib3.Retry(total=retries, backoff_factor=0.5, status_forcelist=[500, 502, 503, 504]),
    )


def admin_client(cluster: Cluster, timeout: float = 10.0, retries: int = 2) -> MinioAdmin:
    """MinIO's admin API with the root keys, signing for storage.region."""
    storage = cluster.storage
    return MinioAdmin(
        endpoint=s3.endpoint(cluster),
        credentials=StaticProvider(storage.access_key.value, storage.secret_key.value),
        region=storage.region,
        secure=False,
        http_client=_pool(timeout, retries),
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


def _secret_signs(cluster: Cluster) -> str | None:
    """None when Determined's keys sign a request MinIO accepts, else MinIO's error code."""
    storage = cluster.storage
    client = s3.client(
        cluster, storage.determined_user, determined_secret_key(storage), timeout=5.0, retries=0
    )
    try:
        s3.bucket_location(client, storage.bucket, storage.region)
    except S3Error as e:
        return e.code
    return None


def read_state(cluster: Cluster, admin: MinioAdmin | None = None) -> State:
    """Read the policy, the user and whether its secret works. Raises IamError when MinIO
    cannot be reached or refuses the root keys."""
    storage = cluster.storage
    admin = admin or admin_client(cluster, timeout=5.0, retries=0)
    name, user = policy_name(storage), storage.determined_user
    state = State()
    try:
        try:
            current = json.loads(admin.policy_info(name))
            if canonical(current) != canonical(policy_document(storage)):
                state.policy = f"policy {name} differs from the one cluster.yaml implies"
        except MinioAdminException as e:
            if error_code(e) != "XMinioAdminNoSuchPolicy":
                raise
            state.policy = f"policy {name} does not exist"
        try:
            info = json.loads(admin.user_info(user))
        except MinioAdminException as e:
            if error_code(e) != "XMinioAdminNoSuchUser":
                raise
            state.user = f"user {user} does not exist"
            state.mapping = f"user {user} has no policy"
            return state
    except MinioAdminException as e:
        raise IamError(
            f"MinIO at {s3.endpoint(cluster)} refused the admin API: {error_code(e)}; check "
            "MINIO_ROOT_USER/PASSWORD in /etc/default/minio on the storage node"
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise IamError(f"MinIO at {s3.endpoint(cluster)} is not reachable: {type(e).__name__}") from None
    if info.get("status") != "enabled":
        state.user = f"user {user} is {info.get('status') or 'not enabled'}"
    policies = sorted(p for p in str(info.get("policyName") or "").split(",") if p)
    if policies != [name]:
        state.mapping = f"user {user} has policies {policies or 'none'}, not [{name}]"
    if state.user is None:
        try:
            refused = _secret_signs(cluster)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise IamError(f"MinIO at {s3.endpoint(cluster)} is not reachable: {type(e).__name__}") from None
        # Another refusal (AccessDenied) comes from the policy or mapping, read above.
        if refused in ("SignatureDoesNotMatch", "InvalidAccessKeyId"):
            state.user = f"user {user}'s secret key is not the one the deploy derives ({refused})"
    return state


def ensure(cluster: Cluster) -> list[str]:
    """Make MinIO match cluster.yaml; returns what was done (empty when nothing)."""
    storage = cluster.storage
    admin = admin_client(cluster)
    state = read_state(cluster, admin)
    name, user = policy_name(storage), storage.determined_user
    done = []
    try:
        if state.policy:
            admin.policy_add(name, policy=policy_document(storage))
            done.append(f"wrote policy {name} ({state.policy})")
        if state.user:
            # add-user creates the user or replaces its secret and status; its policy stays.
            admin.user_add(user, determined_secret_key(storage))
            done.append(f"wrote user {user} ({state.user})")
        if state.mapping:
            # set-user-or-group-policy replaces the user's policies: exactly this one remains.
            admin.policy_set(name, user=user)
            done.append(f"set policy {name} on user {user} ({state.mapping})")
    except MinioAdminException as e:
        raise IamError(f"MinIO at {s3.endpoint(cluster)} refused to update {user}: {error_code(e)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise IamError(f"MinIO at {s3.endpoint(cluster)} is not reachable: {type(e).__name__}") from None
    left = read_state(cluster, admin).problems
    if left:
        raise IamError(f"MinIO still differs after the update: {'; '.join(left)}")
    return done
