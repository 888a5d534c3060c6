"""PostgreSQL's stored password for a role, without the password or its verifier leaving the node.

pyinfra's PostgresRoles fact reads pg_roles, where the password column is always masked, so it
cannot tell whether a role's password is the configured one (postgres.role therefore sets a
given password on every run, on psql's command line).
"""

from __future__ import annotations

import io
import shlex

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, StringCommand


def psql_stdin(sql: bytes, port: int):
    """Commands that run `sql` as the postgres superuser, the statement on psql's stdin from a
    0600 root file that exists only for this command."""
    temp = host.get_temp_filename("determined-role.sql")
    quoted = shlex.quote(temp)
    yield StringCommand(f"install -m 600 /dev/null {quoted}")
    yield FileUploadCommand(io.BytesIO(sql), temp, remote_temp_filename=host.get_temp_filename(temp))
    yield StringCommand(
        f"cd / && runuser -u postgres -- psql -X -q -p {int(port)} -v ON_ERROR_STOP=1 < {quoted};"
        f" status=$?; rm -f {quoted}; exit $status"
    )


class RoleVerifier(FactBase):
    """{"salt": "<iterations>:<salt>", "digest": HMAC-SHA256 hex of the verifier} or None.

    Only the salt and a keyed digest leave the node: the verifier stays in pg_authid, and a
    plain hash of it would let whoever reads `-vvv` output test password guesses offline. The
    key is the node's `key` file (roles/postgresql/db_role.py: K xor ipad, then K xor opad, 64 bytes
    each, so that core SQL's sha256() makes HMAC without pgcrypto); it reaches psql through a
    pipe (printf is a shell builtin: no command line holds it). `digest` is "" without that
    file; `salt` is "" when the role has no SCRAM password (none, or an old md5 hash).
    runuser rather than pyinfra's _su_user: the command is then the same for any operation, so
    deploy/pyinfra_ext/factcache.py can read this fact in its one batch command per host.
    """

    def requires_command(self, role, port, key):
        return "psql"

    def command(self, role, port, key):
        m = "convert_to(coalesce(rolpassword, ''), 'UTF8')"
        k = "decode(:'k', 'hex')"
        # psql expands :'k' on the client, so the statement the server sees holds the key:
        # keep it out of the server log even if the statement fails (superuser-only settings,
        # for this session alone; -q keeps their "SET" tags out of the output).
        sql = (
            "SET log_min_error_statement = panic; SET log_statement = 'none'; "
            "SELECT CASE WHEN rolpassword LIKE 'SCRAM-SHA-256$%' "
            "THEN split_part(rolpassword, '$', 2) ELSE '' END"
            f" || ' ' || CASE WHEN length({k}) <> 128 THEN '' ELSE encode(sha256("
            f"substring({k} from 65 for 64) || sha256(substring({k} from 1 for 64) || {m})), 'hex') END"
            f" FROM pg_authid WHERE rolname = '{role}';"
        )
        hexkey = f"\"$(od -An -v -tx1 {shlex.quote(key)} 2>/dev/null | tr -d ' \\n')\""
        return (
            f"{{ printf '\\\\set k %s\\n' {hexkey}; printf '%s\\n' {shlex.quote(sql)}; }}"
            f" | (cd / && runuser -u postgres -- psql -X -q -p {int(port)} -v ON_ERROR_STOP=1 -At)"
        )

    def process(self, output):
        line = " ".join(output).strip()
        if not line:
            return None
        salt, _, digest = line.rpartition(" ")
        return {"salt": salt, "digest": digest}
