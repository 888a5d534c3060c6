"""deploy.cluster's key table: every key declared once on the model, and the docs generated from it."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from deploy.cluster import DEFAULT_DETERMINED_VERSION, DEFAULT_VERSIONS, Cluster, Node, docs, keys, model
from deploy.cluster.cli import main

REGENERATE = f"docs/cluster-yaml.md's key tables differ from deploy/cluster/model.py: run `{docs.COMMAND}`"


def test_docs_key_tables_are_generated_from_the_model():
    text = docs.DOC.read_text(encoding="utf-8")
    assert docs.render(text) == text, REGENERATE


def test_docs_command_rewrites_only_the_tables(tmp_path, monkeypatch, capsys):
    text = docs.DOC.read_text(encoding="utf-8")
    stale = text.replace("| `master_port` |", "| `master_prot` |")
    assert stale != text
    copy = tmp_path / "cluster-yaml.md"
    copy.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(docs, "DOC", copy)
    assert main(["docs"]) == 0
    assert copy.read_text(encoding="utf-8") == text
    assert capsys.readouterr().out == f"{copy}: updated\n"
    assert main(["docs"]) == 0
    assert capsys.readouterr().out == f"{copy}: up to date\n"


def test_docs_without_markers_is_an_error():
    with pytest.raises(ValueError, match="begin keys"):
        docs.render("# no tables here\n")


def _model_classes() -> list[type]:
    # Cluster and the sections model.py composes it of, each from its own module
    # (deploy/cluster/<section>.py); not the key specs of keys.py.
    classes = [
        obj
        for obj in vars(model).values()
        if isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and obj.__module__.startswith("deploy.cluster.")
        and obj.__module__ != "deploy.cluster.keys"
    ]
    assert len(classes) >= 14, classes  # a class that moved out of sight would escape the tests
    return classes


@pytest.mark.parametrize("cls", _model_classes(), ids=lambda c: c.__name__)
def test_every_field_is_a_key(cls):
    """A field without a spec would be neither read nor allowed nor documented. The derived
    values (init=False: __post_init__ computes them from the keys) are no keys."""
    unread = {"Cluster": {"path"}, "Artifact": {"url", "sha256", "per_distro"}}.get(cls.__name__, set())
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    assert [f for f in fields if f not in unread] == list(keys.allowed(cls))
    derived = [f.name for f in dataclasses.fields(cls) if not f.init]
    assert not set(derived) & set(keys.allowed(cls))


def test_optional_types_match_optional_defaults():
    """`| None` exactly where a key may stay unset: no default, or agents only."""
    for cls in _model_classes():
        for f in dataclasses.fields(cls):
            spec = keys.specs(cls).get(f.name)
            optional = "None" in str(typing.get_type_hints(cls)[f.name])  # the type, not its Key's repr
            expected = (isinstance(spec, keys.Key) and (spec.default is None or spec.agents_only)) or (
                isinstance(spec, keys.SecretKey) and spec.optional
            )
            assert optional == expected, f"{cls.__name__}.{f.name}: {f.type}"


def test_every_key_has_a_row_with_a_description():
    rows = list(keys.rows(Cluster)) + list(keys.rows(Node))
    assert len({path for path, *_ in rows}) == len(rows)
    assert all(rule and default and doc for _, rule, default, doc in rows)
    assert "storage.console_port" in {path for path, *_ in rows}


def test_exported_defaults_come_from_the_table():
    assert DEFAULT_VERSIONS == {
        "nvidia_driver": "515.65.01",
        "cuda": "11.7.1",
        "nccl": "2.14.3",
        "mofed": "5.8-3.0.7.0",
    }
    assert DEFAULT_DETERMINED_VERSION == "0.38.0"
    assert keys.default(model.Storage, "port") == 9000
    with pytest.raises(KeyError):
        keys.default(model.Storage, "endpoint_url")  # computed from the storage host
