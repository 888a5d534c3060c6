"""The CUDA keyring as installed, against the verified .deb the deploy keeps beside it."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class KeptKeyring(FactBase):
    """{"deb": sha256 of the kept .deb or "", "keyring": True when the installed keyring file
    is byte for byte the one inside that .deb, "version": the installed package's version or ""}.

    pyinfra's DebPackages says which version is installed, not what its files hold: a forged
    .deb of the same name and version would pass it. Sha256File of the keyring alone needs a
    second pin for the file. One command compares both here (dpkg-deb + tar read the .deb).
    """

    def command(self, deb: str, keyring: str, package: str):
        deb_q, keyring_q, package_q = shlex.quote(deb), shlex.quote(keyring), shlex.quote(package)
        member = shlex.quote("*" + keyring.lstrip("/"))  # ./usr/share/... or usr/share/..., as packed
        return (
            f"printf 'deb=%s\\n' \"$(sha256sum {deb_q} 2>/dev/null | cut -d' ' -f1)\"; "
            f"if [ -f {keyring_q} ] && dpkg-deb --fsys-tarfile {deb_q} 2>/dev/null"
            f" | tar -xO --wildcards {member} 2>/dev/null | cmp -s - {keyring_q};"
            " then echo keyring=same; else echo keyring=differs; fi; "
            f"printf 'version=%s\\n' \"$(dpkg-query -W -f='${{Version}}' {package_q} 2>/dev/null)\""
        )

    @staticmethod
    def default():
        return {"deb": "", "keyring": False, "version": ""}

    def process(self, output):
        values = dict(line.split("=", 1) for line in output if "=" in line)
        return {
            "deb": values.get("deb", "").strip(),
            "keyring": values.get("keyring", "").strip() == "same",
            "version": values.get("version", "").strip(),
        }
