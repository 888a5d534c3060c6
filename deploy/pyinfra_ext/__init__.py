"""What the deploy adds to pyinfra, in the one place allowed to touch pyinfra's internals.

pyinfra 3.10 has no fact cache, leaves Nagle's algorithm on its SSH connections and aborts the
whole run when paramiko reports a dropped connection the "wrong" way. The three extensions
that fix this reach into pyinfra's private functions and replace methods of its classes:

  factcache.py   facts remembered per host until a command runs there; read in one batch
  ssh.py         TCP_NODELAY on every SSH connection; a lost connection fails its host only

Private functions change between pyinfra releases without notice, so `install` first checks
the installed pyinfra against the release these were written and tested with
(TESTED_PYINFRA). Outside it, it says so in one line and installs nothing: the deploy then
runs on plain pyinfra, slower (one SSH command per fact, 50 ms per command) and with a lost
connection aborting the run instead of failing one host, but with the same result.

Nothing else in the repository may import pyinfra underscore names or assign to pyinfra
attributes; the submodules are imported only once the version is known to be good, so that
a pyinfra without those names still runs the deploy.
"""

from __future__ import annotations

import functools
import sys
from importlib import metadata
from typing import Any

# The pyinfra release series (major.minor) the extensions were written and tested against;
# any patch release of it is accepted. Moving on means re-running tests/unit/test_factcache.py,
# test_sshtuning.py and test_summary.py (they exercise the real pyinfra) and raising this.
TESTED_PYINFRA = "3.10"

_INSTALLED_MARK = "_gpu_cluster_ext_installed"  # on the pyinfra State: callbacks added


def release_series(version: str) -> str | None:
    """ "3.10.0" -> "3.10"; None when the version does not start with major.minor numbers."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = ""
    for char in parts[1]:  # "10rc1" -> "10": a pre-release of 3.10 is still 3.10's code
        if not char.isdigit():
            break
        minor += char
    return f"{int(parts[0])}.{int(minor)}" if minor else None


@functools.cache
def supported() -> bool:
    """Whether the installed pyinfra is in the tested series; says so once when it is not."""
    try:
        version = metadata.version("pyinfra")
    except metadata.PackageNotFoundError:
        version = "(unknown)"
    if release_series(version) == TESTED_PYINFRA:
        return True
    print(
        f"pyinfra {version} is outside the tested range {TESTED_PYINFRA}: running without the "
        "fact cache, TCP_NODELAY and SSH-loss containment (slower, still correct)",
        file=sys.stderr,
    )
    return False


def install(state: Any, host: Any) -> bool:
    """Install the extensions for this run; True when they are active.

    Idempotent: deploy.py runs once per host. Classes are patched once per process, the
    state's callbacks are added once per State, and `host`'s connection (opened before
    deploy.py ran) gets TCP_NODELAY in place.
    """
    if not supported():
        return False
    from . import factcache, ssh

    factcache.patch()
    ssh.patch()
    if not getattr(state, _INSTALLED_MARK, False):
        setattr(state, _INSTALLED_MARK, True)
        state.add_callback_handler(factcache.SaveWanted())
    ssh.tune(host)
    return True


_WRAPPED_MARK = "_gpu_cluster_ext"  # on each replaced method: already wrapped, do not wrap again


def wrap_once(owner: type, name: str, wrapper_factory) -> None:
    """Replace owner.name with wrapper_factory(owner.name), unless it is already our wrapper
    (deploy.py runs once per host; the factcache and ssh patches both go through here)."""
    method = getattr(owner, name)
    if not getattr(method, _WRAPPED_MARK, False):
        wrapped = wrapper_factory(method)
        setattr(wrapped, _WRAPPED_MARK, True)
        setattr(owner, name, wrapped)


def connection_lost(host: Any) -> bool:
    """The host's SSH transport is gone (sshd stopped, node down or rebooted mid-run).

    Reads the SSH connector's paramiko client; False for any other connector, and on a
    pyinfra whose connector no longer has one (so it is safe outside the tested series).
    """
    client = getattr(getattr(host, "connector", None), "client", None)
    get_transport = getattr(client, "get_transport", None)
    if get_transport is None:
        return False
    transport = get_transport()
    return transport is None or not transport.is_active()
