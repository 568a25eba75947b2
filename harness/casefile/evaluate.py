"""Per-rank evaluation of one case's expressions at one point of its matrix.

Shapes, premul_sum factors, rank maps and the YAML lines of expectations are evaluated here,
at collection, for every world size the matrix reaches: an expression that fails, or a rank
map that does not fit the world, is a ``file:line:col`` error before anything runs. The two
builders of an instance's buffers and steps (:mod:`~harness.casefile.shorthand` for the
``op:`` form, :mod:`~harness.casefile.programs` for ``steps:``) share this base.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..errors import ExprError
from ..expr import parse
from ..model import Case, Fill, TensorSpec
from . import opargs
from .fields import parse_fill

# Op arguments passed through unchanged (``splits`` is evaluated per world size).
PLAIN_ARGS = ("tag", "timeout", "wait_all_ranks")


def buffer_fill(case: Case, raw: Any, objects: bool) -> Fill:
    """A buffer's fill; object buffers hold plain data (strings stay strings)."""
    return opargs.parse_object_fill(raw) if objects else parse_fill(case, raw)


def list_shape(value: Any) -> tuple[int, ...] | None:
    """The shape of a nested list literal (None for a scalar)."""
    if not isinstance(value, list):
        return None
    if not value:
        return (0,)
    inner = list_shape(value[0])
    if inner is None:
        return (len(value),)
    return (len(value), *inner)


def group_arg(group: Any) -> str | tuple[int, ...]:
    """A step's ``group``: a list of ranks, or the name a new_group step gave its group."""
    return group if isinstance(group, str) else tuple(group)


def omitted(op: ops.Op | None, names: list[str] | None) -> dict[str, Any]:
    """Step arguments for ``omit:``: the names (not passed to torch) and, for a root, the
    default torch documents, which the harness's own bookkeeping uses."""
    if not names or op is None:
        return {}
    defaults = dict(op.defaults)
    out: dict[str, Any] = {k: defaults[k] for k in names if k in ("src", "dst")}
    out["omit"] = tuple(names)
    return out


class CaseEval:
    """One case's expressions, evaluated per world size and rank."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.raw = case.raw
        self.op = ops.get(self.raw["op"]) if "op" in self.raw else None

    def key_line(self, *path: Any) -> int | None:
        """The line where the case's key at ``path`` is written (None when it is not)."""
        base = self.case.origin.get(str(path[0]))
        if base is None:
            return None
        pos = self.case.doc.key_positions.get((*base, *path[1:]))
        return pos.line if pos is not None else None

    def value_lines(self, tensors: tuple[TensorSpec, ...],
                     shorthand: tuple[str, str] | None) -> tuple[tuple[str, int], ...]:
        out: list[tuple[str, int]] = []
        for spec in tensors:
            if shorthand is not None:
                exp = self.key_line("expected") if spec.name == shorthand[1] else None
                line = exp or self.key_line("input")
            else:
                line = (self.key_line("expected", spec.name) or self.key_line("expected")
                        or self.key_line("tensors", spec.name))
            if line is not None:
                out.append((spec.name, line))
        return tuple(out)

    def premul(self, value: Any, env: dict[str, Any], path: tuple[Any, ...]) -> float:
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

    def eval_shape(self, shape: list[Any], env: dict[str, Any], path: tuple[Any, ...]
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

    def check_ranks(self, fill: Fill, ws: int, path: tuple[Any, ...], what: str,
                    excused: frozenset[int] = frozenset()) -> None:
        """A per-rank fill names ranks of the world only, and every rank (but the ``excused``:
        ranks a program kills by design, which are never compared)."""
        if fill.kind != "per_rank":
            return
        keys = fill.data
        bad = sorted(k for k in keys if k != "others" and int(k) >= ws)
        if bad:
            raise self.case.error(path, f"{what} names rank {bad[0]} but world_size is {ws}",
                                  f"ranks run 0..{ws - 1}; limit world_size or drop rank {bad[0]}")
        missing = [r for r in range(ws) if r not in keys and r not in excused]
        if missing and "others" not in keys:
            raise self.case.error(path, f"{what} gives no value for rank(s) "
                                  f"{', '.join(map(str, missing))} at world_size {ws}",
                                  "add them, or an 'others:' entry")
