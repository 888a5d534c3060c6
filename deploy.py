"""The pyinfra entry point: `pyinfra inventories/prod.py deploy.py`."""

from pyinfra import state

from deploy import factcache, summary
from deploy.site import run

factcache.install()
summary.install(state)
run()
