"""The pyinfra entry point: `pyinfra inventories/prod.py deploy.py`."""

from pyinfra import host, state

from deploy import pyinfra_ext, summary
from deploy.site import run

pyinfra_ext.install(state, host)  # fact cache, TCP_NODELAY, SSH-loss containment (tested pyinfra only)
summary.install(state)
run()
