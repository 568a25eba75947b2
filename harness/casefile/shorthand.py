"""The ``op:`` form (shorthand): one op step and its buffers at one point of the matrix.

Builds the tensors (inputs, outputs, per-rank fills), the single step (root arguments, list
entries, object buffers) and the expected values of a case written with ``op:`` instead of
``steps:``, evaluating every per-rank expression through :class:`~harness.casefile.evaluate.
CaseEval`.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..expr import parse
from ..model import Fill, Step, TensorSpec
from . import entries as list_entries
from . import opargs, pgargs
from . import sparse as sparse_layout
from .evaluate import PLAIN_ARGS, CaseEval, buffer_fill, list_shape, omitted
from .fields import parse_fill
from .returns import call_returns


class Shorthand(CaseEval):
    """The buffers, the step and the expectation of an ``op:`` case."""

    def _root_args(self, point: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
        args: dict[str, Any] = {}
        ws = point["world_size"]
        for key in ("form", "inplace"):
            if f"args.{key}" in point:
                args[key] = point[f"args.{key}"]
        for key in ("src", "dst", "group"):
            if f"args.{key}" in point:
                value = point[f"args.{key}"]
                if isinstance(value, str):
                    value = parse(value, tuple(env))(env)
                ranks = value if isinstance(value, list) else [value]
                if any(not isinstance(r, int) or r >= ws or r < 0 for r in ranks):
                    raise self.case.error(("args", key), f"{key}={value!r} is outside "
                                          f"world_size {ws}", f"ranks run 0..{ws - 1}")
                args[key] = tuple(value) if isinstance(value, list) else value
        for key in ("group_src", "group_dst"):  # positions in the group, checked by torch
            if f"args.{key}" in point:
                value = point[f"args.{key}"]
                args[key] = parse(value, tuple(env))(env) if isinstance(value, str) else value
        for key in PLAIN_ARGS:
            if key in self.raw.get("args", {}):
                args[key] = self.raw["args"][key]
        for key in pgargs.KEYS:  # the process-group methods' options
            if f"args.{key}" in point or key in self.raw.get("args", {}):
                args[key] = pgargs.case_value(self.case, key, point.get(
                    f"args.{key}", self.raw.get("args", {}).get(key)), env)
        args.update(omitted(self.op, self.raw.get("args", {}).get("omit")))
        if "splits" in self.raw.get("args", {}):
            n = len(args["group"]) if "group" in args else ws
            args["splits"] = opargs.eval_splits(self.case, self.raw["args"]["splits"], n, env,
                                          ("args", "splits"))
        return args

    def build(self, point: dict[str, Any], env: dict[str, Any]) -> tuple[
            tuple[TensorSpec, ...], tuple[Step, ...], tuple[tuple[str, Fill], ...],
            tuple[str, str] | None]:
        assert self.op is not None
        op, raw, ws = self.op, self.raw, point["world_size"]
        args = self._root_args(point, env)
        group = args.pop("group", None)
        tensors: list[TensorSpec] = []
        expected: list[tuple[str, Fill]] = []
        bufs: list[tuple[str, str]] = []
        shorthand: tuple[str, str] | None = None
        if op.in_role:
            in_obj = opargs.object_form(op, op.in_role)
            out_obj = opargs.object_form(op, op.out_role)
            init = buffer_fill(self.case, raw["input"], bool(in_obj))
            self.check_ranks(init, ws, ("input",), "input")
            # Buffers are named by role: an in-place op's one buffer after its role ("tensor"
            # for all_reduce: it holds the input and then the output), else input / output.
            in_place = op.out_role == op.in_role
            in_name = op.in_role if in_place else "input"
            out_name = in_name if in_place else "output"
            members = list(group) if group is not None else list(range(ws))
            if "entry_shape" in raw:
                return self._entries_shorthand(point, env, args, group, members, init)
            in_shape = (self._object_shape(point, env, init, in_obj) if in_obj else
                        self._input_shape(point, env, init))
            per_rank = (op.rank_shapes(in_shape, len(members), args)
                        if in_shape is not None and not in_obj else None)
            in_shapes = out_shapes = None
            if per_rank is not None:
                pos = {g: i for i, g in enumerate(members)}
                in_shapes = tuple(per_rank[pos[r]][0] if r in pos else (in_shape or ())
                                  for r in range(ws))
                out_shapes = tuple(per_rank[pos[r]][1] if r in pos else per_rank[0][1]
                                   for r in range(ws))
            sparse = sparse_layout.spec(self.case, (), raw, point["layout"],
                                        list(in_shapes or (in_shape,)))
            tensors.append(TensorSpec(in_name, in_shape, "object" if in_obj else point["dtype"],
                                      init, point["layout"], rank_shapes=in_shapes,
                                      sparse=sparse))
            bufs.append((op.in_role, in_name))
            if out_name != in_name:
                try:
                    out_shape = (op.out_shape(in_shape, len(members), args)
                                 if in_shape is not None else None)
                except ValueError as exc:
                    raise self.case.error(("shape",), str(exc)) from None
                tensors.append(TensorSpec(out_name, out_shape,
                                          "object" if out_obj else point["dtype"],
                                          Fill("poison"), point["layout"],
                                          rank_shapes=out_shapes, sparse=sparse))
                bufs.append((op.out_role, out_name))
                expected.append((in_name, Fill("unchanged")))
            exp = buffer_fill(self.case, raw.get("expected", "auto"), bool(out_obj))
            self.check_ranks(exp, ws, ("expected",), "expected")
            expected.insert(0, (out_name, exp))
            shorthand = (in_name, out_name)
        step_args = tuple(sorted(args.items()))
        if group is not None:
            step_args = (*step_args, ("group", group))
        asy = bool(point.get("async", False)) or op.name in ops.ALWAYS_ASYNC
        step = Step(kind="op", line=self.case.line, op=op.name, bufs=tuple(bufs), args=step_args,
                    ranks=tuple(group) if group is not None else None, async_op=asy,
                    call_returns=call_returns(raw.get("call_returns"), asy))
        return tuple(tensors), (step,), tuple(expected), shorthand

    def _entries_shorthand(self, point: dict[str, Any], env: dict[str, Any],
                           args: dict[str, Any], group: Any, members: list[int], init: Fill
                           ) -> tuple[tuple[TensorSpec, ...], tuple[Step, ...],
                                      tuple[tuple[str, Fill], ...], tuple[str, str]]:
        """The op: form with ``entry_shape``: list entries of different shapes."""
        assert self.op is not None
        op, ws = self.op, point["world_size"]
        in_shapes, in_entries, out_shapes, out_entries = list_entries.shorthand_layouts(
            self.case, op, env, ws, members)
        in_place = op.out_role == op.in_role  # buffers named by role, as in _shorthand
        in_name = op.in_role if in_place else "input"
        out_name = in_name if in_place else "output"
        tensors = [TensorSpec(in_name, in_shapes[0], point["dtype"], init, "contiguous",
                              rank_shapes=in_shapes, entry_shapes=in_entries)]
        bufs = [(op.in_role, in_name)]
        expected: list[tuple[str, Fill]] = []
        if out_name != in_name:
            tensors.append(TensorSpec(out_name, out_shapes[0], point["dtype"], Fill("poison"),
                                      "contiguous", rank_shapes=out_shapes,
                                      entry_shapes=out_entries))
            bufs.append((op.out_role, out_name))
            expected.append((in_name, Fill("unchanged")))
        exp = parse_fill(self.case, self.raw.get("expected", "auto"))
        self.check_ranks(exp, ws, ("expected",), "expected")
        expected.insert(0, (out_name, exp))
        step_args = tuple(sorted(args.items()))
        if group is not None:
            step_args = (*step_args, ("group", group))
        asy = bool(point.get("async", False))
        step = Step(kind="op", line=self.case.line, op=op.name, bufs=tuple(bufs),
                    args=step_args, ranks=tuple(group) if group is not None else None,
                    async_op=asy, call_returns=call_returns(self.raw.get("call_returns"), asy))
        return tuple(tensors), (step,), tuple(expected), (in_name, out_name)

    def _object_shape(self, point: dict[str, Any], env: dict[str, Any], init: Fill,
                      form: str) -> tuple[int, ...]:
        """An object buffer's "shape": (list length,) for object lists, () for one object."""
        if "shape" in self.raw:
            return self.eval_shape(self.raw["shape"], env, ("shape",))
        if form == "object":
            return ()
        lengths = {len(f.data) for r in range(point["world_size"])
                   if (f := init.for_rank(r)).kind == "list" and isinstance(f.data, list)}
        if len(lengths) > 1:
            raise self.case.error(("input",), f"per-rank object lists differ in length "
                                  f"{sorted(lengths)}", "give 'shape: [N]' for the list length")
        if lengths:
            return (lengths.pop(),)
        return (3,) if any(init.for_rank(r).kind == "generator"
                           for r in range(point["world_size"])) else (1,)

    def _input_shape(self, point: dict[str, Any], env: dict[str, Any], init: Fill
                     ) -> tuple[int, ...] | None:
        if "shape" in point:
            return self.eval_shape(point["shape"], env, ("shape",))
        if "shape" in self.raw:
            return self.eval_shape(self.raw["shape"], env, ("shape",))
        shapes = {s for r in range(point["world_size"]) if init.for_rank(r).kind == "list"
                  and (s := list_shape(init.for_rank(r).data)) is not None}
        if len(shapes) > 1:
            raise self.case.error(("input",), "per-rank inputs have different shapes "
                                  f"{sorted(shapes)}", "collectives need one shape on all ranks")
        if not shapes:
            raise self.case.error(("name",), "cannot tell the input's shape",
                                  "add 'shape: [N]' (needed with expressions and generators)")
        return shapes.pop()
