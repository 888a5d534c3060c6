"""Custom pyinfra operations and helpers shared by the roles.

pyinfra 3.10 re-runs an operation's body when it executes, with facts read again at that
moment, so each operation below decides from the node's state right before it acts and yields
nothing when that state is already right: a second deploy reports no change.

- `fetch_verified`: the one download-and-verify command (files/shared/fetch-verified.sh).
  pyinfra's files.download checks a sha256 only after writing the destination, and leaves a
  mismatching file there; this one never puts an unverified file at the destination.
- `verified_binary` / `verified_deb`: a vendor artifact downloaded on the node, checked against
  the sha256 pinned in cluster.yaml and installed only when it matches; a mismatch deletes the
  download and fails this host with a message naming the artifact.
- `secret_file`: a 0600 file whose content never appears in pyinfra's output, not even with
  `--diff` (files.put/files.template print the whole content there), nor any hash of it.
- `fail`: the one way a role stops its host.
- `packages`: apt packages, refreshing the apt lists first (roles/shared/apt_lists.py) only when
  something is missing.
- `wait_for_http`: poll a URL on the node until it answers 200.
- `on_controller`: a step that runs on the controller (an API call), failing one host cleanly.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Callable

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Sha256File
from pyinfra.operations import apt, server

from deploy.facts.trust import SecretFileState
from roles.shared.apt_lists import DPKG_LOCK_TIMEOUT, update_lists
from roles.shared.scripts import script

# DPKG_LOCK_TIMEOUT (roles/shared/apt_lists.py) on our own apt command lines.
APT_LOCK_WAIT = f"-o DPkg::Lock::Timeout={DPKG_LOCK_TIMEOUT}"
# The site mirror's login for downloads outside apt (sources.mirror_credentials; written by
# roles/apt/proxy.py, root 0600): files/shared/fetch-verified.sh names the same path.
DOWNLOAD_NETRC = "/etc/gpu-cluster/download.netrc"
# A package's own copy of a config file never replaces the one this deploy wrote before it.
DPKG_KEEP_CONFIG = "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"


class SecretBytes:
    """File content that must not be shown: pyinfra prints operation arguments with str()."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | str):
        self.data = data.encode() if isinstance(data, str) else bytes(data)

    def __repr__(self) -> str:
        return f"SecretBytes({len(self.data)} bytes, not shown)"

    __str__ = __repr__


def env_file(header: str, variables: dict[str, str]) -> str:
    """A systemd EnvironmentFile: KEY="value", with systemd's double-quote escapes.

    Inside double quotes systemd unescapes \\" \\\\ \\` and \\$ and keeps other backslashes.
    A newline cannot be carried safely, so it is refused (naming the variable, not the value).
    """
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for key, value in variables.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"{key}: the value contains a line break, which an environment file cannot hold")
        escaped = "".join("\\" + c if c in '"\\`$' else c for c in value)
        lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


def _mode_int(mode: str | int) -> int:
    # Modes as octal digits ("0600", "600", or pyinfra's 600 read as decimal) -> 0o600.
    return int(str(mode).lstrip("0") or "0", 8)


def node_file(path: str) -> bytes | None:
    """The content of the node's file `path`, read over SFTP into memory; None if unreadable.

    For what must not pass through a fact: a fact's output is printed by `-vvv` (and kept in
    the fact cache), and a plain sha1/sha256 of a secret lets whoever reads it test guesses
    offline. SFTP runs as the SSH user (root: the deploy's documented login); nothing read here
    is printed or stored.
    """
    buffer = io.BytesIO()
    try:
        if not host.get_file(path, buffer):
            return None
    except (OSError, EOFError):
        return None
    return buffer.getvalue()


def upload_secret(dest: str, data: bytes, owner: str = "root:root", mode: str = "600"):
    """The commands that put `data` at `dest`: created empty with its final owner and mode
    first, so the secret is never readable by anyone else, not even for a moment (SFTP creates
    new files 0644; writing into an existing file keeps that file's mode)."""
    quoted = shlex.quote(dest)
    yield StringCommand(f"touch {quoted} && chown {owner} {quoted} && chmod {mode} {quoted}")
    yield FileUploadCommand(io.BytesIO(data), dest, remote_temp_filename=host.get_temp_filename(dest))


