"""The ``steps:`` form: a case's program built into :class:`Step` records at one point.

The tensors and the expected values are built here; each step is built by its kind
(:mod:`harness.casefile.stepkinds`, one module per kind), given the parts every step shares:
its line and the ranks that run it. Per-rank expressions are evaluated through
:class:`~harness.casefile.evaluate.CaseEval`.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes
from ..expr import Expr, parse
from ..model import Fill, Step, TensorSpec
from . import deaths, opargs, p2pmatch, stepkinds
from . import entries as list_entries
from . import sparse as sparse_layout
from .evaluate import CaseEval, buffer_fill
from .fields import as_list, expr_names, parse_fill
from .stepkinds.base import BuildContext


class ProgramBuilder(CaseEval):
    """The tensors, steps and expected values of a ``steps:`` case."""

    def build(self, point: dict[str, Any], env: dict[str, Any]) -> tuple[
            tuple[TensorSpec, ...], tuple[Step, ...], tuple[tuple[str, Fill], ...]]:
        raw, ws = self.raw, point["world_size"]
        tensors: list[TensorSpec] = []
        for name, spec in raw.get("tensors", {}).items():
            is_obj = spec.get("dtype") == "object"
            init = buffer_fill(self.case, spec["init"], bool(is_obj))
            self.check_ranks(init, ws, ("tensors", name, "init"), f"tensors.{name}.init")
            shape, rank_shapes = None, None
            entry_shapes: tuple[tuple[tuple[int, ...], ...] | None, ...] | None = None
            if "entries" in spec:
                rank_shapes, entry_shapes = list_entries.tensor_layouts(self.case, name, spec,
                                                                        env, ws)
                shape = rank_shapes[0]
            elif "shape" in spec:
                spath = ("tensors", name, "shape")
                if opargs.uses_rank(spec["shape"]):
                    rank_shapes = tuple(self.eval_shape(spec["shape"], {**env, "rank": r}, spath)
                                        for r in range(ws))
                    shape = rank_shapes[0]
                else:
                    shape = self.eval_shape(spec["shape"], env, spath)
            dtype = dtypes.canonical(spec["dtype"]) if "dtype" in spec else point["dtype"]
            if dtype is None:
                raise self.case.error(("tensors", name, "dtype"),
                                      f"unknown dtype {spec['dtype']!r}")
            layout = "contiguous" if entry_shapes else spec.get("layout", point["layout"])
            tensors.append(TensorSpec(name, shape, dtype, init, layout,
                                      rank_shapes=rank_shapes, entry_shapes=entry_shapes,
                                      sparse=sparse_layout.spec(
                                          self.case, ("tensors", name) if "sparse" in spec
                                          else (), spec if "sparse" in spec else raw, layout,
                                          list(rank_shapes or (shape,)))))
        built = tuple(self._step(s, ("steps", idx), point, env)
                      for idx, s in enumerate(raw["steps"]))
        p2pmatch.check(self.case, built, ws, env)
        steps = deaths.with_survivors(built, ws, env)
        self._check_futures(steps)
        dead = frozenset(r for r, _, _ in deaths.plan(self.case, steps, ws, env))
        expected: list[tuple[str, Fill]] = []
        for tname, fill_raw in raw.get("expected", {}).items():
            fill = parse_fill(self.case, fill_raw)
            if fill.kind == "auto" or (fill.kind == "per_rank" and any(
                    f.kind == "auto" for f in fill.data.values())):
                # The reference model computes one op's output from its inputs; a program's
                # buffers pass through several steps (docs/reference/programs.md).
                raise self.case.error(("expected", tname), f"expected.{tname}: 'auto' needs the "
                                      "op: form (one collective); a program's buffers must be "
                                      "given", "write the values (a list, an expression, "
                                      "unchanged) or compare buffers with same_bits")
            self.check_ranks(fill, ws, ("expected", tname), f"expected.{tname}", dead)
            expected.append((tname, fill))
        return tuple(tensors), steps, tuple(expected)

    def _check_futures(self, steps: tuple[Step, ...]) -> None:
        """A ``future`` step needs the Work of an async op: on a sync op (say the case's
        ``async`` axis made it sync in this instance) it would find no Work and check nothing,
        silently, so that is an error here."""
        sync_handles = {s.handle: s for s in steps if s.kind == "op" and s.handle
                        and not s.async_op}
        for idx, s in enumerate(steps):
            if s.kind == "future" and s.waits and s.waits[0] in sync_handles:
                op = sync_handles[s.waits[0]]
                raise self.case.error(("steps", idx, "future"), (
                    f"future step on handle {s.waits[0]!r}: its op ({op.op}, line {op.line}) "
                    "is synchronous here, so there is no Work whose future the step could "
                    "check"), "give that op 'async: true' (or leave the case's async axis "
                    "at true)")

    def _step(self, s: dict[str, Any], path: tuple[Any, ...], point: dict[str, Any],
              env: dict[str, Any]) -> Step:
        """The :class:`Step` of raw step ``s`` at ``path`` (a capture's own steps inside it)."""
        ws = point["world_size"]
        names = (*expr_names(self.case),)
        line = self.case.doc.pos((*self.case.origin["steps"], *path[1:])).line
        ranks: tuple[int, ...] | Expr | None = None
        if "ranks" in s:
            r = s["ranks"]
            ranks = parse(r, names) if isinstance(r, str) else tuple(as_list(r))
            if isinstance(ranks, tuple) and any(x >= ws for x in ranks):
                raise self.case.error((*path, "ranks"), f"ranks {list(ranks)} "
                                      f"outside world_size {ws}")
        action = stepkinds.actions_of(s)[0]
        ctx = BuildContext(self, point, env, path, line, ranks, names,
                           lambda inner, at: self._step(inner, at, point, env))
        return stepkinds.BY_ACTION[action].build(s, action, ctx)
