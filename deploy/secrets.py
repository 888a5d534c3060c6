"""Secret references in cluster.yaml and the masked values they resolve to.

cluster.yaml never holds a secret: it says where one comes from, `{env: NAME}` or
`{file: /absolute/path}`. Every message this module produces names the reference,
never the value, so problems can be printed and logged freely.
"""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

# The directory that holds deploy/: a secret file in here is one `git add` away from leaking.
REPO_ROOT = Path(__file__).resolve().parent.parent

HOW_TO_REFERENCE = "use {env: NAME} or {file: PATH}"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretError(ValueError):
    """One line saying what is wrong with a reference; never contains a secret."""


@dataclass(frozen=True)
class SecretRef:
    kind: str  # "env" or "file"
    target: str  # variable name or absolute path

    def __str__(self) -> str:
        # The text an operator wrote, so messages point at the line to fix.
        return f"{{{self.kind}: {self.target}}}"


class Secret:
    """A resolved secret. repr/str/format show only where it came from; `.value` is the secret."""

    __slots__ = ("_ref", "_value")

    def __init__(self, ref: SecretRef, value: str | None):
        self._ref = ref
        self._value = value

    @property
    def reference(self) -> SecretRef:
        return self._ref

    @property
    def resolved(self) -> bool:
        return self._value is not None

    @property
    def value(self) -> str:
        if self._value is None:
            raise RuntimeError(f"{self!r} was loaded without resolving secrets")
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self._ref.kind}:{self._ref.target})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return (self._ref, self._value) == (other._ref, other._value)

    def __hash__(self) -> int:
        return hash(self._ref)

    def to_json(self) -> str:
        # pyinfra's JSON encoder (debug-inventory, --json) calls this.
        return repr(self)


def describe(raw: object) -> str:
    """How a secret field is shown in a problem line: the reference, never a value."""
    if isinstance(raw, dict):
        if len(raw) == 1:
            ((key, target),) = raw.items()
            if key in ("env", "file") and isinstance(target, str):
                return str(SecretRef(key, target))
        # A key with an invisible character (a BOM, a zero-width space) is shown escaped.
        shown = (k if isinstance(k, str) and k.isprintable() else repr(k) for k in raw)
        return "{" + ", ".join(f"{k}: ..." for k in shown) + "}"
    if raw is None:
        return "None"
    if isinstance(raw, str):
        return "(a plain string, not shown)"
    kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list"}
    return f"({kind.get(type(raw), 'a value')}, not shown)"


def parse_reference(raw: object) -> SecretRef:
    """Check the shape of a reference. Raises SecretError (message without the value)."""
    if isinstance(raw, str) or isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raise SecretError(f"secrets are referenced, not written here: {HOW_TO_REFERENCE}")
    if not isinstance(raw, dict):
        raise SecretError(f"must be a secret reference: {HOW_TO_REFERENCE}")
    unknown = sorted(str(k) for k in raw if k not in ("env", "file"))
    if unknown:
        raise SecretError(f"unknown key {unknown[0]!r} in a secret reference: {HOW_TO_REFERENCE}")
    if len(raw) != 1:
        raise SecretError(f"needs exactly one of env or file: {HOW_TO_REFERENCE}")
    ((kind, target),) = raw.items()
    if not isinstance(target, str) or not target:
        raise SecretError(f"{kind} must be a non-empty string: {HOW_TO_REFERENCE}")
    if kind == "env" and not _ENV_NAME.fullmatch(target):
        raise SecretError("not a valid environment variable name")
    if kind == "file" and not os.path.isabs(target):
        raise SecretError("the secret file must be an absolute path")
    return SecretRef(kind, target)


def _content_problem(text: str) -> str | None:
    """What is wrong with a secret's text (after its trailing line breaks), never the text."""
    if not text.strip():
        return "is empty"
    for c in text:
        if c in "\r\n\u2028\u2029\x85":
            return "holds a line break inside the secret (only trailing ones are dropped)"
        if unicodedata.category(c) in ("Cc", "Cf"):
            # Tabs, escapes, NULs: they break env files, config files and terminals.
            return "holds a control character (a tab, escape or NUL, ...)"
    return None


