"""The numerics keys of a case: ``error``, ``deterministic``, ``offset``, ``offset_invariant``,
``fusion_invariant``, ``size_invariant``, ``same_bits`` (docs/howto/numerics.md).

:func:`check` finds what the schema cannot (non-finite bounds, properties with nothing to
compare, an offset on a layout it cannot apply to); :func:`plan` turns the keys into the
instance's :class:`~harness.model.NumericsPlan` once its buffers are known, and
:func:`with_offset` places its buffers at the point's offset.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from .. import ops
from ..errors import CaseFileError
from ..model import Case, Instance, NumericsPlan, Step, TensorSpec
from .evaluate import CaseEval

BOUNDS = ("max_abs", "max_rel", "rel_l2", "max_ulps")
PROPERTIES = ("error", "deterministic", "iterations", "offset_invariant", "fusion_invariant",
              "size_invariant", "same_bits")
# Ops whose output element i depends only on the inputs' element i (size_invariant).
ELEMENTWISE = tuple(op.name for op in ops.ALL_OPS.values() if op.elementwise)
# Generators whose first n values (bits included) do not depend on how many they make;
# nan_inf's NaN bits in bfloat16 do (tests/test_numerics.py).
PREFIX_STABLE = ("random", "exact", "ranks", "constant")
# Coalesced ops and the plain op their entries are issued with one by one (fusion_invariant).
UNFUSED = {op.name: op.unfused for op in ops.ALL_OPS.values() if op.unfused}


def _asked(raw: dict[str, Any]) -> list[str]:
    """The properties the case requires (``deterministic: 1`` and false flags ask nothing)."""
    out = [k for k in ("error", "offset_invariant", "fusion_invariant", "size_invariant",
                       "same_bits") if raw.get(k)]
    out += [k for k in ("deterministic", "iterations") if raw.get(k, 1) != 1]
    return out


def check(case: Case) -> list[CaseFileError]:
    """Errors in the case's numerics keys, each at its own ``file:line:col``."""
    raw = case.raw
    errs: list[CaseFileError] = []
    for key, value in (raw.get("error") or {}).items():
        if isinstance(value, float) and not math.isfinite(value):
            errs.append(case.error(("error", key), f"error bound {key} must be a finite number "
                                   f">= 0, got {value!r}",
                                   "an infinite bound accepts any value; leave the key out "
                                   "to set no bound"))
    offsets = raw.get("offset", 0)
    nonzero = any(offsets) if isinstance(offsets, list) else bool(offsets)
    if nonzero:
        layouts = raw.get("layout", "contiguous")
        if any(lay != "contiguous" for lay in (layouts if isinstance(layouts, list)
                                              else [layouts])):
            errs.append(case.error(("offset",), "offset applies to contiguous buffers; this "
                                   f"case's layout is {layouts!r}",
                                   "drop layout, or test the offset in a case of its own"))
    if raw.get("offset_invariant") and not nonzero:
        errs.append(case.error(("offset_invariant",), "offset_invariant compares the outputs at "
                               "the buffer offset with those at offset 0, but the case has no "
                               "non-zero offset", "add offset: [1, 3] (elements)"))
    asked = _asked(raw)
    op = ops.get(raw["op"]) if isinstance(raw.get("op"), str) and raw["op"] in ops.ALL_OPS else None
    if asked and op is not None and not op.roles:
        errs.append(case.error((asked[0],), f"{asked[0]} needs an output to compare, and "
                               f"{op.name} produces none", "remove the key from this case"))
    if asked and "steps" in raw and not raw.get("tensors"):
        errs.append(case.error((asked[0],), f"{asked[0]} needs an output to compare, and the "
                               "program declares no tensors", "remove the key from this case"))
    if raw.get("iterations", 1) != 1 and (op is None or raw.get("expected", "auto") != "auto"):
        errs.append(case.error(("iterations",), "iterations reseeds the inputs, so it needs "
                               "the op: form with expected: auto (the reference model "
                               "computes each iteration's expected values)",
                               "remove the key, or let the harness compute expected"))
    if raw.get("fusion_invariant") and (op is None or op.name not in UNFUSED
                                        or "entry_shape" in raw):
        errs.append(case.error(("fusion_invariant",), "fusion_invariant compares a coalesced "
                               "op with its entries issued one by one; it applies to the "
                               f"{' and '.join(UNFUSED)} ops with one shape for every entry",
                               "remove the key, or use one of those ops"))
    if raw.get("size_invariant"):
        errs += _check_size(case, op)
    if raw.get("same_bits"):
        errs += _check_same_bits(case)
    return errs


