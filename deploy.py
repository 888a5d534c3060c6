"""The pyinfra entry point: `pyinfra inventories/prod.py deploy.py`."""

from deploy.site import run

run()
