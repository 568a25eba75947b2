"""Expand a validated :class:`Case` into concrete :class:`Instance` objects.

Any of world_size, dtype, reduce_op, async, device, layout, shape, ``args`` values and
``params`` values may be a list; the cross product becomes separate instances with readable
ids such as ``gloo-ws4-bfloat16-max-async``. Axis-dependent checks (a per-rank map that does
not match the world size, a root rank outside the world) happen here, still at collection.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from .. import dtypes, ops
from ..errors import CaseFileError, ExprError, quote
from ..expr import Expr, parse
from ..model import (
    Case,
    Expectation,
    Fill,
    Instance,
    Override,
    Step,
    TensorSpec,
    Tolerance,
    pack_tensor_list,
)
from ..ordering.plan import plan_instances
from . import caseenv, cudasteps, lifecycle, opargs, pgargs
from . import entries as list_entries
from . import groups as named_groups
from . import repeat as step_repeat
from . import returns as step_returns
from . import sparse as sparse_layout
from . import workstate as work_state
from .bounds import check_instance
from .fields import as_list, expr_names, parse_fill
from .limits import Limits
from .steps import is_ordering_step, make_step

MAX_ID = 200  # test ids are printed on every line of pytest's output
DEFAULT_DEVICE = {"nccl": "cuda", "gloo": "cpu", "mpi": "cpu", "ucc": "cpu"}
# Op arguments whose list value is a matrix axis (each value its own instance).
AXIS_ARGS = ("src", "dst", "group", "form", "inplace", "group_src", "group_dst", "root_rank",
             "root_tensor")
# Op arguments passed through unchanged (``splits`` is evaluated per world size).
PLAIN_ARGS = ("tag", "timeout", "wait_all_ranks")
# ``world_size: launched``: as many ranks as the launcher gave (external-ranks mode), or
# --launched-world-size with the harness's own pools.
LAUNCHED = "launched"
DEFAULT_LAUNCHED = 4


def _is_shape_axis(shape: Any) -> bool:
    return isinstance(shape, list) and bool(shape) and all(isinstance(s, list) for s in shape)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, list):
        return ".".join(_fmt(v) for v in value)
    return str(value).replace(" ", "")


def _fill(case: Case, raw: Any, objects: bool) -> Fill:
    """A buffer's fill; object buffers hold plain data (strings stay strings)."""
    return opargs.parse_object_fill(raw) if objects else parse_fill(case, raw)


