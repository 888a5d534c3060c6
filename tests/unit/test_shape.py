"""The code's shape, kept by a test: small roles, a small model, pyinfra's internals in one place,
and a repository that stands alone.

- roles/ is one package per service (roles/<service>/) and the shared layer (roles/shared/);
  no module sits at roles/'s top level but its __init__.py. A package's static files are
  files/<package>/: a package that names files has that folder, every folder of files/ is a
  package's, and a module names only its own package's files or the shared layer's.
- The shared layer imports no service package; no module outside a package imports that
  package's underscore-private names; no module under deploy/ has the name of one under roles/.
- A role module (each module of each package) reads in five minutes: at most ROLE_LINES lines.
- The cluster model's modules: at most MODEL_LINES lines each; each cluster.yaml section's keys
  are declared in that section's module, deploy/cluster/<section>.py or <section>_keys.py
  (`_keys` where a role module has the section's name; its sub-sections there or in a module
  it imports), and model.py only composes them into `Cluster`.
- Only the extension module (deploy/pyinfra_ext*) imports a pyinfra name that starts with an
  underscore or replaces an attribute of something imported from pyinfra; everything else uses
  pyinfra's documented API, so an upgrade breaks in one known place.
- Code and docs point at nothing outside the repository: users of the toolkit have only it.
- tests/verify imports no role: it checks what the roles did, from the model and neutral modules.
- Values derived from cluster.yaml (the trials' endpoint, the task images' site references, the
  MinIO users' secret keys) are computed in deploy/cluster only, once; everyone else reads them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
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


def _section_types() -> dict[str, type]:
    """cluster.yaml's top-level sections (mappings and the `nodes` list) -> their dataclass."""
    import dataclasses
    import typing

    from deploy.cluster.model import Cluster

    found: dict[str, type] = {}
    for name, hint in typing.get_type_hints(Cluster, include_extras=True).items():
        if typing.get_origin(hint) is not typing.Annotated:
            continue  # not a key: `path`, the derived values
        kind = typing.get_args(hint)[0]
        # nodes: tuple[Node, ...]
        kind = typing.get_args(kind)[0] if typing.get_origin(kind) is tuple else kind
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            found[name] = kind
    return found


def _declared_outside_their_module(sections: dict[str, type]) -> list[str]:
    return [
        f"cluster.yaml's `{name}` keys are declared in {kind.__module__}, not deploy.cluster.{name}"
        for name, kind in sections.items()
        if kind.__module__ not in (f"deploy.cluster.{name}", f"deploy.cluster.{name}_keys")
    ]


def test_each_section_declares_its_keys_in_its_own_module():
    sections = _section_types()
    # Every section the docs list is seen (a renamed field would otherwise escape the rule).
    assert {"ssh", "network", "preflight", "nodes", "versions", "sources", "storage"} <= set(sections)
    assert {"database", "determined", "hardware"} <= set(sections)
    assert _declared_outside_their_module(sections) == []


def test_the_section_module_detector_sees_what_it_must():
    from deploy.cluster.storage_keys import Storage

    [problem] = _declared_outside_their_module({"database": Storage})
    assert problem == (
        "cluster.yaml's `database` keys are declared in deploy.cluster.storage_keys, "
        "not deploy.cluster.database"
    )


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


# Paths of this repository named in its own text (comments on nodes, docstrings, docs): each
# must exist, so a moved module does not leave its old name behind. Paths that are another
# project's (a file of NVIDIA's Ansible role) or a pattern, by name.
OWN_PATH = re.compile(
    r"(?<![\w/.-])(?:roles|files)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(?:py|j2|sh|conf|service|timer|yaml)\b"
)
NOT_OURS = {
    "files/nvidia-persistenced-override.conf",  # NVIDIA/ansible-role-nvidia-driver's
    "files/PACKAGE/NAME.sh",  # the pattern a shared script's path follows
}


