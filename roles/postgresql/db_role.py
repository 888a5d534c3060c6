"""Determined's PostgreSQL role, for roles/postgresql/server.py: its password set as a SCRAM-SHA-256
verifier computed on the controller, and compared, run after run, through an HMAC of the stored
verifier under a key kept on the node (digest_key), so no output lets anyone test guesses.
"""

from __future__ import annotations

import os
import shlex

from pyinfra import host
from pyinfra.api import StringCommand, operation

from deploy.facts.postgresql import RoleVerifier, psql_stdin
from deploy.facts.trust import SecretFileState
from deploy.postgresql_node import DIGEST_KEY, hmac_key, password_matches, scram_verifier
from deploy.secrets import Secret
from roles.shared.ops import node_file, upload_secret


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
