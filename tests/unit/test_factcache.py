from types import SimpleNamespace

from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Hostname

from deploy import factcache


def test_cached_until_a_command_runs_on_that_host():
    reads = []

    def original(host, cls, *args, **kwargs):
        reads.append((host.name, cls))
        return len(reads)

    get_fact = factcache._cached_get_fact(original)
    execute = factcache._forgetting_execute(lambda command, state, host, args: "ran")
    a, b = SimpleNamespace(name="a"), SimpleNamespace(name="b")

    assert get_fact(a, DebPackages) == get_fact(a, DebPackages) == 1
    assert get_fact(b, DebPackages) == 2  # per host
    assert get_fact(a, Hostname) == 3 and get_fact(a, Hostname) == 4  # not a cached fact
    assert execute(None, None, a, {}) == "ran"
    assert get_fact(a, DebPackages) == 5  # re-read after a change on a
    assert get_fact(b, DebPackages) == 2  # b did not change
