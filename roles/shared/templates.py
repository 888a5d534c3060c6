"""The one template mechanism: Jinja2 over files/, as pyinfra's files.template uses.

`render("determined/master.yaml.j2", port=...)` returns the text; a role hands it to
files.put (or secret_file) itself, so that what reaches the node is exactly what a unit test
can render. Undefined variables raise (StrictUndefined): a template never silently writes an
empty value into a node's configuration.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jinja2

FILES = Path(__file__).resolve().parents[2] / "files"


def files_path(relative: str) -> Path:
    """A static file of a role, e.g. files_path("minio/minio.service")."""
    return FILES / relative


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(FILES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # configuration files, not HTML
    )
    # A JSON string is a valid YAML double-quoted scalar: any password survives as written.
    env.filters["q"] = json.dumps
    return env


def render(template: str, **values: object) -> str:
    """files/<template> rendered with `values`."""
    return _environment().get_template(template).render(**values)
