"""A pyinfra deploy of roles/postgresql/server.py's PGDG key operation alone, for
tests/lab/test_trust_lab.py: the lab's Debian 12 nodes take their own PostgreSQL 15, so the
role never reaches PGDG there. The key URL, its pinned fingerprint and the keyring path come
from DTLAB_PGDG_URL, DTLAB_PGDG_FINGERPRINT and DTLAB_PGDG_DEST (a lab key on the lab's mirror).
"""

import os

from roles.postgresql.server import pgdg_key

pgdg_key(
    name="PGDG signing key (fingerprint-checked)",
    url=os.environ["DTLAB_PGDG_URL"],
    fingerprint=os.environ["DTLAB_PGDG_FINGERPRINT"],
    dest=os.environ["DTLAB_PGDG_DEST"],
)
