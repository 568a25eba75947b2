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

from .. import dtypes, ops
from ..errors import CaseFileError, ExprError, quote
from ..model import (
    Case,
    Expectation,
    Instance,
    Step,
    Tolerance,
)
from ..ordering.plan import plan_instances
from . import caseenv, coverage, deaths, lifecycle, numerics, opargs, scramble, stepkinds, tables
from . import groups as named_groups
from . import overrides as case_overrides
from .bounds import check_instance
from .evaluate import CaseEval
from .fields import as_list
from .limits import Limits
from .programs import ProgramBuilder
from .shorthand import Shorthand

MAX_ID = 200  # test ids are printed on every line of pytest's output
DEFAULT_DEVICE = {"nccl": "cuda", "gloo": "cpu", "mpi": "cpu", "ucc": "cpu"}
# Op arguments whose list value is a matrix axis (each value its own instance).
AXIS_ARGS = ("src", "dst", "group", "form", "inplace", "group_src", "group_dst", "root_rank",
             "root_tensor")
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


class _Expander:
    def __init__(self, case: Case, backend: str, launched: int) -> None:
        self.case = case
        self.raw = case.raw
        self.backend = backend
        self.launched = launched
        self.op = ops.get(self.raw["op"]) if "op" in self.raw else None
        self.step_ops = [ops.get(s["op"]) for _, s in stepkinds.walk(self.raw.get("steps", []))
                         if "op" in s]
        self.all_ops = [self.op] if self.op else self.step_ops
        # What depends on the case alone, built once for all its instances (not per instance:
        # the bundled suite's 9,000 instances rebuilt them a fifth of collection's time).
        self._per_case: tuple[tuple[Any, ...], tuple[tuple[str, str], ...]] | None = None

    def per_case(self) -> tuple[tuple[Any, ...], tuple[tuple[str, str], ...]]:
        """The case's overrides and its unchecked buffers (the first instance builds them, so
        a bad override scope fails where it did)."""
        if self._per_case is None:
            self._per_case = (case_overrides.build(self.case), coverage.unchecked(self.raw))
        return self._per_case

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
        if self._case_reduce_op_applies():
            out.append(("reduce_op", "", as_list(raw.get("reduce_op", "sum"))))
        if any(o.supports_async and o.name not in ops.ALWAYS_ASYNC for o in self.all_ops):
            out.append(("async", "", as_list(raw.get("async", False))))
        elif self.op is None and self.all_ops:
            # A program of point-to-point (always async) or sync-only ops still says which it
            # is in its id; the case's ``async:`` cannot change it, so the axis has one value.
            out.append(("async", "", [False]))
        out.append(("device", "", as_list(raw.get("device", "default"))))
        out.append(("layout", "", as_list(raw.get("layout", "contiguous"))))
        if "offset" in raw:  # misaligned buffers (harness.casefile.numerics)
            out.append(("offset", "off", as_list(raw["offset"])))
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

    def _case_reduce_op_applies(self) -> bool:
        """Whether the case-level reduce op reaches any call: not when every reducing step of a
        program names its own (the id would then name an op no call uses)."""
        if self.op is not None:
            return self.op.reduces
        reducing = [s for _, s in stepkinds.walk(self.raw.get("steps", []))
                    if "op" in s and ops.get(s["op"]).reduces]
        return any("reduce_op" not in s for s in reducing)

    def raise_ranks(self, given: Any, env: dict[str, Any], steps: tuple[Step, ...]
                    ) -> tuple[int, ...] | None:
        """The case's ``raises: {ranks: [...]}`` at this point (expressions evaluated)."""
        try:
            return case_overrides.raise_ranks(given, case_overrides.rank_env(
                env["world_size"], {k: v for k, v in env.items() if k != "world_size"}, steps))
        except ExprError as exc:
            raise self.case.error(("raises", "ranks"), f"bad raises rank: {exc}",
                                  "give ranks, or expressions over world_size, params and "
                                  "the op's src or dst") from None

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
    def instance(self, point: dict[str, Any], inst_id: str,
                 deadline: float | None = None) -> Instance:
        raw, case = self.raw, self.case
        overrides, unchecked = self.per_case()
        ws: int = point["world_size"]
        params = {**tables.as_env(case),
                  **{k.split(".", 1)[1]: v for k, v in point.items() if k.startswith("params.")}}
        env = {"world_size": ws, **params}
        device = point["device"]
        if device == "default":
            device = DEFAULT_DEVICE.get(self.backend, "cpu")
        if self.op is not None:
            tensors, steps, expected, shorthand = Shorthand(case).build(point, env)
        else:
            tensors, steps, expected = ProgramBuilder(case).build(point, env)
            shorthand = None
        tensors = numerics.with_offset(case, tensors, int(point.get("offset", 0)))
        if "guard" in raw:
            tensors = tuple(dataclasses.replace(t, guard=int(raw["guard"])) for t in tensors)
        if "scramble" in raw:
            steps = scramble.apply(case, steps, ws, int(raw["scramble"]))
        # A program without any collective (a deliberate crash, say) is filed under "steps".
        main_name, main_family = ((self.all_ops[0].name, self.all_ops[0].family)
                                  if self.all_ops else ("steps", "steps"))
        issued = tuple(dict.fromkeys((o.name, o.family) for o in self.all_ops))
        expectation = Expectation()
        if raw.get("raises"):
            r = raw["raises"]
            expectation = (Expectation("raises", match=r) if isinstance(r, str) else
                           Expectation("raises", match=r["match"],
                                       ranks=self.raise_ranks(r.get("ranks"), env, steps),
                                       others=tuple(r.get("others", ("finished", "raised")))))
        elif raw.get("hangs"):
            expectation = Expectation("hangs")
        elif raw.get("crashes"):
            expectation = Expectation("crashes")
        tol = raw.get("tolerance")
        mode = self.program_async(point) if "async" in point else None
        evaluated = CaseEval(case)
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
            overrides=overrides, deadline=deadline,
            # Groups a program makes are left in torch's registry of the pool's ranks (and a
            # new_group run by some ranks only shifts their group counters), and a destroyed or
            # timed-out group is unusable: a private pool, closed after the instance, keeps
            # either from reaching any later instance.
            isolate=bool(raw.get("isolate") or raw.get("hangs") or raw.get("crashes")
                         or any(s.kind in (*deaths.DEATHS, *deaths.RECOVERY) for s in steps)
                         or lifecycle.needs_private_pool(raw.get("steps", []))
                         or named_groups.uses_groups(steps)),
            marks=tuple(dict.fromkeys(marks)),
            premul_factor=evaluated.premul(raw.get("args", {}).get("premul_factor", 2.0), env,
                                           ("args", "premul_factor")),
            value_lines=evaluated.value_lines(tensors, shorthand),
            premul_tensor=bool(raw.get("args", {}).get("premul_tensor", False)),
            env=tuple(sorted((k.split(".", 1)[1], v) for k, v in point.items()
                             if k.startswith("env."))),
            pg_timeout=float(raw["pg_timeout"]) if "pg_timeout" in raw else None,
            torch_modes=tuple(raw.get("torch_modes", ())),
            bind_device=device == "cuda" and named_groups.splits(steps),
            issued=issued if len(issued) > 1 else (),
            numerics=numerics.plan(case, steps, tensors),
            unchecked=unchecked,
            deaths=deaths.plan(case, steps, ws, env),
        )


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
            inst = ex.instance(point, inst_id, deadline)
        except ExprError as exc:
            raise case.error(("name",), f"at {inst_id}: {exc}") from None
        check_instance(case, inst, lim)
        out.append(inst)
    return plan_instances(case.raw.get("ordering", "sample"), out)


__all__ = ["CaseFileError", "expand"]
