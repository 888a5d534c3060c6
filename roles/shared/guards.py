"""Steps that stop a host before a change would end the training on it (deploy/training.py)."""

from __future__ import annotations

from pyinfra.api import operation

from roles.shared.ops import fail


@operation()
def not_while_training(refusal: str):
    """Stop this host before a step that would end the allocations the master runs on it
    (deploy/training.py Busy.refusal). Called with the step's own `_if`, so that it stops the
    host exactly when the step would run."""
    yield fail(refusal)
