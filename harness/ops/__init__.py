"""The op table: one entry per op (see :mod:`harness.ops.base`), looked up by name.

To add an op, write one :class:`~harness.ops.base.Op` subclass in the family's module and
add it to that module's ``OPS``; nothing else in the harness has per-op branches: the fuzzer,
the recorder, the numerics checks and the bare timing loop read the entry's attributes.
"""

from __future__ import annotations

from . import coalesced, collectives, objects, p2p, pg_api, tensor_forms
from .base import CallContext, Fuzzed, Op, RefContext, Role, reduce_tensors, reference_tolerance

ALL_OPS: dict[str, Op] = {op.name: op for op in (*collectives.OPS, *tensor_forms.OPS,
                                                 *coalesced.OPS, *objects.OPS, *p2p.OPS,
                                                 *pg_api.OPS)}

# Ops that are always async (their name says so) ignore the case's ``async`` axis.
ALWAYS_ASYNC = frozenset(op.name for op in ALL_OPS.values() if op.always_async)


def get(name: str) -> Op:
    """The entry for ``name``; KeyError if there is none."""
    return ALL_OPS[name]


__all__ = ["ALL_OPS", "ALWAYS_ASYNC", "CallContext", "Fuzzed", "Op", "RefContext", "Role", "get",
           "reduce_tensors", "reference_tolerance"]
