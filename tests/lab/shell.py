"""Running controller-side commands with errors that say what failed."""

import subprocess


class LabError(Exception):
    """A lab step failed; the message says what to do."""


def run(*argv, check=True, capture=True, input=None, timeout=None):
    proc = subprocess.run(
        [str(a) for a in argv],
        capture_output=capture,
        text=True,
        input=input,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip()
        raise LabError(f"`{' '.join(map(str, argv))}` exited {proc.returncode}: {detail}")
    return proc


def out(*argv, **kwargs) -> str:
    return run(*argv, **kwargs).stdout.strip()
