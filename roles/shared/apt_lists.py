"""apt's lists refreshed so that an index apt could not fetch fails the host.

Plain `apt-get update` (also pyinfra's apt.update) exits 0 when it could not fetch a
repository's index: it warns ("W: Some index files failed to download. They have been
ignored, or old ones used instead.") and the node installs from stale lists or none, failing
later with a wrong cause ("the repository does not offer ..."). Every update the roles run is
files/shared/apt-update.sh instead: APT::Update::Error-Mode=any, and a failed update tried
twice more, 10 s apart, since a caching proxy in front of many nodes can fail a request for a
moment (the 64-node bench met it). Only the repositories the deploy installs from
(DEPLOY_SOURCES) fail the host: a site's other repository that does not answer is a warning.
"""

from __future__ import annotations

from pyinfra.api import StringCommand, operation

from roles.shared.scripts import script

# Seconds apt waits for the dpkg lock (held by an unattended upgrade, say) before failing.
# pyinfra 3.10's apt operations neither wait nor retry: without this a node that happens to
# run an unattended upgrade fails the deploy. roles/apt/proxy.py writes the same value into
# apt.conf.d for every apt run; shared_ops.APT_LOCK_WAIT passes it on our own command lines.
DPKG_LOCK_TIMEOUT = 600


# The files in sources.list.d whose repositories the deploy installs from: its own (the CUDA
# repo's list, roles/apt/pinsets.sources_list_path; PGDG's, roles/postgresql/server.PGDG_LIST) and the
# distribution's deb822 files (Ubuntu 24.04, Debian 12 images; older ones use sources.list,
# which always counts). A failure of any other repository is a warning (apt-update.sh).
DEPLOY_SOURCES = ("cuda-*-x86_64.list", "pgdg.list", "ubuntu.sources", "debian.sources")
UPDATE_ATTEMPTS, UPDATE_DELAY = 3, 10


def update_command() -> StringCommand:
    return script("shared/apt-update.sh", DPKG_LOCK_TIMEOUT, UPDATE_ATTEMPTS, UPDATE_DELAY, *DEPLOY_SOURCES)


@operation(is_idempotent=False)
def update_lists():
    """Refresh apt's lists (update_command); run it under an `_if`: it changes every time."""
    yield update_command()
