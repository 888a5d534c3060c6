"""PostgreSQL: the server (postgresql), Determined's database role and its password (db_role), the
nightly backup to MinIO (backup). Files: files/postgresql/.
"""
