"""The code's shape, kept by a test: small roles, a small model, pyinfra's internals in one place,
and a repository that stands alone.

- A role module reads in five minutes: at most ROLE_LINES lines.
- The cluster model's modules: at most MODEL_LINES lines each.
- Only the extension module (deploy/pyinfra_ext*) imports a pyinfra name that starts with an
  underscore or replaces an attribute of something imported from pyinfra; everything else uses
  pyinfra's documented API, so an upgrade breaks in one known place.
- Code and docs point at nothing outside the repository: users of the toolkit have only it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE_LINES = 220
# The model grows as derived values move into it (computed once, there): 640, not more.
MODEL_LINES = 640
EXTENSION = ("deploy/pyinfra_ext",)
# pyinfra documents `yield from files.put._inner(...)` as the way one operation uses another.
DOCUMENTED_PRIVATE = {"_inner"}
# Where code lives that a user runs or reads (tests/lab is the lab's own code: included).
CODE_DIRS = ("deploy", "roles", "tests", "inventories")
TEXT_SUFFIXES = (".py", ".md", ".j2", ".yaml", ".yml", ".sh", ".toml", ".conf", ".service")


def _python_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize("path", _python_files("roles"), ids=_rel)
def test_role_module_is_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= ROLE_LINES, f"{_rel(path)}: {lines} lines (> {ROLE_LINES}): split the role"


def test_cluster_model_modules_are_short():
    model = [REPO / "deploy" / "cluster.py", *sorted((REPO / "deploy" / "cluster").glob("*.py"))]
    too_long = {
        _rel(p): n for p in model if p.exists() and (n := len(p.read_text().splitlines())) > MODEL_LINES
    }
    assert not too_long, f"cluster model modules over {MODEL_LINES} lines: {too_long}"


def _pyinfra_private_uses(tree: ast.AST) -> list[str]:
    """`from pyinfra... import _x`, `pyinfra...._x`, and assignments to attributes of names
    imported from pyinfra (monkeypatching)."""
    found: list[str] = []
    from_pyinfra: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyinfra"):
            for alias in node.names:
                from_pyinfra.add(alias.asname or alias.name)
                if alias.name.startswith("_"):
                    found.append(f"line {node.lineno}: imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pyinfra"):
                    from_pyinfra.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in DOCUMENTED_PRIVATE
        ):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in from_pyinfra:
                found.append(f"line {node.lineno}: uses {base.id}...{node.attr}")
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute):
                base = target.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in from_pyinfra:
                    found.append(f"line {target.lineno}: replaces {base.id}...{target.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in from_pyinfra
        ):
            found.append(f"line {node.lineno}: setattr on {node.args[0].id}")
    return found


def test_only_the_extension_module_touches_pyinfra_internals():
    offenders = {}
    for path in _python_files("deploy", "roles", "tests/verify", "inventories") + [REPO / "deploy.py"]:
        if _rel(path).startswith(EXTENSION):
            continue
        uses = _pyinfra_private_uses(ast.parse(path.read_text()))
        if uses:
            offenders[_rel(path)] = uses
    assert not offenders, f"pyinfra internals outside {EXTENSION[0]}: {offenders}"


def test_the_private_use_detector_sees_what_it_must():
    sample = (
        "from pyinfra.api.facts import _make_command\n"
        "from pyinfra.connectors.ssh import SSHConnector\n"
        "import pyinfra\n"
        "SSHConnector.run_shell_command = None\n"
        "pyinfra.api._thing\n"
        "files.put._inner(src='x', dest='y')\n"
        "setattr(SSHConnector, 'x', 1)\n"
    )
    uses = _pyinfra_private_uses(ast.parse(sample))
    assert len(uses) == 4, uses
    assert not _pyinfra_private_uses(ast.parse("from pyinfra import host\nhost.noop('x')\n"))


# Where the toolkit grew from: places its users never have. Spelled in pieces so this file does
# not match itself.
OUTSIDE = ("shared" + "/notes", "facts" + ".md", "article" + ".md", "lab-recipe" + ".md", "design" + ".md")


def test_nothing_points_outside_the_repository():
    files = [REPO / "README.md", REPO / "deploy.py", REPO / "pyproject.toml"]
    for d in (*CODE_DIRS, "docs", "files", ".ci"):
        files += [p for p in (REPO / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    offenders = []
    for path in files:
        if path.suffix not in TEXT_SUFFIXES and path.parent.name != ".ci":
            continue
        text = path.read_text(errors="replace")
        offenders += [f"{_rel(path)}: {word}" for word in OUTSIDE if word in text]
    assert not offenders, offenders
