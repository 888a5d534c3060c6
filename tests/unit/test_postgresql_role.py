"""The SQL that sets Determined's database password reaches psql on stdin, never a command line."""

from roles.postgresql.server import role_statement, scram_verifier


def test_role_statement_carries_the_verifier_not_the_password():
    verifier = scram_verifier("Secret-pw1", b"0123456789abcdef")
    sql = role_statement("ALTER", "determined", verifier).decode()
    assert sql == f"ALTER ROLE \"determined\" WITH LOGIN PASSWORD '{verifier}';\n"
    assert "Secret-pw1" not in sql
    assert verifier.startswith("SCRAM-SHA-256$4096:") and "'" not in verifier