@operation()
def secret_file(dest: str, content: SecretBytes, user: str = "root", group: str = "root", mode: str = "600"):
    """Upload `content` to `dest` (root:root 0600 by default, see upload_secret) unless it holds
    that already: decided by reading the file back (node_file), never by a hash a fact would
    print. (The controller holds the secret anyway; a keyed hash would need a key on both ends.)
    """
    remote = host.get_fact(SecretFileState, path=dest)
    owner = f"{user}:{group}"
    quoted = shlex.quote(dest)
    if not remote or node_file(dest) != content.data:
        yield from upload_secret(dest, content.data, owner, mode)
        return
    if remote["user"] != user or remote["group"] != group:
        yield StringCommand(f"chown {owner} {quoted}")
    if _mode_int(remote["mode"]) != _mode_int(mode):
        yield StringCommand(f"chmod {mode} {quoted}")


def fail(message: str) -> StringCommand:
    """The one way a role stops its host: a command that prints `message` to stderr and exits
    1. pyinfra then fails this host alone (the others go on), and the closing summary repeats
    the message next to the host's re-run command. An operation must not raise instead."""
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit 1")


def fetch_verified(
    url: str, dest: str, *, artifact: str, sha256: str, mode: str | None = None
) -> StringCommand:
    """The command that leaves at `dest` the file at `url` only if its sha256 is `sha256`.

    The file arrives as `dest`.part and is renamed into place once checked (root-owned with
    `mode` first, if given), so `dest` is either the verified file or untouched; a failed
    download or a mismatch deletes the partial file and stops the host with a message naming
    `artifact` and `url`. Every caller passes a pin from cluster.yaml: there is no unpinned
    download.
    """
    if not re.fullmatch(r"[0-9a-fA-F]{64}", sha256 or ""):  # the model never lets one through
        return fail(f"{artifact}: no sha256 pin for {url}: nothing is downloaded unpinned")
    args = [url, dest, artifact, sha256] + ([mode] if mode else [])
    return script("shared/fetch-verified.sh", *args)


@operation()
def verified_binary(url: str, sha256: str, dest: str, artifact: str, mode: str = "755"):
    """Install the file at `url` as `dest` (root-owned) if `dest` does not already match."""
    if host.get_fact(Sha256File, path=dest) == sha256:
        host.noop(f"{dest} is the pinned {artifact}")
        return
    yield fetch_verified(url, dest, artifact=artifact, sha256=sha256, mode=mode)


@operation()
def verified_deb(package: str, version: str, url: str, sha256: str, artifact: str):
    """Install `package` `version` from the .deb at `url` unless that version is installed."""
    if version in host.get_fact(DebPackages).get(package, ()):
        host.noop(f"{package} {version} is installed")
        return
    # apt-get only treats an argument as a package file if it ends in .deb.
    deb = f"/var/cache/apt/archives/{package}_{version}.verified.deb"
    yield fetch_verified(url, deb, artifact=artifact, sha256=sha256)
    # apt (not dpkg -i) so the package's dependencies come from the configured archives.
    yield StringCommand(
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y {APT_LOCK_WAIT} {DPKG_KEEP_CONFIG}"
        f" {shlex.quote(deb)}; status=$?; rm -f {shlex.quote(deb)}; exit $status"
    )


def missing_packages(names) -> list[str]:
    installed = host.get_fact(DebPackages)
    return [n for n in names if n not in installed]


def packages(names: list[str], what: str):
    """apt-get install `names`; `apt-get update` first only if one of them is missing.

    An unconditional update would count as a change on every deploy.
    """
    update_lists(name=f"Refresh apt lists for {what}", _if=lambda: bool(missing_packages(names)))
    return apt.packages(name=f"Install {what}", packages=names, extra_install_args=APT_LOCK_WAIT)


def wait_for_http(url: str, what: str, seconds: int = 180, resolve: str | None = None, **kwargs):
    """Poll `url` from the node until it answers 200; fails with a pointer to the journal.
    resolve: curl's HOST:PORT:ADDRESS (https by the certificate's name, to another address)."""
    give_up = shlex.quote(f"{what} did not answer 200 at {url} within {seconds} s")
    pin = f"--resolve {shlex.quote(resolve)} " if resolve else ""
    return server.shell(
        name=f"Wait until {what} is ready",
        commands=[
            f"for i in $(seq {seconds}); do "
            f"curl -fsS -o /dev/null --max-time 2 {pin}{shlex.quote(url)} && exit 0; sleep 1; done; "
            f"echo {give_up} >&2; exit 1"
        ],
        **kwargs,
    )


def on_controller(step: Callable[[], list[str]], error: type[Exception]) -> FunctionCommand:
    """step() on the controller, its lines logged; an `error` fails the host in one red line."""

    def run(state, host) -> bool:
        try:
            lines = step()
        except error as e:
            host.log_styled(str(e), fg="red", log_func=logger.error)
            return False
        for line in lines:
            host.log(line, logger.info)
        return True

    return FunctionCommand(run, (), {})
