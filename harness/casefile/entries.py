"""List buffers whose entries differ in shape (``entry_shape``): checks and expansion.

The collectives that take lists (all_gather, gather, scatter, reduce_scatter, all_to_all and
the in-place coalesced ops) accept entries of different sizes: upstream's all_gather_v and
reduce_scatter_v. A case states the shape of entry ``j`` as a list of dimensions, each an
integer or an expression over ``j`` (the group position the entry belongs to), ``world_size``
and the params; for ``all_to_all`` also over ``rank``, the group position of the sender
(``entry_shape`` is then the shape of the chunk member ``rank`` sends to member ``j``). The op
table says which buffer gets which entries (:meth:`harness.ops.base.Op.entry_layouts`).

In the steps form a tensor declares ``entries: N`` and ``entry_shape: [...]`` (over ``j``,
``rank`` (the rank holding the buffer), ``world_size`` and params) instead of ``shape``.
Such a buffer is stored as one flat tensor; see :class:`harness.model.TensorSpec`.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..errors import CaseFileError, CaseFileErrors, ExprError
from ..expr import parse
from ..model import Case
from ..ops.base import Layout
from .fields import expr_names

Path = tuple[Any, ...]
Shape = tuple[int, ...]
ENTRY_NAMES = ("j",)
# Entries of one list buffer: each is a tensor object on every rank (and a shape evaluated at
# collection), so the count is bounded before anything is built, as shapes are by bytes.
MAX_ENTRIES = 65_536


def _errors(case: Case, raw: dict[str, Any], path: Path, allow_rank: bool) -> list[CaseFileError]:
    errs: list[CaseFileError] = []
    names = (*expr_names(case), *ENTRY_NAMES)
    if not allow_rank:
        names = tuple(n for n in names if n != "rank")
    for i, dim in enumerate(raw.get("entry_shape", [])):
        if isinstance(dim, str):
            try:
                parse(dim, names)
            except ExprError as exc:
                hint = ("only all_to_all's entry shapes may depend on 'rank' (the sender)"
                        if "rank" in dim and not allow_rank else
                        "use j (the entry's group position), world_size and params")
                errs.append(case.error((*path, "entry_shape", i),
                                       f"bad entry_shape expression {dim!r}: {exc}", hint))
    if "shape" in raw:
        errs.append(case.error((*path, "shape"), "'shape' and 'entry_shape' cannot both be given",
                               "with entry_shape every entry's shape comes from it"))
    layout = raw.get("layout", "contiguous")
    if layout != "contiguous":
        errs.append(case.error((*path, "layout"), "a buffer with per-entry shapes is contiguous",
                               f"drop layout {layout!r} (entries are views of one flat buffer)"))
    return errs


def check_case(case: Case) -> None:
    """Check ``entry_shape``/``entries`` of the shorthand form (op: ...)."""
    raw = case.raw
    if "entry_shape" not in raw:
        if "entries" in raw:
            raise CaseFileErrors([case.error(("entries",), "'entries' needs 'entry_shape'",
                                             "give entry j's shape: entry_shape: [\"j + 1\"]")])
        return
    if "op" not in raw or raw["op"] not in ops.ALL_OPS:
        raise CaseFileErrors([case.error(("entry_shape",), "'entry_shape' belongs to the op: "
                                         "form", "in steps, give tensors 'entries' and "
                                         "'entry_shape'")])
    op = ops.get(raw["op"])
    errs: list[CaseFileError] = []
    if not op.takes_entry_shape:
        takes = sorted(o.name for o in ops.ALL_OPS.values() if o.takes_entry_shape)
        errs.append(case.error(("entry_shape",), f"op {op.name} has no list buffer whose "
                               "entries may differ in shape", "ops that take entry_shape: " +
                               ", ".join(takes)))
    if "entries" in raw and not op.entry_count_free:
        errs.append(case.error(("entries",), f"op {op.name}'s lists have one entry per group "
                               "member", "drop 'entries'"))
    errs.extend(_errors(case, raw, (), allow_rank=op.entries_per_sender))
    if errs:
        raise CaseFileErrors(errs)


def check_tensor(case: Case, name: str, spec: dict[str, Any]) -> list[CaseFileError]:
    """Check a steps-form tensor's ``entries``/``entry_shape``."""
    path: Path = ("tensors", name)
    if ("entries" in spec) != ("entry_shape" in spec):
        return [case.error(path, f"tensor {name} needs both 'entries' and 'entry_shape'",
                           "entries: N (how many list entries), entry_shape: [\"j + 1\"]")]
    if "entries" not in spec:
        return []
    errs = _errors(case, spec, path, allow_rank=True)
    if isinstance(spec["entries"], str):
        try:
            parse(spec["entries"], expr_names(case))
        except ExprError as exc:
            errs.append(case.error((*path, "entries"), f"bad expression: {exc}"))
    if spec.get("dtype") == "object":
        errs.append(case.error((*path, "entries"), "object buffers have no tensor entries"))
    return errs