def test_every_own_path_named_in_the_text_exists():
    files = [REPO / "README.md"]
    for d in (*CODE_DIRS, "docs", "files"):
        files += [p for p in (REPO / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    missing = []
    for path in files:
        if (
            path.suffix not in TEXT_SUFFIXES
            and path.parent.name != "files"
            and path.parent.parent.name != "files"
        ):
            continue
        text = path.read_text(errors="replace")
        missing += [
            f"{_rel(path)}: {name}"
            for name in sorted(set(OWN_PATH.findall(text)))
            if name not in NOT_OURS and not (REPO / name).exists()
        ]
    assert not missing, missing


# --- verify is its own oracle ---------------------------------------------------------------
# tests/verify checks what the roles did: importing a role would make the deploy's own code the
# judge of its result. What both need (a path, a vendor's minimum, a naming convention, a value
# derived from cluster.yaml) lives in the model or a neutral deploy/ module both import.


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import, `from x import y` also as x.y (y may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _is_role(module: str) -> bool:
    return module == "roles" or module.startswith("roles.")


@pytest.mark.parametrize("path", _python_files("tests/verify"), ids=_rel)
def test_verify_imports_no_role_module(path):
    roles = [f"line {n}: {m}" for n, m in _imported_modules(ast.parse(path.read_text())) if _is_role(m)]
    assert not roles, f"{_rel(path)} imports {roles}: move what it needs out of roles/"


def test_the_role_import_detector_sees_what_it_must():
    sample = "import roles.kernel\nfrom roles import hosts\nfrom roles.hosts import x\nimport rolesx\n"
    found = [m for _, m in _imported_modules(ast.parse(sample)) if _is_role(m)]
    assert found == ["roles.kernel", "roles", "roles.hosts", "roles.hosts", "roles.hosts.x"]
    assert not [m for _, m in _imported_modules(ast.parse("from deploy import roles_x\n")) if _is_role(m)]


def test_verify_pulls_in_no_role_module():
    """Nor through what it imports: every module of tests/verify imported (not __main__, the
    command line; the check above reads it), no roles.* loaded."""
    names = [
        f"tests.verify.{p.stem}"
        for p in _python_files("tests/verify")
        if p.stem not in ("__init__", "__main__")
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'roles' or m.startswith('roles.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_neutral_modules_import_no_role_either():
    """What verify imports from deploy/ must not pull a role in behind its back."""
    neutral = [p for p in _python_files("deploy") if "pyinfra_ext" not in p.parts and p.name != "site.py"]
    offenders = {
        _rel(p): m for p in neutral for _, m in _imported_modules(ast.parse(p.read_text())) if _is_role(m)
    }
    assert not offenders, offenders


# --- derived values are computed once, in the model ------------------------------------------
# deploy/cluster computes the trials' endpoint (storage_tls.trial_endpoint, trial_address), the
# site references of the task images (images.site_ref) and the MinIO users' secret keys
# (storage_keys.derive_secret, with scrypt) when cluster.yaml is loaded; everyone else reads
# Cluster.trial_endpoint, Cluster.task_refs and Storage.determined_secret / backup_secret.
DERIVATIONS = ("trial_endpoint", "trial_address", "site_ref", "derive_secret", "scrypt")
# The function's own tests may call it on made-up input; the lab pulls an image the cluster
# does not name (a CUDA 12.4 one, to see the driver refuse it) through the site registry.
MAY_CALL = {
    "site_ref": ("tests/unit/test_task_images.py", "tests/lab/"),
    "derive_secret": ("tests/unit/test_minio_iam.py",),
}


def _derivation_calls(tree: ast.AST) -> list[tuple[int, str, ast.Call]]:
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func  # f(...) or module.f(...)
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in DERIVATIONS:
            calls.append((node.lineno, name, node))
    return calls


def _names_task_image(call: ast.Call) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr == "task_image" for a in call.args for n in ast.walk(a)
    )


def test_no_module_outside_the_model_recomputes_a_derived_value():
    offenders = []
    for path in _python_files(*CODE_DIRS) + [REPO / "deploy.py"]:
        rel = _rel(path)
        if rel.startswith("deploy/cluster/"):
            continue
        for line, name, call in _derivation_calls(ast.parse(path.read_text())):
            allowed = rel.startswith(MAY_CALL.get(name, ()))
            # Not even there for the cluster's own images: Cluster.task_refs has them.
            if not allowed or (rel.startswith("tests/lab/") and _names_task_image(call)):
                offenders.append(f"{rel}:{line}: {name}()")
    assert not offenders, f"derived values recomputed outside deploy/cluster: {offenders}"


def test_the_derivation_detector_sees_what_it_must():
    sample = (
        "site_ref(c, c.determined.task_image.gpu)\n"
        "images.site_ref(c, 'x')\n"
        "hashlib.scrypt(b'', salt=b'', n=2, r=1, p=1)\n"
        "c.trial_endpoint\n"
    )
    calls = _derivation_calls(ast.parse(sample))
    assert [(n, name) for n, name, _ in calls] == [(1, "site_ref"), (2, "site_ref"), (3, "scrypt")]
    assert [_names_task_image(call) for _, _, call in calls] == [True, False, False]


# --- cohesion --------------------------------------------------------------------------------

FUNCTION_LINES = 60  # beyond this a function says why it is one piece ("# Long: ...")


def _long_functions_without_a_reason(tree: ast.Module, source: str) -> list[tuple[int, str]]:
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if node.end_lineno is None or node.end_lineno - node.lineno + 1 <= FUNCTION_LINES:
            continue
        head = lines[node.lineno - 1 : node.body[0].end_lineno + 4]  # signature, docstring, a comment
        if not any(line.strip().startswith("# Long: ") for line in head):
            found.append((node.lineno, node.name))
    return found


def test_long_functions_say_why():
    """A function over FUNCTION_LINES lines is split into its steps, or says in a `# Long: `
    comment (after its docstring) why it reads better as one (a plan in run order, a format
    read in one pass)."""
    offenders = [
        f"{_rel(path)}:{line}: {name}"
        for path in _python_files("deploy", "roles", "tests/verify")
        for line, name in _long_functions_without_a_reason(ast.parse(path.read_text()), path.read_text())
    ]
    assert not offenders, f"functions over {FUNCTION_LINES} lines without a '# Long:' reason: {offenders}"


def test_the_long_function_detector_sees_what_it_must():
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    bare = f"def f():\n{body}"
    reasoned = f'def g():\n    """Doc."""\n    # Long: one table read in one pass\n{body}'
    short = "def h():\n    return 1\n"
    source = bare + reasoned + short
    assert _long_functions_without_a_reason(ast.parse(source), source) == [(1, "f")]


def test_no_role_imports_another_roles_private_names():
    offenders = []
    for path in _python_files("roles"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("roles"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private:
                    offenders.append(f"{_rel(path)}:{node.lineno}: from {node.module} import {private}")
    assert not offenders, offenders


# --- one package per service ------------------------------------------------------------------
# roles/<service>/ holds a service's roles and helpers, files/<service>/ its static files and
# templates (files_path("minio/minio.service")), roles/shared/ and files/shared/ what all use.

ROLES = REPO / "roles"
SHARED = "shared"
FILE_FUNCTIONS = {"files_path", "render", "script"}


def _packages() -> list[str]:
    return sorted(p.name for p in ROLES.iterdir() if p.is_dir() and p.name != "__pycache__")


def _package_of(path: Path) -> str | None:
    """The roles package `path` is in (roles/minio/tls.py: "minio"), None outside roles/<pkg>/."""
    parts = path.relative_to(REPO).parts
    return parts[1] if len(parts) > 2 and parts[0] == "roles" else None


def test_roles_is_packages_only():
    loose = sorted(p.name for p in ROLES.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules at roles/'s top level: {loose}: put each in its service's package"
    no_init = [pkg for pkg in _packages() if not (ROLES / pkg / "__init__.py").is_file()]
    assert not no_init, f"roles/ folders without __init__.py: {no_init}"


def _named_files(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, files/-relative path or its leading literal part) of files_path/render/script calls."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name not in FILE_FUNCTIONS:
            continue
        first = node.args[0]
        if isinstance(first, ast.JoinedStr) and first.values:
            first = first.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and "/" in first.value:
            found.append((node.lineno, first.value))
    return found


def _files_by_package() -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    for path in _python_files("roles"):
        package = _package_of(path)
        for line, relative in _named_files(ast.parse(path.read_text())):
            named.setdefault(package or "", []).append(f"{_rel(path)}:{line}: {relative}")
    return named


def test_files_mirror_the_role_packages():
    folders = sorted(p.name for p in (REPO / "files").iterdir() if p.is_dir())
    orphans = sorted(set(folders) - set(_packages()))
    assert not orphans, f"files/ folders with no roles/ package of that name: {orphans}"
    named = _files_by_package()
    missing = sorted(pkg for pkg in named if not (REPO / "files" / pkg).is_dir())
    assert not missing, f"roles packages that name files but have no files/<package>/: {missing}"
    foreign = [
        ref
        for pkg, refs in named.items()
        for ref in refs
        if ref.rsplit(": ", 1)[1].split("/", 1)[0] not in (pkg, SHARED)
    ]
    assert not foreign, f"a package names another package's files: {foreign}"
    absent = [ref for refs in named.values() for ref in refs if not _file_exists(ref.rsplit(": ", 1)[1])]
    assert not absent, f"named files that files/ does not have: {absent}"


def _file_exists(relative: str) -> bool:
    if "{" in relative or relative.endswith("/"):  # an f-string's literal head: its folder
        return (REPO / "files" / relative.split("/", 1)[0]).is_dir()
    return (REPO / "files" / relative).is_file()


def test_the_files_detector_sees_what_it_must():
    sample = (
        'render("minio/x.j2", a=1)\n'
        'script(\n    "shared/apt-update.sh", 1)\n'
        'files_path(f"postgresql/{unit}")\n'
        'cuda.script("nvidia/cuda-link.sh")\n'
        "render(text)\n"
    )
    assert [r for _, r in _named_files(ast.parse(sample))] == [
        "minio/x.j2",
        "shared/apt-update.sh",
        "postgresql/",
        "nvidia/cuda-link.sh",
    ]


def _roles_imports(tree: ast.AST) -> list[tuple[int, str]]:
    return [(n, m) for n, m in _imported_modules(tree) if _is_role(m)]


def test_the_shared_layer_imports_no_service_package():
    offenders = [
        f"{_rel(path)}:{line}: {module}"
        for path in (ROLES / SHARED).glob("*.py")
        for line, module in _roles_imports(ast.parse(path.read_text()))
        if module.split(".")[:2] != ["roles", SHARED] and module != "roles"
    ]
    assert not offenders, f"roles/shared/ imports a service package: {offenders}"


def _private_uses_of_packages(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, package, what) for each `from roles.<pkg>[.mod] import _x` and each `m._x` where m
    was imported from roles.<pkg> (a module of it)."""
    found: list[tuple[int, str, str]] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_role(node.module or ""):
            parts = (node.module or "").split(".")
            for alias in node.names:
                package = parts[1] if len(parts) > 1 else alias.name
                if alias.name.startswith("_"):
                    found.append((node.lineno, package, f"imports {node.module}.{alias.name}"))
                aliases[alias.asname or alias.name] = package
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if _is_role(alias.name) and len(parts) > 1 and alias.asname:
                    aliases[alias.asname] = parts[1]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append((node.lineno, aliases[node.value.id], f"uses {node.value.id}.{node.attr}"))
    return found


def test_no_module_outside_a_package_uses_its_private_names():
    offenders = [
        f"{_rel(path)}:{line}: {what}"
        for path in _python_files(*CODE_DIRS) + [REPO / "deploy.py"]
        for line, package, what in _private_uses_of_packages(ast.parse(path.read_text()))
        if _package_of(path) != package
    ]
    assert not offenders, f"private names of a roles package used outside it: {offenders}"


def test_the_package_privacy_detector_sees_what_it_must():
    sample = (
        "from roles.minio.tls import _pair, public\n"
        "from roles.postgresql import server as postgresql\n"
        "from roles.apt import cuda_repo\n"
        "postgresql._scram(1)\n"
        "cuda_repo.keyring\n"
        "postgresql.__name__\n"
    )
    assert [(p, w) for _, p, w in _private_uses_of_packages(ast.parse(sample))] == [
        ("minio", "imports roles.minio.tls._pair"),
        ("postgresql", "uses postgresql._scram"),
    ]


def test_no_twin_module_names_across_deploy_and_roles():
    """Twins (a deploy/minio_iam.py beside a roles/ minio_iam.py) read as one module in two places: a name is
    in one tree or the other (a package's __init__ and __main__ aside)."""

    def stems(tree: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for path in _python_files(tree):
            if path.stem not in ("__init__", "__main__"):
                found.setdefault(path.stem, []).append(_rel(path))
        return found

    deploy, roles = stems("deploy"), stems("roles")
    twins = {name: deploy[name] + roles[name] for name in sorted(set(deploy) & set(roles))}
    assert not twins, f"the same module name under deploy/ and roles/: {twins}"
