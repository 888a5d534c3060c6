"""The pyinfra entry point: `pyinfra inventories/prod.py deploy.py`."""

from pyinfra import state

from deploy import summary
from deploy.site import run

summary.install(state)
run()
