"""python -m deploy.cluster: see deploy/cluster/cli.py."""

import sys

from deploy.cluster.cli import main

sys.exit(main())
