"""cluster.yaml's `ssh` section: how pyinfra and verify log in to the nodes."""

from dataclasses import dataclass
from typing import Annotated

from deploy.cluster import checks
from deploy.cluster.keys import Key


@dataclass(frozen=True)
class Ssh:
    user: Annotated[
        str,
        Key(
            checks.matching(r"[a-z_][a-z0-9_.-]*", "a user name", rule="user name"),
            "root",
            "the user pyinfra logs in as",
        ),
    ]
    port: Annotated[int, Key(checks.port, 22, "the nodes' SSH port")]
    key_file: Annotated[str | None, Key(checks.text, None, "private key on the machine that runs pyinfra")]
    strict_host_key_checking: Annotated[
        bool,
        Key(
            checks.boolean,
            True,
            "`true` rejects unknown host keys: put the nodes' keys into known_hosts first "
            "(`ssh-keyscan`, then compare fingerprints on the consoles)",
        ),
    ]
    known_hosts_file: Annotated[
        str | None, Key(checks.text, None, "the known_hosts file to check host keys against")
    ]