def _strip_line_ends(text: str) -> str:
    """`echo secret > file` adds a newline, editors add one or more: they are not the secret."""
    while text.endswith("\n"):
        text = text[:-1].removesuffix("\r")
    return text


class FileProblem(ValueError):
    """One line saying why a file on the machine that runs pyinfra cannot be used; no content."""


def read_local_file(
    path: Path, *, private: int = 0, max_bytes: int | None = None, repo_root: Path | None = None
) -> bytes:
    """The bytes of a file cluster.yaml names (a secret, a TLS key, the SSH key, a CA), read once
    on the machine that runs pyinfra, so a bad file is one line before any host is touched.

    `private` is the mode mask the file must not have: 0o066 for secrets (readable or writable by
    group or others), 0o077 for an SSH key, as OpenSSH's sshkey_perm_ok refuses it. With
    `repo_root`, a file inside the checkout is refused: it is one `git add` away from leaking;
    resolve() follows symlinks, so a link outside pointing into the checkout still counts. With
    `max_bytes`, at most one byte more is read: the caller says what a larger file cannot be.
    """
    if repo_root is not None and path.resolve().is_relative_to(repo_root.resolve()):
        raise FileProblem(f"the file is inside the repository ({repo_root}): keep secrets outside git")
    try:
        if not path.exists():
            raise FileProblem("the file does not exist")
        if not path.is_file():
            raise FileProblem("not a regular file")
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & private:
            raise FileProblem(
                f"the file is readable or writable by group or others (mode {mode:04o}): chmod 600 {path}"
            )
        with path.open("rb") as f:
            return f.read() if max_bytes is None else f.read(max_bytes + 1)
    except PermissionError:
        raise FileProblem("the file cannot be read (permission denied)") from None
    except OSError as e:
        raise FileProblem(f"the file cannot be read ({e.strerror})") from None


def resolve(ref: SecretRef, repo_root: Path = REPO_ROOT) -> str:
    """Read the secret a reference points at. Raises SecretError (message without the value).

    Trailing line breaks (\\n, \\r\\n) are dropped; a line break or control character inside the
    secret is refused here rather than when the deploy writes it into an environment file.
    A file must be readable by its owner only: `chmod 600 FILE`.
    """
    if ref.kind == "env":
        value = os.environ.get(ref.target)
        if value is None:
            raise SecretError(f"environment variable {ref.target} is not set")
        value = _strip_line_ends(value)
        problem = _content_problem(value)
        if problem:
            raise SecretError(f"environment variable {ref.target} {problem}")
        return value

    try:
        data = read_local_file(Path(ref.target), private=0o066, repo_root=repo_root)
    except FileProblem as e:
        raise SecretError(str(e)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError("the file is not UTF-8 text") from None
    text = _strip_line_ends(text)
    problem = _content_problem(text)
    if problem:
        raise SecretError(f"the file {problem}")
    return text


def credentials_problem(text: str) -> str | None:
    """What is wrong with a `user:password` login (a mirror's, the apt proxy's), never the text.

    Both halves become tokens of netrc-like files (apt_auth.conf(5), curl's --netrc-file), which
    split on whitespace and where curl reads a token starting with a double quote as a quoted
    string: printable ASCII without spaces, double quotes or backslashes keeps them one token.
    curl (7.84 and later, lib/netrc.c) also reads a token that starts with '#' as a comment:
    such a password would silently go out empty.
    """
    user, colon, password = text.partition(":")
    if not colon:
        return "must be user:password (no ':' found)"
    if not user or not password:
        return "must be user:password, both non-empty"
    for c in text:
        if not ("!" <= c <= "~") or c in '"\\':
            return "must be printable ASCII without spaces, double quotes or backslashes"
    if user.startswith("#") or password.startswith("#"):
        return "user and password must not start with '#' (curl's netrc reads it as a comment)"
    return None
