"""PostgreSQL on the master node as Determined needs it, and how the role's password is
compared without it leaving the controller: named once here for roles/postgresql/server.py and
roles/postgresql/db_role.py, which install and set it, and tests/verify, which checks it. No role
module: verify imports none (tests/unit/test_shape.py).

The comparison: the node reports only the current verifier's salt and an HMAC of the verifier
under a key kept on the node (deploy/facts/postgresql.py RoleVerifier); the controller computes
the SCRAM-SHA-256 verifier of the configured password with that salt and compares digests, so
no output lets anyone test guesses.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

# Determined needs 13 or newer (12 warns, 11 and older error out) and >= 96 connections.
MIN_MAJOR = 13
MIN_CONNECTIONS = 96
SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations
# The node's key for the keyed digest of the role's verifier (roles/postgresql/db_role.py
# digest_key writes it, RoleVerifier reads it).
DIGEST_KEY = "/var/lib/gpu-cluster/digest.key"


# --- SCRAM-SHA-256 (RFC 5802/7677), as PostgreSQL stores it in pg_authid.rolpassword --------


def scram_verifier(password: str, salt: bytes, iterations: int = SCRAM_ITERATIONS) -> str:
    """SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, all base64.

    PostgreSQL normalises the password with SASLprep first; that is the identity for ASCII
    passwords, and PostgreSQL itself falls back to the raw bytes when SASLprep fails.
    """
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    salt_b64, stored_b64, server_b64 = (base64.b64encode(b).decode() for b in (salt, stored_key, server_key))
    return f"SCRAM-SHA-256${iterations}:{salt_b64}${stored_b64}:{server_b64}"


def hmac_key(stored: bytes | None) -> bytes | None:
    """K from the node's key file (K xor ipad, then K xor opad: see RoleVerifier), or None."""
    if stored is None or len(stored) != 128:
        return None
    return bytes(b ^ 0x36 for b in stored[:64])


def password_matches(password: str, current: dict | None, key: bytes | None) -> bool:
    """Whether the role's current verifier (salt + keyed digest, see RoleVerifier) is `password`'s."""
    if not key or not current or not current["salt"]:
        return False
    try:
        iterations, salt = current["salt"].split(":", 1)
        expected = scram_verifier(password, base64.b64decode(salt), int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(
        hmac.new(key, expected.encode(), hashlib.sha256).hexdigest(), current["digest"]
    )