def _list_shape(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    if not value:
        return (0,)
    inner = _list_shape(value[0])
    if inner is None:
        return (len(value),)
    return (len(value), *inner)


class _Expander:
    def __init__(self, case: Case, backend: str, launched: int) -> None:
        self.case = case
        self.raw = case.raw
        self.backend = backend
        self.launched = launched
        self.op = ops.get(self.raw["op"]) if "op" in self.raw else None
        self.step_ops = [ops.get(s["op"]) for _, s in cudasteps.walk(self.raw.get("steps", []))
                         if "op" in s]
        self.all_ops = [self.op] if self.op else self.step_ops

    # -- axes ------------------------------------------------------------------------------
    def world_sizes(self) -> list[int]:
        """The world size axis, ``launched`` replaced by the launched world size.

        A listed size equal to the launched one is the same instance, not a duplicate id.
        """
        out: list[int] = []
        for v in as_list(self.raw.get("world_size", 2)):
            ws = self.launched if v == LAUNCHED else int(v)
            if ws not in out:
                out.append(ws)
        return out

    def axes(self) -> list[tuple[str, str, list[Any]]]:
        """(axis name, id prefix, values) in id order."""
        raw = self.raw
        objects_only = bool(self.all_ops) and all(
            op.roles and all(opargs.object_form(op, r.name) for r in op.roles)
            for op in self.all_ops)
        dtype_values = (["object"] if objects_only else
                        [dtypes.canonical(d) for d in as_list(raw.get("dtype", "float32"))])
        out: list[tuple[str, str, list[Any]]] = [
            ("world_size", "ws", self.world_sizes()),
            ("dtype", "", dtype_values),
        ]
        if any(o.reduces for o in self.all_ops):
            out.append(("reduce_op", "", as_list(raw.get("reduce_op", "sum"))))
        if any(o.supports_async and o.name not in ops.ALWAYS_ASYNC for o in self.all_ops):
            out.append(("async", "", as_list(raw.get("async", False))))
        out.append(("device", "", as_list(raw.get("device", "default"))))
        out.append(("layout", "", as_list(raw.get("layout", "contiguous"))))
        shape = raw.get("shape")
        if shape is not None and _is_shape_axis(shape):
            out.append(("shape", "shape", list(shape)))
        for key in AXIS_ARGS:
            value = raw.get("args", {}).get(key)
            if value is None:
                continue
            axis = value if (isinstance(value, list) and (key != "group" or isinstance(
                value[0], list))) else [value]
            out.append((f"args.{key}", "" if key == "form" else key, axis))
        for key, value in raw.get("params", {}).items():
            out.append((f"params.{key}", key, as_list(value)))
        for key, value in raw.get("env", {}).items():
            out.append((f"env.{key}", f"{key}=", caseenv.axis_values(value)))
        return out

    def program_async(self, point: dict[str, Any]) -> str | None:
        """A program's async axis, derived from its op steps at this point: ``async`` (every
        op step is async), ``sync`` (none is) or ``mixed``. None for the ``op:`` form, whose
        axis is the ``async`` flag itself. A step's own ``async:`` wins over the case's."""
        if self.op is not None:
            return None
        default = bool(point.get("async", False))
        flags = [bool(s.get("async", default)) or s["op"] in ops.ALWAYS_ASYNC
                 for s in self.raw.get("steps", []) if "op" in s]
        if flags and all(flags):
            return "async"
        return "mixed" if any(flags) else "sync"

    def id_for(self, point: dict[str, Any], axes: list[tuple[str, str, list[Any]]]) -> str:
        parts = [self.backend]
        for name, prefix, values in axes:
            v = point[name]
            if name == "async":
                parts.append(self.program_async(point) or ("async" if v else "sync"))
            elif name in ("device", "layout") and len(values) == 1 and v in ("default",
                                                                           "contiguous"):
                continue
            elif name == "args.inplace":
                parts.append("inplace" if v else "outofplace")
            elif name in ("shape",) or name.startswith(("args.", "params.", "env.")):
                if len(values) > 1 or name.startswith("args."):
                    parts.append(f"{prefix}{_fmt(v)}")
            else:
                parts.append(f"{prefix}{_fmt(v)}")
        return "-".join(parts)

    # -- one instance ----------------------------------------------------------------------
    def instance(self, point: dict[str, Any], inst_id: str) -> Instance:
        raw, case = self.raw, self.case
        ws: int = point["world_size"]
        params = {k.split(".", 1)[1]: v for k, v in point.items() if k.startswith("params.")}
        env = {"world_size": ws, **params}
        device = point["device"]
        if device == "default":
            device = DEFAULT_DEVICE.get(self.backend, "cpu")
        if self.op is not None:
            tensors, steps, expected, shorthand = self._shorthand(point, env)
        else:
            tensors, steps, expected = self._program(point, env)
            shorthand = None
        # A program without any collective (a deliberate crash, say) is filed under "steps".
        main_name, main_family = ((self.all_ops[0].name, self.all_ops[0].family)
                                  if self.all_ops else ("steps", "steps"))
        expectation = Expectation()
        if raw.get("raises"):
            r = raw["raises"]
            expectation = (Expectation("raises", match=r) if isinstance(r, str) else
                           Expectation("raises", match=r["match"],
                                       ranks=tuple(r.get("ranks", [])) or None,
                                       others=tuple(r.get("others", ("finished", "raised")))))
        elif raw.get("hangs"):
            expectation = Expectation("hangs")
        elif raw.get("crashes"):
            expectation = Expectation("crashes")
        tol = raw.get("tolerance")
        mode = self.program_async(point) if "async" in point else None
        marks = [*raw.get("marks", []), *([main_name, main_family] if self.all_ops else [])]
        return Instance(
            file=case.file, line=case.line, case=case.name, id=inst_id,
            description=case.description, backend=self.backend, device=device, world_size=ws,
            dtype=point["dtype"], op=main_name, family=main_family,
            reduce_op=point.get("reduce_op"),
            async_op=(mode in ("async", "mixed")) if mode else bool(point.get("async", False)),
            params=tuple(sorted(params.items())),
            axes=tuple((k, mode if k == "async" and mode else _jsonish(v))
                       for k, v in point.items()),
            tensors=tensors, steps=steps, expected=expected, shorthand=shorthand,
            tolerance=Tolerance.parse(tol), expectation=expectation,
            overrides=self._overrides(), deadline=raw.get("deadline"),
            # Groups a program makes are left in torch's registry of the pool's ranks (and a
            # new_group run by some ranks only shifts their group counters), and a destroyed or
            # timed-out group is unusable: a private pool, closed after the instance, keeps
            # either from reaching any later instance.
            isolate=bool(raw.get("isolate") or raw.get("hangs") or raw.get("crashes")
                         or lifecycle.needs_private_pool(raw.get("steps", []))
                         or named_groups.uses_groups(steps)),
            marks=tuple(dict.fromkeys(marks)),
            premul_factor=self._premul(raw.get("args", {}).get("premul_factor", 2.0), env,
                                       ("args", "premul_factor")),
            value_lines=self._value_lines(tensors, shorthand),
            premul_tensor=bool(raw.get("args", {}).get("premul_tensor", False)),
            env=tuple(sorted((k.split(".", 1)[1], v) for k, v in point.items()
                             if k.startswith("env."))),
            pg_timeout=float(raw["pg_timeout"]) if "pg_timeout" in raw else None,
            torch_modes=tuple(raw.get("torch_modes", ())),
            bind_device=device == "cuda" and named_groups.splits(steps),
        )

    def _key_line(self, *path: Any) -> int | None:
        """The line where the case's key at ``path`` is written (None when it is not)."""
        base = self.case.origin.get(str(path[0]))
        if base is None:
            return None
        pos = self.case.doc.key_positions.get((*base, *path[1:]))
        return pos.line if pos is not None else None

    def _value_lines(self, tensors: tuple[TensorSpec, ...],
                     shorthand: tuple[str, str] | None) -> tuple[tuple[str, int], ...]:
        out: list[tuple[str, int]] = []
        for spec in tensors:
            if shorthand is not None:
                exp = self._key_line("expected") if spec.name == shorthand[1] else None
                line = exp or self._key_line("input")
            else:
                line = (self._key_line("expected", spec.name) or self._key_line("expected")
                        or self._key_line("tensors", spec.name))
            if line is not None:
                out.append((spec.name, line))
        return tuple(out)

    def _premul(self, value: Any, env: dict[str, Any], path: tuple[Any, ...]) -> float:
        """A premul_sum factor: a number or an expression over world_size and params
        (``"1 / world_size"``), evaluated per instance."""
        if not isinstance(value, str):
            return float(value)
        try:
            result = parse(value, tuple(env))(env)
        except (ExprError, KeyError, ZeroDivisionError) as exc:
            raise self.case.error(path, f"bad premul_factor expression {value!r}: {exc}",
                                  "use numbers, world_size and params, e.g. "
                                  "\"1 / world_size\"") from None
        if isinstance(result, bool) or not isinstance(result, int | float):
            raise self.case.error(path, f"premul_factor {value!r} gives {result!r}, not a "
                                  "number")
        return float(result)

    def _eval_shape(self, shape: list[Any], env: dict[str, Any], path: tuple[Any, ...]
                    ) -> tuple[int, ...]:
        out: list[int] = []
        for i, dim in enumerate(shape):
            if isinstance(dim, str):
                try:
                    dim = parse(dim, tuple(env))(env)
                except (ExprError, KeyError) as exc:
                    raise self.case.error((*path, i), f"bad shape expression: {exc}") from None
            if not isinstance(dim, int) or dim < 0:
                raise self.case.error((*path, i), f"shape entries must be whole numbers >= 0, "
                                      f"got {dim!r}")
            out.append(dim)
        return tuple(out)

    def _check_ranks(self, fill: Fill, ws: int, path: tuple[Any, ...], what: str) -> None:
        if fill.kind != "per_rank":
            return
        keys = fill.data
        bad = sorted(k for k in keys if k != "others" and int(k) >= ws)
        if bad:
            raise self.case.error(path, f"{what} names rank {bad[0]} but world_size is {ws}",
                                  f"ranks run 0..{ws - 1}; limit world_size or drop rank {bad[0]}")
        missing = [r for r in range(ws) if r not in keys]
        if missing and "others" not in keys:
            raise self.case.error(path, f"{what} gives no value for rank(s) "
                                  f"{', '.join(map(str, missing))} at world_size {ws}",
                                  "add them, or an 'others:' entry")

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
        args.update(_omitted(self.op, self.raw.get("args", {}).get("omit")))
        if "splits" in self.raw.get("args", {}):
            n = len(args["group"]) if "group" in args else ws
            args["splits"] = opargs.eval_splits(self.case, self.raw["args"]["splits"], n, env,
                                          ("args", "splits"))
        return args

    def _shorthand(self, point: dict[str, Any], env: dict[str, Any]) -> tuple[
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
            init = _fill(self.case, raw["input"], bool(in_obj))
            self._check_ranks(init, ws, ("input",), "input")
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
            exp = _fill(self.case, raw.get("expected", "auto"), bool(out_obj))
            self._check_ranks(exp, ws, ("expected",), "expected")
            expected.insert(0, (out_name, exp))
            shorthand = (in_name, out_name)
        step_args = tuple(sorted(args.items()))
        if group is not None:
            step_args = (*step_args, ("group", group))
        step = Step(kind="op", line=self.case.line, op=op.name, bufs=tuple(bufs), args=step_args,
                    ranks=tuple(group) if group is not None else None,
                    async_op=bool(point.get("async", False)) or op.name in ops.ALWAYS_ASYNC)
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
        self._check_ranks(exp, ws, ("expected",), "expected")
        expected.insert(0, (out_name, exp))
        step_args = tuple(sorted(args.items()))
        if group is not None:
            step_args = (*step_args, ("group", group))
        step = Step(kind="op", line=self.case.line, op=op.name, bufs=tuple(bufs),
                    args=step_args, ranks=tuple(group) if group is not None else None,
                    async_op=bool(point.get("async", False)))
        return tuple(tensors), (step,), tuple(expected), (in_name, out_name)

    def _object_shape(self, point: dict[str, Any], env: dict[str, Any], init: Fill,
                      form: str) -> tuple[int, ...]:
        """An object buffer's "shape": (list length,) for object lists, () for one object."""
        if "shape" in self.raw:
            return self._eval_shape(self.raw["shape"], env, ("shape",))
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
            return self._eval_shape(point["shape"], env, ("shape",))
        if "shape" in self.raw:
            return self._eval_shape(self.raw["shape"], env, ("shape",))
        shapes = {s for r in range(point["world_size"]) if init.for_rank(r).kind == "list"
                  and (s := _list_shape(init.for_rank(r).data)) is not None}
        if len(shapes) > 1:
            raise self.case.error(("input",), "per-rank inputs have different shapes "
                                  f"{sorted(shapes)}", "collectives need one shape on all ranks")
        if not shapes:
            raise self.case.error(("name",), "cannot tell the input's shape",
                                  "add 'shape: [N]' (needed with expressions and generators)")
        return shapes.pop()

    def _program(self, point: dict[str, Any], env: dict[str, Any]) -> tuple[
            tuple[TensorSpec, ...], tuple[Step, ...], tuple[tuple[str, Fill], ...]]:
        raw, ws = self.raw, point["world_size"]
        tensors: list[TensorSpec] = []
        for name, spec in raw.get("tensors", {}).items():
            is_obj = spec.get("dtype") == "object"
            init = _fill(self.case, spec["init"], bool(is_obj))
            self._check_ranks(init, ws, ("tensors", name, "init"), f"tensors.{name}.init")
            shape, rank_shapes = None, None
            entry_shapes: tuple[tuple[tuple[int, ...], ...] | None, ...] | None = None
            if "entries" in spec:
                rank_shapes, entry_shapes = list_entries.tensor_layouts(self.case, name, spec,
                                                                        env, ws)
                shape = rank_shapes[0]
            elif "shape" in spec:
                spath = ("tensors", name, "shape")
                if opargs.uses_rank(spec["shape"]):
                    rank_shapes = tuple(self._eval_shape(spec["shape"], {**env, "rank": r}, spath)
                                        for r in range(ws))
                    shape = rank_shapes[0]
                else:
                    shape = self._eval_shape(spec["shape"], env, spath)
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
            self._check_ranks(fill, ws, ("expected", tname), f"expected.{tname}")
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
            bufs = tuple((role.name, s[role.name] if isinstance(s[role.name], str)
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
            args += sorted(_omitted(op, s.get("omit")).items())
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
                args.append(("group", _group_arg(s["group"])))
            if "group_timeout" in s:
                args.append(("group_timeout", float(s["group_timeout"])))
            # A step's own reduce op (and premul factor) wins over the case's axis.
            if "reduce_op" in s:
                args.append(("reduce_op", s["reduce_op"]))
            if "premul_factor" in s:
                args.append(("premul_factor", self._premul(s["premul_factor"], env,
                                                           (*path, "premul_factor"))))
            asy = (s.get("async", bool(point.get("async", False)))
                   or op.name in ops.ALWAYS_ASYNC)
            rets = (step_returns.per_rank(self.case, s["returns"], ws, (*path, "returns"))
                    if "returns" in s else None)
            return Step("op", line, op=op.name, bufs=bufs, args=tuple(args),
                        ranks=ranks, async_op=asy, handle=s.get("handle"),
                        stream=s.get("stream", "current"), returns=rets,
                        repeat=int(s.get("repeat", 1)),
                        slices=bool(s.get("slices", False)),
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
                (("group", _group_arg(s["group"])),) if "group" in s else ())
            if "group_timeout" in s:
                group_args = (*group_args, ("group_timeout", float(s["group_timeout"])))
            return Step(kind, line, ranks=ranks, args=group_args,
                        value=float(s[kind]) if kind == "set_timeout" else None,
                        **lifecycle.step_fields(s))
        if "new_group" in s:
            return named_groups.make_step(s, line, ranks, names)
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

    def _overrides(self) -> tuple[Override, ...]:
        out: list[Override] = []
        for i, o in enumerate(self.raw.get("overrides", [])):
            when = o.get("when", {})
            conds = tuple(sorted((k, tuple(as_list(v))) for k, v in when.items()
                                 if k not in ("torch", "nccl", "params", "args")))
            conds += tuple((f"params.{k}", tuple(as_list(v)))
                           for k, v in when.get("params", {}).items())
            conds += tuple((f"args.{k}", tuple(as_list(v)))
                           for k, v in when.get("args", {}).items())
            patch = tuple((k, v) for k, v in o.items() if k not in ("when", "reason", "issue"))
            line = self.case.doc.pos((*self.case.origin["overrides"], i)).line
            for key in ("torch", "nccl"):
                if key in when:
                    self._check_specifier(("overrides", i, "when", key), key, when[key])
            out.append(Override(conds, when.get("torch", ""), patch, o["reason"],
                                o.get("issue", ""), line, nccl=when.get("nccl", "")))
        return tuple(out)


    def _check_specifier(self, path: tuple[str | int, ...], key: str, spec: str) -> None:
        # Checked here, not when the override is resolved, so a bad scope fails collection at
        # its line on every machine instead of tracing back on the one whose version it reaches.
        try:
            SpecifierSet(spec, prereleases=True)
        except InvalidSpecifier:
            raise self.case.error(path, f"when.{key} {quote(spec)} is not a version specifier; "
                                  f"write e.g. \">=2.5,<2.8\" (PEP 440)") from None


def expand_all(cases: list[Case], backend: str, limits: Limits | None = None, *,
               launched: int = DEFAULT_LAUNCHED) -> list[Instance]:
    """The instances of every case of one file, the per-file limit checked before each case
    is built."""
    out: list[Instance] = []
    for case in cases:
        out += expand(case, backend, limits, len(out), launched=launched)
    return out


def _group_arg(group: Any) -> str | tuple[int, ...]:
    """A step's ``group``: a list of ranks, or the name a new_group step gave its group."""
    return group if isinstance(group, str) else tuple(group)


def _omitted(op: ops.Op | None, names: list[str] | None) -> dict[str, Any]:
    """Step arguments for ``omit:``: the names (not passed to torch) and, for a root, the
    default torch documents, which the harness's own bookkeeping uses."""
    if not names or op is None:
        return {}
    defaults = dict(op.defaults)
    out: dict[str, Any] = {k: defaults[k] for k in names if k in ("src", "dst")}
    out["omit"] = tuple(names)
    return out


def _jsonish(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _deadline(case: Case, limits: Limits) -> float | None:
    """The case's own deadline, capped by the operator's (a case may lower, never exceed it)."""
    value = case.raw.get("deadline")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise case.error(("deadline",), f"deadline {value!r} must be a positive number of "
                         "seconds")
    return float(min(value, limits.deadline))


def expand(case: Case, backend: str, limits: Limits | None = None, before: int = 0, *,
           launched: int = DEFAULT_LAUNCHED) -> list[Instance]:
    """All instances of ``case`` for ``backend``; raises CaseFileError on axis conflicts and
    on anything beyond the operator's ``limits`` (``before``: instances the file's earlier
    cases already expanded to, so the per-file limit holds before anything is built).

    ``launched`` is what ``world_size: launched`` means: the launched world size in
    external-ranks mode, ``--launched-world-size`` (default 4) with the harness's own pools.
    """
    lim = limits or Limits()
    if "backends" in case.raw and backend not in case.raw["backends"]:
        return []
    ex = _Expander(case, backend, launched)
    axes = ex.axes()
    for name, _, axis_values in axes:
        if not axis_values:  # an empty list would silently make no instance at all
            raise case.error(tuple(name.split(".")), f"{name} lists no values",
                             "give at least one value")
    count = math.prod(len(v) for _, _, v in axes)
    if before + count > lim.instances_per_file:
        so_far = f" (after {before} from earlier cases)" if before else ""
        raise case.error(("name",), f"the case expands to {count} instances{so_far}; a case "
                         f"file may have at most {lim.instances_per_file}",
                         "list fewer axis values, or raise --max-instances-per-file / ini "
                         "collective_max_instances_per_file")
    for ws in next(v for name, _, v in axes if name == "world_size"):
        if ws > lim.world_size:  # before any instance is built: some checks loop over ranks
            raise case.error(("world_size",), f"world_size {ws} is above this session's limit "
                             f"of {lim.world_size}", "raise it with --max-world-size / ini "
                             "collective_max_world_size")
    deadline = _deadline(case, lim)
    out: list[Instance] = []
    seen: set[str] = set()
    for values in itertools.product(*(v for _, _, v in axes)):
        point = {name: v for (name, _, _), v in zip(axes, values, strict=True)}
        inst_id = ex.id_for(point, axes)
        if len(inst_id) > MAX_ID:
            raise case.error(("name",), f"instance id {quote(inst_id, 80)} is longer than "
                             f"{MAX_ID} characters", "use short param values")
        if not inst_id.isprintable() or any(c.isspace() or c in "[]:" for c in inst_id):
            raise case.error(("name",), f"instance id {quote(inst_id, 80)} holds a space, a "
                             "line break, '[', ']' or ':'", "use plain param values")
        if inst_id in seen:
            raise case.error(("name",), f"two points of the matrix get the same id {inst_id!r}",
                             "an axis lists the same value twice")
        seen.add(inst_id)
        try:
            inst = ex.instance(point, inst_id)
        except ExprError as exc:
            raise case.error(("name",), f"at {inst_id}: {exc}") from None
        check_instance(case, inst, lim)
        out.append(dataclasses.replace(inst, deadline=deadline))
    return plan_instances(case.raw.get("ordering", "sample"), out)


__all__ = ["CaseFileError", "expand"]
