"""The pyinfra entry point: `pyinfra inventories/prod.py deploy.py`."""

from pyinfra import host, state

from deploy import factcache, sshtuning, summary
from deploy.site import run

sshtuning.install(host)
factcache.install(state)
summary.install(state)
run()
