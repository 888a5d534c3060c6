"""python -m deploy.cluster: see deploy/cluster/cli.py."""

import sys

from deploy.cli import alias_note
from deploy.cluster.cli import main

if sys.argv[1:2] != ["docs"]:  # `docs` is the maintainers' own command, no alias
    alias_note("deploy.cluster check", "check --cluster FILE")
sys.exit(main())
