"""The ``steps:`` form: a case's program built into :class:`Step` records at one point.

Every step kind is built here (op steps with their buffers and arguments, waits, ordering
steps, group lifecycle, new_group/split, CUDA steps, sleeps and deliberate faults); per-rank
expressions are evaluated through :class:`~harness.casefile.evaluate.CaseEval` and each
step-kind module (``groups``, ``lifecycle``, ``steps``, ``cudasteps``, ``workstate`` ...)
builds its own steps.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes, ops
from ..expr import Expr, parse
from ..model import Fill, Step, TensorSpec, pack_tensor_list
from . import cudasteps, lifecycle, opargs, pgargs
from . import entries as list_entries
from . import groups as named_groups
from . import repeat as step_repeat
from . import returns as step_returns
from . import sparse as sparse_layout
from . import workstate as work_state
from .evaluate import PLAIN_ARGS, CaseEval, buffer_fill, group_arg, omitted
from .fields import as_list, expr_names, parse_fill
from .steps import is_ordering_step, make_step


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
        steps = tuple(self._step(s, ("steps", idx), point, env)
                      for idx, s in enumerate(raw["steps"]))
        self._check_futures(steps)
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
            self.check_ranks(fill, ws, ("expected", tname), f"expected.{tname}")
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
        if "op" in s:
            op = ops.get(s["op"])
            per_rep = tuple((s[role.name][0], tuple(s[role.name])) for role in op.roles
                            if isinstance(s[role.name], list)
                            and step_repeat.per_repetition(s, role.form))
            # A buffer listed per repetition runs under its first name (rebound per repetition).
            bufs = tuple((role.name, s[role.name] if isinstance(s[role.name], str)
                          else s[role.name][0] if step_repeat.per_repetition(s, role.form)
                          else pack_tensor_list(s[role.name])) for role in op.roles)
            args: list[tuple[str, Any]] = []
            for key in ("src", "dst", "tag", "group_src", "group_dst"):
                if key in s:
                    v = s[key]
                    args.append((key, parse(v, (*names, *step_repeat.names(s)))
                                 if isinstance(v, str) else v))
            for key in ("form", "inplace", *PLAIN_ARGS[1:]):
                if key in s:
                    args.append((key, s[key]))
            for key in pgargs.KEYS:
                if key in s:
                    args.append((key, pgargs.step_value(key, s[key], (
                        *names, *step_repeat.names(s)))))
            args += sorted(omitted(op, s.get("omit")).items())
            if "splits" in s:
                n = len(s["group"]) if "group" in s else ws
                args.append(("splits", opargs.eval_splits(self.case, s["splits"], n, env,
                                                    (*path, "splits"))))
            for k, entry in enumerate(s.get("p2p", [])):
                bufs = (*bufs, (f"p2p.{k}", entry["tensor"]))
                peer = entry["peer"] if "peer" in entry else entry["group_peer"]
                if "group_peer" in entry:
                    args.append((f"p2p.{k}.by_group", True))
                args.append((f"p2p.{k}.op", entry["op"]))
                args.append((f"p2p.{k}.peer", parse(peer, names) if isinstance(peer, str)
                             else peer))
                args.append((f"p2p.{k}.tag", entry.get("tag", 0)))
            if "group" in s:  # a list of ranks, or the name of a new_group step's group
                args.append(("group", group_arg(s["group"])))
            if "group_timeout" in s:
                args.append(("group_timeout", float(s["group_timeout"])))
            # A step's own reduce op (and premul factor) wins over the case's axis.
            if "reduce_op" in s:
                args.append(("reduce_op", s["reduce_op"]))
            if "premul_factor" in s:
                args.append(("premul_factor", self.premul(s["premul_factor"], env,
                                                           (*path, "premul_factor"))))
            asy = (s.get("async", bool(point.get("async", False)))
                   or op.name in ops.ALWAYS_ASYNC)
            rets = (step_returns.per_rank(self.case, s["returns"], ws, (*path, "returns"))
                    if "returns" in s else None)
            return Step("op", line, op=op.name, bufs=bufs, args=tuple(args),
                        ranks=ranks, async_op=asy, handle=s.get("handle"),
                        stream=s.get("stream", "current"), returns=rets,
                        repeat=int(s.get("repeat", 1)),
                        slices=bool(s.get("slices", False)), per_repetition=per_rep,
                        warns=s.get("warns"),
                        register_work=bool(s.get("register_work", False)),
                        **lifecycle.step_fields(s))
        if "wait" in s:
            wait_args: tuple[tuple[str, Any], ...] = (
                (("thread", True),) if s.get("thread") else ())
            if "timeout" in s:
                wait_args = (*wait_args, ("timeout", float(s["timeout"])))
            return Step("wait", line, ranks=ranks, waits=tuple(as_list(s["wait"])),
                        args=wait_args, **lifecycle.step_fields(s))
        if any(k in s for k in lifecycle.LIFECYCLE_ACTIONS):
            kind = next(k for k in lifecycle.LIFECYCLE_ACTIONS if k in s)
            group_args: tuple[tuple[str, Any], ...] = (
                (("group", group_arg(s["group"])),) if "group" in s else ())
            if "group_timeout" in s:
                group_args = (*group_args, ("group_timeout", float(s["group_timeout"])))
            return Step(kind, line, ranks=ranks, args=group_args,
                        value=float(s[kind]) if kind == "set_timeout" else None,
                        **lifecycle.step_fields(s))
        if "new_group" in s:
            step = named_groups.make_step(s, line, ranks, names)
            named_groups.check_membership(self.case, s, step, path, env,
                                          ranks if isinstance(ranks, tuple) else None)
            return step
        if "work_state" in s:
            return work_state.make_step(s, line, ranks)
        if is_ordering_step(s):
            return make_step(self.case, s, path[1], line, ranks, env)
        if cudasteps.is_cuda_step(s):
            inner = tuple(self._step(x, (*path, "steps", j), point, env)
                          for j, x in enumerate(s.get("steps", ())))
            return cudasteps.make_step(s, line, ranks, inner)
        kind = next(k for k in ("sleep", "sync", "raise", "abort", "exit", "segfault")
                    if k in s)
        return Step(kind, line, ranks=ranks, value=s[kind])

