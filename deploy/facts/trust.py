"""What the trust checks read: the keys an OpenPGP keyring file holds, and a secret file's owner
and mode (nothing of its content)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class OpenPgpKeys(FactBase):
    """The primary-key fingerprints the keyring file `path` holds, in file order (upper case),
    [""] when gpg cannot read all of it, None when there is no such file.

    A fingerprint check that only asks "is the pinned key in there?" also passes a keyring with
    a second key beside it, and apt trusts every key of a `signed-by` keyring. gpg runs with a
    throwaway home directory: reading a file is no reason to create /root/.gnupg.
    """

    def requires_command(self, path: str):
        return "gpg"

    def command(self, path: str):
        q = shlex.quote(path)
        return (
            f"if [ -f {q} ]; then home=$(mktemp -d) &&"
            f' {{ gpg --homedir "$home" --batch --no-options --with-colons --show-keys {q} 2>/dev/null;'
            ' echo "status=$?"; rm -rf "$home"; }; fi'
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        if not lines:
            return None
        if lines[-1] != "status=0":
            return [""]
        found, after_pub = [], False
        for line in lines:
            fields = line.split(":")
            if fields[0] == "pub":
                after_pub = True
            elif fields[0] == "fpr" and after_pub and len(fields) > 9:
                found.append(fields[9].upper())
                after_pub = False
        return found


class SecretFileState(FactBase):
    """{"user", "group", "mode"} of `path` (mode as octal digits, like "600"), None if absent.

    Not pyinfra's File fact: deploy/pyinfra_ext/factcache.py predicts Sha1File(path) from every
    File(path) read, and a plain sha1 of a secret file, printed by `-vvv` and kept in the fact
    cache, lets anyone holding the output test guesses of the secret offline.
    """

    def command(self, path: str):
        q = shlex.quote(path)
        return f"if [ -f {q} ]; then stat -c '%U %G %a' {q}; fi"

    def process(self, output):
        fields = " ".join(output).split()
        if len(fields) != 3:
            return None
        user, group, mode = fields
        return {"user": user, "group": group, "mode": mode}
