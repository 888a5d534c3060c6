"""Read a few expensive facts once per host until that host changes.

pyinfra 3.10 has no fact cache: every `apt.packages` reads `dpkg -l` again and every
distribution check re-reads /etc/*-release, about twenty round trips per agent that return
the same answer. Here those facts are remembered per host, and forgotten as soon as any
operation command (shell, upload, download, Python callback) runs on that host, so a value
is never older than the last change the deploy made there.
"""

from pyinfra.api import command as pyinfra_command
from pyinfra.api.host import Host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import LinuxDistribution

CACHED_FACTS = (DebPackages, LinuxDistribution)
COMMAND_CLASSES = (
    pyinfra_command.StringCommand,
    pyinfra_command.FileUploadCommand,
    pyinfra_command.FileDownloadCommand,
    pyinfra_command.FunctionCommand,
    pyinfra_command.RsyncCommand,
)
_CACHE_ATTR = "_gpu_cluster_fact_cache"


def _cache(host) -> dict:
    cache = getattr(host, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        setattr(host, _CACHE_ATTR, cache)
    return cache


def forget(host) -> None:
    _cache(host).clear()


def _cached_get_fact(original):
    def get_fact(self, name_or_cls, *args, **kwargs):
        if name_or_cls not in CACHED_FACTS:
            return original(self, name_or_cls, *args, **kwargs)
        key = (name_or_cls, args, tuple(sorted(kwargs.items())))
        cache = _cache(self)
        if key not in cache:
            cache[key] = original(self, name_or_cls, *args, **kwargs)
        return cache[key]

    get_fact._gpu_cluster_cached = True
    return get_fact


def _forgetting_execute(original):
    def execute(self, state, host, connector_arguments):
        forget(host)
        try:
            return original(self, state, host, connector_arguments)
        finally:
            forget(host)  # what the command changed is visible to the next read

    execute._gpu_cluster_cached = True
    return execute


def install() -> None:
    """Idempotent: deploy.py runs once per host."""
    if getattr(Host.get_fact, "_gpu_cluster_cached", False):
        return
    Host.get_fact = _cached_get_fact(Host.get_fact)
    for cls in COMMAND_CLASSES:
        cls.execute = _forgetting_execute(cls.execute)
