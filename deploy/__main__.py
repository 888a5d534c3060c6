"""python -m deploy VERB --cluster FILE ...: see deploy/cli.py."""

import os
import sys

from deploy.cli import main

try:
    sys.exit(main())
except BrokenPipeError:
    # The reader went away (`... | head`): stop quietly as a shell tool does, not with a
    # traceback; stdout to /dev/null so the flush at exit does not raise again (Python's
    # signal module docs, "Note on SIGPIPE").
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + 13)  # as if killed by SIGPIPE, as `head`'s writer would be