def _dims(case: Case, dims: list[Any], env: dict[str, Any], path: Path) -> Shape:
    out: list[int] = []
    for i, dim in enumerate(dims):
        value = dim
        if isinstance(dim, str):
            try:
                value = parse(dim, tuple(env))(env)
            except (ExprError, KeyError, ZeroDivisionError) as exc:
                raise case.error((*path, i), f"bad entry_shape expression {dim!r}: "
                                 f"{exc}") from None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise case.error((*path, i), f"entry_shape entries must be whole numbers >= 0, "
                             f"got {value!r} for j={env.get('j')}")
        out.append(value)
    return tuple(out)


def _count(case: Case, value: Any, env: dict[str, Any], path: Path) -> int:
    if isinstance(value, str):
        try:
            value = parse(value, tuple(env))(env)
        except (ExprError, KeyError, ZeroDivisionError) as exc:
            raise case.error(path, f"bad expression {value!r}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise case.error(path, f"entries must be a whole number >= 0, got {value!r}")
    if value > MAX_ENTRIES:
        raise case.error(path, f"entries {value:,} is more than the {MAX_ENTRIES:,} one list "
                         "buffer may have", "give fewer entries")
    return value


def _numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shorthand_layouts(case: Case, op: ops.Op, env: dict[str, Any], ws: int,
                      members: list[int]) -> tuple[
        tuple[Shape, ...], tuple[tuple[Shape, ...] | None, ...],
        tuple[Shape, ...], tuple[tuple[Shape, ...] | None, ...]]:
    """Per global rank: input (shape, entries), output (shape, entries) of an op: case.

    A buffer with entries has the flat shape ``(total elements,)``. Ranks outside the group
    get member 0's layouts (their buffers are never handed to the op).
    """
    raw = case.raw

    def entry(s: int, j: int) -> Shape:
        return _dims(case, raw["entry_shape"], {**env, "rank": s, "j": j}, ("entry_shape",))

    count = (_count(case, raw["entries"], env, ("entries",)) if "entries" in raw else None)
    layouts = op.entry_layouts(entry, len(members), count)
    assert layouts is not None  # validation rejected ops without list entries
    pos = {g: i for i, g in enumerate(members)}

    def split(layout: Layout) -> tuple[Shape, tuple[Shape, ...] | None]:
        if isinstance(layout, list):
            return (sum(_numel(s) for s in layout),), tuple(layout)
        return layout, None

    per = [(split(layouts[pos.get(r, 0)][0]), split(layouts[pos.get(r, 0)][1]))
           for r in range(ws)]
    return (tuple(p[0][0] for p in per), tuple(p[0][1] for p in per),
            tuple(p[1][0] for p in per), tuple(p[1][1] for p in per))


def tensor_layouts(case: Case, name: str, spec: dict[str, Any], env: dict[str, Any], ws: int
                   ) -> tuple[tuple[Shape, ...], tuple[tuple[Shape, ...] | None, ...]]:
    """Per rank: a steps-form tensor's flat shape and its entry shapes."""
    path: Path = ("tensors", name)
    shapes: list[Shape] = []
    entries: list[tuple[Shape, ...] | None] = []
    for r in range(ws):
        renv = {**env, "rank": r}
        n = _count(case, spec["entries"], renv, (*path, "entries"))
        mine = tuple(_dims(case, spec["entry_shape"], {**renv, "j": j}, (*path, "entry_shape"))
                     for j in range(n))
        shapes.append((sum(_numel(s) for s in mine),))
        entries.append(mine)
    return tuple(shapes), tuple(entries)
