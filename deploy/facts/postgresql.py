"""PostgreSQL's stored password for a role, without the password or its verifier leaving the node.

pyinfra's PostgresRoles fact reads pg_roles, where the password column is always masked, so it
cannot tell whether a role's password is the configured one (postgres.role therefore sets a
given password on every run, on psql's command line).
"""

from __future__ import annotations

import io
import shlex

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, QuoteString, StringCommand


def psql(sql, port: int) -> StringCommand:
    """psql as the postgres superuser over the local socket (peer authentication).

    runuser rather than pyinfra's _su_user: the command is then the same for any operation,
    so deploy/pyinfra_ext/factcache.py can read this fact in its one batch command per host."""
    return StringCommand(
        f"cd / && runuser -u postgres -- psql -X -q -p {int(port)} -v ON_ERROR_STOP=1 -Atc", QuoteString(sql)
    )


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
    """{"salt": "<iterations>:<salt>", "digest": sha256 hex of the verifier} or None.

    Only the salt and a digest leave the node: the verifier itself stays in pg_authid.
    `salt` is "" when the role has no SCRAM password (none, or an old md5 hash).
    """

    def requires_command(self, role, port):
        return "psql"

    def command(self, role, port):
        sql = (
            "SELECT CASE WHEN rolpassword LIKE 'SCRAM-SHA-256$%' "
            "THEN split_part(rolpassword, '$', 2) ELSE '' END"
            " || ' ' || encode(sha256(convert_to(coalesce(rolpassword, ''), 'UTF8')), 'hex')"
            f" FROM pg_authid WHERE rolname = '{role}'"
        )
        return psql(sql, port)

    def process(self, output):
        line = " ".join(output).strip()
        if not line:
            return None
        salt, _, digest = line.rpartition(" ")
        return {"salt": salt, "digest": digest}
