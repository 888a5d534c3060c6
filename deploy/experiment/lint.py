"""`lint`: Determined 0.38.0's own schema check, then this cluster's rules.

Each problem is one line `file: key: value: what, and the fix`. Errors are what the master
refuses or what fails every trial; warnings are what works but defeats the cluster's layout
or a distributed run (docs/experiments.md lists each rule with the pitfall behind it).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from deploy.cluster.loader import Loader
from deploy.experiment import code, schema
from deploy.experiment.rules import Problem, cluster_rules, get, integer
from deploy.experiment.target import Target

MAX_BYTES = 1 << 20  # an experiment config is a few KiB
SAID_BELOW = {
    ("<top>", "Additional properties are not allowed ('gpu_affinity' was unexpected)"),
    ("resources", "Additional properties are not allowed ('gpu_affinity' was unexpected)"),
    ("checkpoint_storage", "Additional properties are not allowed ('region' was unexpected)"),
}


def read(path: str) -> tuple[dict | None, list[Problem]]:
    """The experiment file as a mapping, or one problem saying why it is not one."""

    def bad(what: str) -> tuple[None, list[Problem]]:
        return None, [Problem(path, "<file>", "-", what)]

    p = Path(path)
    try:
        if not p.is_file():
            return bad("no such file" if not p.exists() else "not a regular file")
        data = p.read_bytes()[: MAX_BYTES + 1]
    except OSError as e:
        return bad(f"cannot be read ({e.strerror})")
    if len(data) > MAX_BYTES:
        return bad("larger than 1 MiB: not an experiment configuration")
    try:
        # The cluster.yaml loader: YAML 1.2 like the `det` CLI's ruamel.yaml, with limits on
        # depth and alias expansion (an alias bomb is one line here, not a full memory).
        node, document = Loader(data.decode("utf-8")).load()
    except UnicodeDecodeError:
        return bad("not UTF-8 text")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return bad(f"not valid YAML{where}: {getattr(e, 'problem', None) or e}".replace("\n", " "))
    except RecursionError:
        return bad("nested too deeply")
    if document is None:
        return bad("empty: an experiment configuration is a YAML mapping (see `new`)")
    if not isinstance(document, dict):
        return bad(f"must be a YAML mapping of experiment keys, not {type(document).__name__}")
    return document, [Problem(path, key, "-", what) for key, what in duplicates(node)]


def duplicates(node: yaml.Node | None, path: str = "") -> list[tuple[str, str]]:
    """Keys written twice in one mapping. `det experiment create` refuses them (ruamel.yaml's
    DuplicateKeyError, determined/common/util.py safe_load_yaml_with_exceptions); PyYAML would
    silently keep the last one, so the lint would check a config the CLI never sends."""
    found: list[tuple[str, str]] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
            where = f"{path}.{name}" if path else name
            if name in seen:
                found.append(
                    (
                        where,
                        f"written twice (lines {seen[name]} and {key.start_mark.line + 1}): "
                        "`det experiment create` refuses duplicate keys; keep one",
                    )
                )
            else:
                seen[name] = key.start_mark.line + 1
            found += duplicates(value, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += duplicates(item, f"{path}[{i}]")
    return found


def lint(path: str, target: Target, model_dir: str | None = None) -> list[Problem]:
    config, found = read(path)
    if config is None:
        return found
    for key, message in schema.errors(config):
        if (key, message) in SAID_BELOW:
            continue  # the cluster rules say it with the fix
        found.append(
            Problem(
                path,
                key,
                get(config, *key.split(".")) if "[" not in key and key != "<top>" else "-",
                f"Determined {schema.SCHEMA_VERSION} refuses it: {message}",
            )
        )
    found += cluster_rules(path, config, target)
    slots = integer(get(config, "resources", "slots_per_trial"))
    if model_dir is not None:
        d = Path(model_dir)
        if not d.is_dir():
            found.append(Problem(model_dir, "<dir>", "-", "not a directory: give the model directory"))
        elif slots is not None and slots > 1:
            for where, text, what in code.problems(d):
                found.append(Problem(where, "code", text, what.removeprefix("warning: "), warning=True))
    return found
