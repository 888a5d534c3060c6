"""cluster.yaml's `ssh` section: how pyinfra and verify log in to the nodes."""

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from deploy.cluster import checks
from deploy.cluster.keys import Key
from deploy.cluster.reader import Reader


@checks.check("path of an existing file, mode 0600 or 0400")
def private_key_path(r: Reader, path: str, v: Any) -> str | None:
    """The key pyinfra and verify log in with. When the file is read (a deploy, verify, check;
    not `experiment new`), it must exist and be closed to group and others: OpenSSH refuses such
    a key ("UNPROTECTED PRIVATE KEY FILE!", sshkey_perm_ok: mode & 077), paramiko does not, and a
    missing file would only fail at the first node's login, after other hosts were touched."""
    text = checks.text(r, path, v)
    if text is None or not r.resolve_secrets:
        return text
    p = Path(text).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        r.add(path, text, "the file does not exist")
        return None
    except OSError as e:
        r.add(path, text, f"the file cannot be read ({e.strerror})")
        return None
    if not stat.S_ISREG(st.st_mode):
        r.add(path, text, "not a regular file")
        return None
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        r.add(
            path, text, f"the key is readable or writable by group or others (mode {mode:04o}): chmod 600 {p}"
        )
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