def _check_same_bits(case: Case) -> list[CaseFileError]:
    """``same_bits`` names groups of a program's declared tensors, each name once."""
    raw = case.raw
    if "steps" not in raw:
        return [case.error(("same_bits",), "same_bits compares buffers of a program; this case "
                           "has one op", "write the case as a program (steps: and tensors:)")]
    tensors = raw.get("tensors")
    declared: dict[str, Any] = tensors if isinstance(tensors, dict) else {}
    errs: list[CaseFileError] = []
    seen: set[str] = set()
    for g, group in enumerate(raw["same_bits"]):
        for i, name in enumerate(group):
            if name not in declared:
                errs.append(case.error(("same_bits", g, i), f"same_bits names {name!r}, which "
                                       "is not a tensor of the program",
                                       "use names from tensors: ("
                                       + ", ".join(map(str, declared)) + ")"))
            elif name in seen:
                errs.append(case.error(("same_bits", g, i), f"same_bits names {name!r} twice",
                                       "put every buffer that must match it in one group"))
            seen.add(name)
    return errs


def check_same_values(case: Case, path: tuple[Any, ...], name: str, fill: dict[str, Any],
                      tensors: dict[str, Any], object_tensors: set[str]
                      ) -> list[CaseFileError]:
    """``expected: {NAME: {same_values: OTHER, atol, rtol, ulp}}``: OTHER is another tensor
    (not an object buffer) of the program, and the tolerance is finite."""
    other = fill["same_values"]
    if name in object_tensors:
        return [case.error(path, f"same_values compares tensors; {name!r} is an object buffer",
                           "compare object buffers with their values")]
    if other not in tensors:
        return [case.error((*path, "same_values"), f"same_values names {other!r}, which is not "
                           "a tensor of the program", "use a name from tensors: ("
                           + ", ".join(map(str, tensors)) + ")")]
    if other == name or other in object_tensors:
        why = "the buffer itself" if other == name else "an object buffer"
        return [case.error((*path, "same_values"), f"same_values names {other!r}, {why}",
                           "name another tensor of the program")]
    for key in ("atol", "rtol", "ulp"):
        value = fill.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return [case.error((*path, key), f"{key} must be a finite number >= 0, got "
                               f"{value!r}", "leave the key out for no tolerance of that kind")]
    return []


def _check_size(case: Case, op: ops.Op | None) -> list[CaseFileError]:
    """``size_invariant: M`` compares leading elements of two runs of different sizes: an
    elementwise reduction whose inputs come from a generator (generators give the same
    leading values whatever the size) in plain contiguous buffers."""
    raw = case.raw
    why = ""
    if op is None or op.name not in ELEMENTWISE:
        why = f"it applies to the op: form of {' and '.join(ELEMENTWISE)}"
    elif any(k in raw for k in ("entry_shape", "layout", "offset")):
        why = "it resizes plain contiguous buffers (no layout:, offset: or entry_shape:)"
    elif not (isinstance(raw.get("input"), dict)
              and raw["input"].get("generator") in PREFIX_STABLE):
        why = ("the input must come from a generator (" + ", ".join(PREFIX_STABLE) + "): "
               "their leading values do not depend on the buffer's size")
    if not why:
        return []
    return [case.error(("size_invariant",), "size_invariant compares the leading elements of "
                       f"two runs of different sizes; {why}", "remove the key, or test "
                       "size invariance in a case of its own")]


def with_offset(case: Case, tensors: tuple[TensorSpec, ...], offset: int
                ) -> tuple[TensorSpec, ...]:
    """The buffers placed ``offset`` elements into larger allocations; an offset not smaller
    than a buffer's element count is an error (it would no longer be a misalignment)."""
    if not offset:
        return tensors
    out: list[TensorSpec] = []
    for spec in tensors:
        if spec.dtype == "object":
            out.append(spec)
            continue
        for shape in (spec.rank_shapes or (spec.shape,)):
            if shape is not None and all(isinstance(d, int) for d in shape):
                n = math.prod(d for d in shape if isinstance(d, int))
                if offset >= max(n, 1):
                    raise case.error(("offset",), f"offset {offset} is beyond buffer "
                                     f"{spec.name!r} of {n} element(s)",
                                     "an offset misaligns the start inside a larger "
                                     "allocation: use one smaller than the element count")
        out.append(replace(spec, offset=offset))
    return tuple(out)


