"""The harness itself (tests/unit/optest.py): a missing fact fails, `_if` is honoured."""

from __future__ import annotations

import contextlib

import pytest
from pyinfra.api import deploy, operation
from pyinfra.facts.files import File, Sha256File
from pyinfra.operations import server

from tests.unit.optest import Facts, MissingFact, changing, fact, on_host, plan, run_op


@operation()
def reads(path: str):
    if host_fact(Sha256File, path=path) == "ab":
        return
    yield f"fetch {path}"


def host_fact(cls, **kwargs):
    from pyinfra import host

    return host.get_fact(cls, **kwargs)


def test_a_fact_the_case_does_not_give_fails_naming_it_and_its_arguments():
    with pytest.raises(MissingFact, match=r"pyinfra\.facts\.files\.Sha256File\(path='/x'\)"):
        run_op(reads, {File: None}, "/x")


def test_a_fact_keyed_by_its_arguments_answers_only_for_them():
    assert run_op(reads, {fact(Sha256File, path="/x"): "ab"}, "/x") == ([], [])
    with pytest.raises(MissingFact, match=r"Sha256File\(path='/y'\)"):
        run_op(reads, {fact(Sha256File, path="/x"): "ab"}, "/y")


def test_a_missing_fact_fails_even_when_the_code_catches_it():
    # contextlib.suppress(Exception): what a role's broad `except Exception` would do.
    with pytest.raises(MissingFact, match="Sha256File"), on_host({}), contextlib.suppress(Exception):
        host_fact(Sha256File, path="/x")


@deploy("Two steps")
def two_steps():
    first = server.shell(
        name="first", commands=["echo one"], _if=lambda: host_fact(File, path="/go") is not None
    )
    server.shell(name="second", commands=["echo two"], _if=first.did_change)


@pytest.mark.parametrize(
    "go, changed", [(None, []), ({"mode": 644}, ["Two steps | first", "Two steps | second"])]
)
def test_plan_evaluates_each_if_against_the_earlier_results(go, changed):
    planned = plan(two_steps, Facts({File: go}))
    assert [p.name for p in planned] == ["Two steps | first", "Two steps | second"]
    assert changing(planned) == changed


def test_plan_fails_on_a_missing_fact():
    with pytest.raises(MissingFact, match=r"File\(path='/go'\)"):
        plan(two_steps, Facts({}))
