"""The step kinds of a ``steps:`` program, one module each, and their registry.

Each kind is a :class:`~harness.casefile.stepkinds.base.StepKind`: the action keys it owns
(``("op",)``, ``("sleep", "sync")`` ...), a ``check`` of one raw step (its own problems; the
checks every step gets stay in :func:`harness.casefile.programcheck.check_steps`), an optional
``check_program`` for rules that span the program, and a ``build`` of one validated step into
a :class:`~harness.model.Step` (:class:`harness.casefile.programs.ProgramBuilder` computes the
line and the ranks and dispatches). ``KINDS`` below is the registry; :data:`STEP_ACTIONS`,
the order of the format's "a step needs exactly one of" message and the order kinds'
program-wide checks run in, comes from it.

Adding a step kind is one module here plus one line in ``KINDS``; and, as for any key of the
format, its action and keys in the JSON Schema (``harness/schemas/case-file.schema.json``),
keys that other kinds must not use in :data:`harness.casefile.programcheck.ONLY_WITH`, its
rank-side behaviour in :mod:`harness.program.interpreter`, and its line in
docs/reference/programs.md. tests/test_step_kinds.py checks the registry against the schema
and the docs.

The protocol is in :mod:`.base` rather than here, so the kind modules can import it while
this module imports them.

Must not: import torch, or run anything a case says; a kind's build only parses and evaluates
the whitelisted expressions of :mod:`harness.expr`.
"""

from __future__ import annotations

from typing import Any

from ...errors import CaseFileError
from . import (
    cuda,
    device,
    drop,
    faults,
    host,
    identity,
    lifecycle,
    new_group,
    op,
    ordering,
    pgstate,
    recovery,
    wait,
    work_state,
)
from .base import CheckContext, StepKind
from .cuda import walk

# The order of the format's actions: the order of the "exactly one of" message.
KINDS: tuple[StepKind, ...] = (
    op.KIND,
    wait.KIND,
    host.KIND,
    ordering.KIND,
    faults.KIND,
    new_group.KIND,
    work_state.KIND,
    identity.KIND,
    lifecycle.KIND,
    recovery.KIND,
    cuda.KIND,
    drop.KIND,
    pgstate.KIND,
    device.KIND,
)
STEP_ACTIONS: tuple[str, ...] = tuple(a for kind in KINDS for a in kind.actions)
BY_ACTION: dict[str, StepKind] = {a: kind for kind in KINDS for a in kind.actions}

__all__ = ["BY_ACTION", "KINDS", "STEP_ACTIONS", "actions_of", "check_program", "walk"]


def actions_of(step: dict[str, Any]) -> list[str]:
    """The actions a raw step gives (a valid step gives exactly one), in registry order."""
    return [a for a in STEP_ACTIONS if a in step]


def check_program(ctx: CheckContext) -> list[CaseFileError]:
    """Every kind's program-wide problems, kind by kind in registry order."""
    return [e for kind in KINDS for e in kind.check_program(ctx)]
