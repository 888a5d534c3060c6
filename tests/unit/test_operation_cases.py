"""The custom operations' cases kept as data, run the way pyinfra runs its own operation tests.

tests/unit/operation_cases/<module>.<operation>/<case>.json (pyinfra's tests/operations layout):
  doc               what the case is about
  args, kwargs      the operation's arguments (JSON values)
  facts             {"deb.DebPackages": value} or {"files.Sha256File": {"path=/x": value}}:
                    the only facts the operation may read (any other fails the case by name)
  commands          what it yields, as tests/unit/optest.py `shown` writes them (a kept shell
                    program as ["script", "ROLE/NAME.sh", ARGS...])
  noop_description  what it tells pyinfra when it has nothing to do: a string, a list of them,
                    or absent for none; compared exactly either way
"""

from __future__ import annotations

import importlib
import json

import pytest

from tests.unit.optest import CASES, case_facts, case_files, run_op, shown

FILES = case_files()


def load_operation(dirname: str):
    module, _, name = dirname.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_operation_case(path):
    case = json.loads(path.read_text())
    op = load_operation(path.parent.name)
    commands, noops = run_op(
        op, case_facts(case.get("facts", {})), *case.get("args", []), **case.get("kwargs", {})
    )
    assert [shown(c) for c in commands] == case["commands"]
    wanted = case.get("noop_description")
    assert noops == ([] if wanted is None else [wanted] if isinstance(wanted, str) else wanted)


def test_the_cases_cover_every_operation_the_unit_tests_give_facts_to():
    # The operations the hand-written fake hosts used to serve, each with at least two cases
    # (one that changes something, one that does not) unless it cannot change anything.
    covered = {p.parent.name for p in FILES}
    assert covered >= {
        "roles.shared.ops.verified_binary",
        "roles.shared.ops.verified_deb",
        "roles.determined.docker.nvidia_runtime",
        "roles.postgresql.server.pgdg_key",
        "roles.apt.cuda_repo.keyring",
        "roles.nvidia.gpu_services.persistence_on",
        "roles.determined.users.built_in_users",
        "roles.determined.domains.unit_off",
    }
    for name in covered:
        cases = [json.loads(p.read_text()) for p in (CASES / name).glob("*.json")]
        assert any(c["commands"] for c in cases) or name in NO_CHANGE_ONLY, name
        assert any(not c["commands"] for c in cases), name


# Cases only of the no-change side here; their changing side needs arguments JSON cannot carry
# (tests/unit/test_determined_users.py, test_storage_roles.py) or makes random bytes.
NO_CHANGE_ONLY = {
    "roles.determined.users.built_in_users",
    "roles.determined.domains.no_domain_agents",
    "roles.postgresql.db_role.digest_key",
}
