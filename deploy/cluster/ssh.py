"""cluster.yaml's `ssh` section: how pyinfra and verify log in to the nodes."""

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from deploy.cluster import checks
from deploy.cluster.keys import Key
from deploy.cluster.reader import Reader
from deploy.secrets import REPO_ROOT, FileProblem, read_local_file


@checks.check("path of an existing file, mode 0600 or 0400")
def private_key_path(r: Reader, path: str, v: Any) -> str | None:
    """The key pyinfra and verify log in with. When the file is read (a deploy, verify, check;
    not `experiment new`), it must exist and be closed to group and others: OpenSSH refuses such
    a key ("UNPROTECTED PRIVATE KEY FILE!", sshkey_perm_ok: mode & 077), paramiko does not, and a
    missing file would only fail at the first node's login, after other hosts were touched. Like
    every key cluster.yaml names, it may not live inside the checkout."""
    text = checks.text(r, path, v)
    if text is None or not r.resolve_secrets:
        return text
    try:
        read_local_file(Path(text).expanduser(), private=0o077, repo_root=REPO_ROOT)
    except FileProblem as e:
        r.add(path, text, str(e))
        return None
    return text


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
    key_file: Annotated[
        str | None, Key(private_key_path, None, "private key on the machine that runs pyinfra")
    ]
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
