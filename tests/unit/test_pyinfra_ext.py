"""The version gate of deploy/pyinfra_ext: outside the tested pyinfra series nothing is patched."""

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.host import Host
from pyinfra.connectors.ssh import SSHConnector

from deploy import pyinfra_ext
from deploy.pyinfra_ext import factcache, ssh

REPLACED = [
    (Host, "get_fact"),
    (SSHConnector, "_connect"),
    *((SSHConnector, name) for name in ssh.FILE_AND_COMMAND_METHODS),
    *((cls, "execute") for cls in factcache.COMMAND_CLASSES),
]


@pytest.fixture
def pristine(monkeypatch):
    """pyinfra's own methods back after the test, and the version checked afresh."""
    for owner, name in REPLACED:
        monkeypatch.setattr(owner, name, owner.__dict__[name])
    pyinfra_ext.supported.cache_clear()
    yield
    pyinfra_ext.supported.cache_clear()


def methods():
    return {(owner.__name__, name): owner.__dict__[name] for owner, name in REPLACED}


def local():
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    return state, inventory.get_host("@local")


def test_release_series():
    assert pyinfra_ext.release_series("3.10.0") == "3.10"
    assert pyinfra_ext.release_series("3.10.12") == "3.10"
    assert pyinfra_ext.release_series("3.10rc1") == "3.10"
    assert pyinfra_ext.release_series("3.1.0") == "3.1"  # not 3.10
    assert pyinfra_ext.release_series("3.11.0b1") == "3.11"
    assert pyinfra_ext.release_series("4") is None
    assert pyinfra_ext.release_series("(unknown)") is None


@pytest.mark.parametrize("version", ["3.11.0", "3.9.4", "4.0.0", "3.1.0"])
def test_outside_the_tested_series_one_line_and_nothing_installed(pristine, monkeypatch, capsys, version):
    monkeypatch.setattr(pyinfra_ext.metadata, "version", lambda name: version)
    before = methods()
    state, host = local()
    handlers = list(state.callback_handlers)
    assert pyinfra_ext.install(state, host) is False
    assert pyinfra_ext.install(state, host) is False  # deploy.py runs once per host
    assert capsys.readouterr().err.splitlines() == [
        f"pyinfra {version} is outside the tested range 3.10: running without the fact cache, "
        "TCP_NODELAY and SSH-loss containment (slower, still correct)"
    ]
    assert methods() == before
    assert state.callback_handlers == handlers


def test_inside_the_tested_series_installed_once(pristine, monkeypatch, capsys):
    monkeypatch.setattr(pyinfra_ext.metadata, "version", lambda name: "3.10.3")
    before = methods()
    state, host = local()
    handlers = len(state.callback_handlers)
    assert pyinfra_ext.install(state, host) is True
    installed = methods()
    assert all(installed[k] is not before[k] for k in before), "every method wrapped"
    assert pyinfra_ext.install(state, host) is True
    assert methods() == installed  # not wrapped twice
    assert len(state.callback_handlers) == handlers + 1  # the fact record, once per state
    other_state, other_host = local()
    pyinfra_ext.install(other_state, other_host)
    assert len(other_state.callback_handlers) == handlers + 1
    assert capsys.readouterr().err == ""
