"""Determined's PostgreSQL role, for roles/postgresql.py: its password set as a SCRAM-SHA-256
verifier computed on the controller, and compared, run after run, through an HMAC of the stored
verifier under a key kept on the node (digest_key), so no output lets anyone test guesses.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import shlex

from pyinfra import host
from pyinfra.api import StringCommand, operation

from deploy.facts.postgresql import RoleVerifier, psql_stdin
from deploy.facts.trust import SecretFileState
from deploy.secrets import Secret
from roles.shared_ops import node_file, upload_secret

SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations
# The node's key for the keyed digest of the role's verifier (digest_key, RoleVerifier).
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


@operation()
def digest_key(path: str = DIGEST_KEY):
    """The node's key for RoleVerifier's keyed digest, made once: 64 random bytes K, stored as
    K xor ipad then K xor opad (HMAC's two padded keys, so core SQL's sha256() computes HMAC),
    root 0600. The controller reads it back over SFTP (shared_ops.node_file); nothing prints it.
    Lost or replaced, it costs one ALTER ROLE with the same password."""
    if host.get_fact(SecretFileState, path=path) is not None:
        host.noop(f"{path} exists")
        return
    key = os.urandom(64)
    yield StringCommand(f"mkdir -p -m 700 {shlex.quote(path.rsplit('/', 1)[0])}")
    yield from upload_secret(path, bytes(b ^ 0x36 for b in key) + bytes(b ^ 0x5C for b in key))


@operation()
def role(role: str, password: Secret, port: int = 5432, key_path: str = DIGEST_KEY):
    """A LOGIN role whose password is `password`; set only when it differs.

    Not pyinfra's postgres.role: that one cannot compare passwords (it sets a given one on every
    run) and puts the password itself on psql's command line on the node. Here not even the
    verifier reaches a command line (where `ps` on the node shows it to every user): the
    statement is uploaded over SFTP into a root-only file and fed to psql on stdin. The node
    reports only a keyed digest of the verifier (RoleVerifier): no output can test guesses."""
    key = hmac_key(node_file(key_path))
    current = host.get_fact(RoleVerifier, role=role, port=port, key=key_path)
    if current is not None and password_matches(password.value, current, key):
        host.noop(f"role {role} exists with the configured password")
        return
    verb = "CREATE" if current is None else "ALTER"
    yield from psql_stdin(role_statement(verb, role, scram_verifier(password.value, os.urandom(16))), port)


def role_statement(verb: str, role: str, verifier: str) -> bytes:
    """`CREATE|ALTER ROLE "role" WITH LOGIN PASSWORD 'verifier'` (role names are validated to
    a safe character set by the model; a verifier is base64 and `$:` only)."""
    return f"{verb} ROLE \"{role}\" WITH LOGIN PASSWORD '{verifier}';\n".encode()
