"""Shell programs kept as files/<role>/<name>.sh, run on a node with arguments.

`script("fabric/install.sh", tarball, release)` is one command, `sh -c '<the file>' install.sh
<tarball> <release>`: the program travels inside the command, so nothing is uploaded to or
left on the node, and an operation that has nothing to do runs nothing. Every argument is
quoted with shlex; the program reads them as $1, $2, ...
"""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand

from roles.shared.templates import files_path


def script(relative: str, *args: object) -> StringCommand:
    """The command that runs files/<relative> with `args`."""
    text = files_path(relative).read_text()
    name = relative.rsplit("/", 1)[-1]
    return StringCommand("sh -c", shlex.quote(text), shlex.quote(name), *(shlex.quote(str(a)) for a in args))
