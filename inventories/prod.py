# pyinfra inventory: groups master, storage, agents from the cluster.yaml named after this file.
import pathlib
import sys

_here = pathlib.Path(__file__)
_root = str(_here.resolve().parents[1])
if _root not in sys.path:  # pyinfra puts only the working directory on sys.path
    sys.path.insert(0, _root)
from deploy.inventory import groups  # noqa: E402  (needs the sys.path line above)

globals().update(groups(_here.parent / _here.stem / "cluster.yaml"))
