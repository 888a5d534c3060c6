"""The checkpoint bucket, seen from the controller with minio-py.

The deploy (roles/minio/server.py) and the checks (tests/verify/test_storage.py) both talk to MinIO
from the controller, at the storage node's management address, signing every request for
`storage.region`: a request signed for another region than MinIO's site region is refused,
which is the "MinIO region" pitfall: clients sign for us-east-1 by default, and a mismatch
with the server's region fails every checkpoint upload.

Messages never contain a key: S3Error text names the bucket and the error code only.
"""

from __future__ import annotations

import re
import ssl
import xml.etree.ElementTree as ET
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.error import S3Error

from deploy.cluster import Cluster

# S3 reports us-east-1 as an empty LocationConstraint (a quirk kept from AWS's first region).
DEFAULT_REGION = "us-east-1"


class BucketError(Exception):
    """The bucket cannot be made or is not what cluster.yaml says; one line, no secrets."""


def endpoint(cluster: Cluster) -> str:
    """host:port of MinIO's S3 API as the controller reaches it (management address)."""
    return f"{cluster.storage_node.address}:{cluster.storage.port}"


def client(
    cluster: Cluster,
    access_key: str | None = None,
    secret_key: str | None = None,
    timeout: float = 10.0,
    retries: int = 2,
) -> Minio:
    """A client signing for storage.region; the root keys from cluster.yaml by default."""
    storage = cluster.storage
    return Minio(
        endpoint(cluster),
        access_key=storage.access_key.value if access_key is None else access_key,
        secret_key=storage.secret_key.value if secret_key is None else secret_key,
        region=storage.region,
        secure=secure(cluster),
        http_client=pool(cluster, timeout, retries),
    )


def secure(cluster: Cluster) -> bool:
    """https (storage.tls): MinIO then serves nothing else."""
    return cluster.storage.tls.enabled


def pool(cluster: Cluster, timeout: float = 10.0, retries: int = 2) -> urllib3.PoolManager:
    """The controller's connections to MinIO. With storage.tls they go to the management
    address (endpoint()) but check the certificate against endpoint_url's host, the name it
    holds (urllib3's server_hostname: SNI and the name matched), and against
    storage.tls.ca_certificate when given (else the controller's system store)."""
    tls = cluster.storage.tls
    options: dict = {}
    if tls.enabled:
        options["server_hostname"] = urlsplit(cluster.storage.endpoint_url).hostname
        options["cert_reqs"] = "CERT_REQUIRED"
        if tls.ca_certificate is not None:
            options["ca_cert_data"] = tls.ca_certificate.text
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=timeout, read=timeout),
        retries=urllib3.Retry(total=retries, backoff_factor=0.5, status_forcelist=[500, 502, 503, 504]),
        **options,
    )


def bucket_location(s3: Minio, bucket: str, region: str) -> str:
    """GET /<bucket>?location, the way S3 clients discover a bucket's region.

    minio-py 7.2 has no public call for it (its private `_get_region` is skipped whenever the
    client has a region), so the request goes through its signed `_url_open`.
    """
    response = s3._url_open("GET", region, bucket_name=bucket, query_params={"location": ""})
    text = ET.fromstring(response.data.decode()).text
    return text or DEFAULT_REGION


def _location(s3: Minio, bucket: str, region: str) -> str | None:
    """The bucket's location, or None if it does not exist.

    A GET rather than bucket_exists' HEAD: a refused HEAD has no body, so minio-py can only
    say "BadRequest"; the GET's error names the cause (for a region mismatch, the region
    MinIO expects).
    """
    try:
        return bucket_location(s3, bucket, region)
    except S3Error as e:
        if e.code == "NoSuchBucket":
            return None
        raise


def unreachable(e: Exception) -> str:
    """Why a connection failed, in one line without keys: urllib3's MaxRetryError names only
    the URL, its `reason` the cause (with storage.tls an SSLError such as "certificate verify
    failed: IP address mismatch" or "unable to get local issuer certificate")."""
    reason = getattr(e, "reason", None)
    if isinstance(reason, (urllib3.exceptions.SSLError, ssl.SSLError)) or isinstance(e, ssl.SSLError):
        return f"{type(reason or e).__name__}: {reason or e}"
    if isinstance(reason, Exception):
        # NewConnectionError's text starts with the connection object's repr: left out.
        why = re.sub(r"^<[^>]*>: ", "", str(reason))
        return f"{type(e).__name__} ({type(reason).__name__}: {why})"
    return type(e).__name__


def bucket_problem(cluster: Cluster, s3: Minio | None = None) -> str | None:
    """None when the bucket exists with location == storage.region, else what is wrong.

    Never raises: an unreachable MinIO (not installed yet, say) is a problem like any other.
    """
    storage = cluster.storage
    try:
        s3 = s3 or client(cluster, timeout=5.0, retries=0)
        location = _location(s3, storage.bucket, storage.region)
    except S3Error as e:
        return f"MinIO at {endpoint(cluster)} refused the request: {e.code} ({e.message})"
    except (urllib3.exceptions.HTTPError, OSError) as e:
        return f"MinIO at {endpoint(cluster)} is not reachable: {unreachable(e)}"
    if location is None:
        return f"bucket {storage.bucket} does not exist"
    if location != storage.region:
        return (
            f"bucket {storage.bucket} has location {location!r}, cluster.yaml says region {storage.region!r}"
        )
    return None


def ensure_bucket(cluster: Cluster) -> bool:
    """Make the bucket if it is missing and check its location. True if it was created.

    Raises BucketError when MinIO cannot be reached or refuses, or the location read back is
    not storage.region (MinIO's MINIO_SITE_REGION differs from cluster.yaml's region).
    """
    storage = cluster.storage
    s3 = client(cluster)
    created = False
    try:
        location = _location(s3, storage.bucket, storage.region)
        if location is None:
            s3.make_bucket(storage.bucket, location=storage.region)
            created = True
            location = bucket_location(s3, storage.bucket, storage.region)
    except S3Error as e:
        raise BucketError(
            f"MinIO at {endpoint(cluster)} refused bucket {storage.bucket}: {e.code} "
            f"({e.message}); check MINIO_ROOT_USER/PASSWORD and MINIO_SITE_REGION in "
            "/etc/default/minio on the storage node"
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise BucketError(
            f"MinIO at {endpoint(cluster)} is not reachable from the controller: {unreachable(e)}"
        ) from None
    if location != storage.region:
        raise BucketError(
            f"bucket {storage.bucket} reads back location {location!r}, not {storage.region!r}: "
            "MinIO's MINIO_SITE_REGION and storage.region must agree"
        )
    return created
