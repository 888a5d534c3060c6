"""Deprecated alias, kept for one release: `python -m deploy.article FILE` is
`python -m deploy short-yaml --cluster FILE` (deploy/short_yaml.py)."""

import sys

from deploy.short_yaml import main

if __name__ == "__main__":
    from deploy.cli import alias_note

    alias_note("deploy.article", "short-yaml --cluster FILE")
    sys.exit(main())
