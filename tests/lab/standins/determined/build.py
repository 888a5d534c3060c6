# Lab stand-in for Determined's release downloads: determined-{master,agent}_0.38.0_linux_amd64.deb
"""Build the two Determined .deb stand-ins into the lab mirror's determined/ folder.

Package names, file paths, conffiles, file modes and maintainer scripts follow the real
0.38.0 packages (goreleaser/nfpm builds):
- determined-master: /usr/bin/determined-master, /etc/determined/master.yaml (0600, conffile),
  /lib/systemd/system/determined-master.{service,socket};
- determined-agent: /usr/bin/determined-agent, /etc/determined/agent.yaml (0644, conffile),
  /lib/systemd/system/determined-agent.service.
The real postinst only reloads systemd and asks deb-systemd-invoke to start (restart on
upgrade) the unit, never failing the install. It does not enable the unit, and Debian's
deb-systemd-invoke does not start a unit that is not enabled, so a deploy must enable and start
the service itself. Unlike the real packages (static Go binaries), the stand-ins are Python
and so depend on Debian's python3 packages (and the master on openssh-client for ssh-keygen);
install them with apt, not bare dpkg -i. The master's experiment part is a second module,
/usr/share/determined/master/lab/lab_trials.py, with lab_prep_container.py beside it.
"""

from __future__ import annotations

import inspect
from pathlib import Path

VERSION = "0.38.0"
HERE = Path(__file__).resolve().parent
MAINTAINER = "Determined AI <ai-open-source@hpe.com>"
NFPM_FIELDS = {"Section": "default", "Priority": "optional"}


def _postinst(unit: str) -> str:
    # dh_installsystemd's "start" snippet, as the real packages carry it.
    return f"""#!/bin/sh
set -e
if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ]; then
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        if [ -n "$2" ]; then
            _dh_action=restart
        else
            _dh_action=start
        fi
        deb-systemd-invoke $_dh_action '{unit}' >/dev/null || true
    fi
fi
"""


def _prerm(unit: str) -> str:
    return f"""#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    deb-systemd-invoke stop '{unit}' >/dev/null || true
fi
"""


POSTRM = """#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
"""


def _read(name: str) -> bytes:
    return (HERE / name).read_bytes()


def _publish(deb: Path, dest: Path) -> Path:
    """Copy under the release's file name (`_linux_amd64`), touching it only when it changed."""
    data = deb.read_bytes()
    if not (dest.exists() and dest.read_bytes() == data):
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(dest)
    return dest


def build(ctx) -> list[Path]:
    # The GitHub release layout (<owner>/<repo>/releases/download/<tag>/<asset>): from 0.38 the
    # tag is v<version> (.circleci/real_config.yml filters v\d+.\d+.\d+), the asset keeps the bare
    # version (GoReleaser's nfpm default name: {{ .PackageName }}_{{ .Version }}_{{ .Os }}_{{ .Arch }}).
    out_dir = Path(ctx.mirror_dir) / "determined-ai/determined/releases/download" / f"v{VERSION}"
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(ctx.work_dir) / "determined-debs"
    packages = {
        "determined-master": {
            "files": {
                "/usr/bin/determined-master": (_read("determined-master"), 0o755),
                # The stand-in's experiment part, imported by the script above.
                "/usr/share/determined/master/lab/lab_trials.py": (_read("lab_trials.py"), 0o644),
                # What TLS trials run first: the harness prep step's master contact (lab_trials.py).
                "/usr/share/determined/master/lab/lab_prep_container.py": (
                    _read("lab_prep_container.py"),
                    0o644,
                ),
                "/etc/determined/master.yaml": (_read("master.yaml"), 0o600),
                "/lib/systemd/system/determined-master.service": (_read("determined-master.service"), 0o644),
                "/lib/systemd/system/determined-master.socket": (_read("determined-master.socket"), 0o644),
            },
            # openssh-client: ssh-keygen makes the trials' key pairs (the real master uses Go's).
            "depends": ("python3", "python3-yaml", "python3-psycopg2", "openssh-client"),
            "description": (
                "Determined master (lab stand-in)\n"
                "Stands in for the Determined 0.38.0 master in the test lab: the same paths,\n"
                "configuration rules and HTTP endpoints, implemented in Python."
            ),
            "scripts": {
                "postinst": _postinst("determined-master.service"),
                "prerm": _prerm("determined-master.service"),
                "postrm": POSTRM,
            },
            "conffiles": ("/etc/determined/master.yaml",),
        },
        "determined-agent": {
            "files": {
                "/usr/bin/determined-agent": (_read("determined-agent"), 0o755),
                "/etc/determined/agent.yaml": (_read("agent.yaml"), 0o644),
                "/lib/systemd/system/determined-agent.service": (_read("determined-agent.service"), 0o644),
            },
            "depends": ("python3", "python3-yaml"),
            "description": (
                "Determined agent (lab stand-in)\n"
                "Stands in for the Determined 0.38.0 agent in the test lab: the same paths,\n"
                "configuration rules and device detection, implemented in Python."
            ),
            "scripts": {
                "postinst": _postinst("determined-agent.service"),
                "prerm": _prerm("determined-agent.service"),
                "postrm": POSTRM,
            },
            "conffiles": ("/etc/determined/agent.yaml",),
        },
    }
    # The real packages' maintainer, where the lab's builder lets us set it.
    extra = {"maintainer": MAINTAINER} if "maintainer" in inspect.signature(ctx.build_deb).parameters else {}
    written = []
    for name, spec in packages.items():
        deb = ctx.build_deb(
            staging,
            name,
            VERSION,
            spec["files"],
            arch="amd64",
            depends=spec["depends"],
            description=spec["description"],
            extra_control=NFPM_FIELDS,
            scripts=spec["scripts"],
            conffiles=spec["conffiles"],
            **extra,
        )
        written.append(_publish(deb, out_dir / f"{name}_{VERSION}_linux_amd64.deb"))
    return written