def plan(case: Case, steps: tuple[Step, ...], tensors: tuple[TensorSpec, ...]
         ) -> NumericsPlan | None:
    """The instance's numerics plan, or None when the case asks for none."""
    raw = case.raw
    if not _asked(raw):
        return None
    bounds = tuple((k, float(raw["error"][k])) for k in BOUNDS if k in (raw.get("error") or {}))
    unfused: tuple[Step, ...] = ()
    if raw.get("fusion_invariant"):
        first = steps[0]
        name = dict(first.bufs)["tensors"]
        spec = next(t for t in tensors if t.name == name)
        count = spec.shape[0] if spec.shape else None
        if not isinstance(count, int):
            raise case.error(("fusion_invariant",), "fusion_invariant needs the list length as "
                             "a fixed first dimension of the shape",
                             "give shape: [entries, ...] with integers")
        unfused = (replace(first, op=UNFUSED[str(first.op)], bufs=(("tensor", name),),
                           repeat=count, slices=True, returns=None),)
    size = int(raw.get("size_invariant") or 0)
    prefix = 0
    if size:
        counts = {math.prod(d for d in t.shape if isinstance(d, int)) for t in tensors
                  if t.shape is not None and all(isinstance(d, int) for d in t.shape)}
        if len(counts) != 1 or any(t.rank_shapes or t.entry_shapes for t in tensors):
            raise case.error(("size_invariant",), "size_invariant needs every buffer to hold "
                             "the same fixed number of elements on every rank",
                             "give one integer shape for the case")
        n = counts.pop()
        if size == n:
            raise case.error(("size_invariant",), f"size_invariant: {size} is the buffer's "
                             "own element count; the extra run must hold a different number",
                             f"use a size that is not {n}, e.g. {n * 8 + 1}")
        prefix = min(size, n)
    return NumericsPlan(error=bounds, error_line=CaseEval(case).key_line("error") or 0,
                        deterministic=int(raw.get("deterministic", 1)),
                        iterations=int(raw.get("iterations", 1)),
                        offset_invariant=bool(raw.get("offset_invariant")),
                        fusion_invariant=bool(raw.get("fusion_invariant")),
                        unfused=unfused, size=size, prefix=prefix,
                        same_bits=tuple(tuple(str(n) for n in g)
                                        for g in raw.get("same_bits") or ()))


def reference_checked(inst: Instance) -> bool:
    """Whether ``inst`` is of the ``op:`` form, must pass, and its output is computed by the
    reference model (``expected: auto``): then fresh inputs have known expected values."""
    if inst.shorthand is None or inst.expectation.kind != "pass":
        return False
    out = dict(inst.expected).get(inst.shorthand[1])
    return out is not None and out.kind == "auto"


def check_iters(inst: Instance, n: int) -> Instance:
    """``--check-iters N``: every instance of the ``op:`` form whose output the reference
    model computes (``expected: auto``) and that must pass runs at least N iterations on
    fresh inputs, each checked; other instances are left as they are."""
    if n <= 1 or not reference_checked(inst):
        return inst
    plan = inst.numerics or NumericsPlan()
    return replace(inst, numerics=replace(plan, iterations=max(plan.iterations, n)))


def perf_check(inst: Instance) -> Instance:
    """``--perf-check N`` on an instance ``--perf`` times: N checked runs after the timing
    loop, on the allocations the loop used (fresh poison each). Fresh inputs where the
    reference computes the expected values; the case's own inputs otherwise (its expected
    values hold only for them). Instances that are not timed are left as they are."""
    if inst.perf is None or inst.perf.check <= 0:
        return inst
    plan = inst.numerics or NumericsPlan()
    return replace(inst, numerics=replace(plan, perf_check=inst.perf.check,
                                          perf_fresh=reference_checked(inst)))
