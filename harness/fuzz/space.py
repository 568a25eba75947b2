"""The space of generated instances: Hypothesis strategies that draw case documents.

A drawn example is one case (a plain mapping in the case-file format) whose matrix has a
single point, so it expands to exactly one instance. Shorthand cases cover the collectives
of the op table (``expected: auto``: the reference model computes the outputs); programs
cover point-to-point patterns (tags, out-of-order receives, slow senders), several async
collectives in flight with their waits in any order, and barrier timing. Rare corners
(rare dtypes, large sizes, layouts, offsets, subgroups) are weighted so common faults are
found fast and corners stay reachable; every choice shrinks toward the simplest value
(listed first), so Hypothesis's shrinker ends at a small, readable case.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from hypothesis import strategies as st

from .. import ops

COMMON_DTYPES = ("float32", "int64", "int32")
RARE_DTYPES = ("bfloat16", "float16", "int8", "uint8", "bool", "float64", "complex64",
               "complex128", "int16")
INT_DTYPES = ("int64", "int32", "int8", "uint8", "int16")
ITEMSIZE = {"float32": 4, "int64": 8, "int32": 4, "bfloat16": 2, "float16": 2, "int8": 1,
            "uint8": 1, "bool": 1, "float64": 8, "complex64": 8, "complex128": 16, "int16": 2}
REDUCE_OPS = ("sum", "max", "min", "product", "avg", "bxor", "bor", "band", "premul_sum")
ROUNDING_OPS = ("sum", "avg", "premul_sum", "product")  # order-dependent in floats
LAYOUTS = ("transposed", "strided", "channels_last")
PRIMES = (7, 13, 31, 127, 257, 1021, 4099)
CHUNK_BYTES = 1 << 20  # just past it: the backends' algorithm / chunk switches

# The ops drawn in the op: form, in the order the op table gives (``Op.fuzz``): Hypothesis
# shrinks toward the first.
SHORTHAND: tuple[str, ...] = tuple(name for _, name in sorted(
    (o.fuzz.order, o.name) for o in ops.ALL_OPS.values() if o.fuzz is not None))
PROGRAMS = ("p2p", "async_program", "barrier_timing", "peer_death")
# peer_death runs each instance on a private pool (a rank dies): drawn when asked (--ops).
DEFAULT_OPS = (*SHORTHAND, *(p for p in PROGRAMS if p != "peer_death"))
# Entry j's rows for the ops whose list entries may differ in shape (``entry_shape``).
UNEVEN_ROWS = ("j + 1", "j", "2 * j + 1", "0 if j % 2 == 0 else j + 1", "rank + j + 1")
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's when built with it
DEADLINE_S = 5  # written into every generated case: a hang is reported in bounded time


def known_op(name: str) -> bool:
    """Whether ``name`` is an op (or program kind) the fuzzer can generate."""
    return name in SHORTHAND or name in PROGRAMS


def _weighted(draw: st.DrawFn, choices: list[tuple[int, Any]]) -> Any:
    """One of ``choices`` (weight, value); shrinks toward the first."""
    total = sum(w for w, _ in choices)
    k = draw(st.integers(0, total - 1))
    for w, v in choices:
        if k < w:
            return v
        k -= w
    raise AssertionError("unreachable")


def _dtype(draw: st.DrawFn, op: str) -> str:
    rare = draw(st.integers(0, 4)) == 4  # one time in five
    pool = RARE_DTYPES if rare else COMMON_DTYPES
    return str(draw(st.sampled_from(pool)))


def _numel(draw: st.DrawFn, dtype: str, big_ok: bool) -> int:
    kind = _weighted(draw, [(12, "tiny"), (4, "odd"), (2, "chunk"), (1 if big_ok else 0,
                                                                   "large")])
    if kind == "tiny":
        return int(draw(st.integers(1, 8)))
    if kind == "odd":
        return int(draw(st.sampled_from(PRIMES)))
    if kind == "chunk":
        k = int(draw(st.integers(8, 16)))
        return int(2**k + draw(st.integers(-1, 1)))
    return int(CHUNK_BYTES // ITEMSIZE[dtype] + draw(st.integers(1, 9)))


def _element_shape(draw: st.DrawFn, dtype: str, big_ok: bool) -> list[int]:
    form = _weighted(draw, [(10, "1d"), (2, "2d"), (1, "empty"), (1, "scalar")])
    if form == "empty":
        return [0]
    if form == "scalar":
        return []
    n = _numel(draw, dtype, big_ok)
    if form == "2d" and n < 4096:
        return [int(draw(st.integers(1, 4))), n]
    return [n]


@st.composite
def world_sizes(draw: st.DrawFn, allowed: tuple[int, ...]) -> int:
    """A world size from ``allowed``, 2 most often (the first listed when 2 is absent)."""
    first = 2 if 2 in allowed else allowed[0]
    others = [w for w in allowed if w != first]
    if not others or draw(st.integers(0, 2)) > 0:
        return first
    return int(draw(st.sampled_from(others)))


def _fuzz(op: str) -> ops.Fuzzed:
    spec = ops.get(op).fuzz
    if spec is None:
        raise ValueError(f"the fuzzer does not generate {op} in the op: form")
    return spec


def _group(draw: st.DrawFn, op: str, ws: int) -> list[int] | None:
    if not _fuzz(op).subgroup or ws < 2 or draw(st.integers(0, 4)) < 4:
        return None
    members = draw(st.permutations(list(range(ws))))
    size = int(draw(st.integers(1, ws)))
    return [int(m) for m in members[:size]]


def _reduce_op(draw: st.DrawFn, dtype: str) -> str:
    if dtype in INT_DTYPES and draw(st.integers(0, 5)) == 5:
        return str(draw(st.sampled_from(("bxor", "bor", "band"))))
    return str(draw(st.sampled_from(REDUCE_OPS)))


@st.composite
def shorthand_case(draw: st.DrawFn, op: str, ws: int) -> dict[str, Any]:
    """One collective of the op table with ``expected: auto``."""
    entry = ops.get(op)
    shape_kind, root = _fuzz(op).shape, entry.root_arg
    case: dict[str, Any] = {"name": "fuzz", "op": op, "world_size": ws}
    if shape_kind == "none":
        if draw(st.booleans()):
            case["async"] = True
        group = _group(draw, op, ws)
        if group:
            case["args"] = {"group": group}
        return case
    dtype = _dtype(draw, op)
    big_ok = shape_kind in ("tensor", "entries") or ws <= 2
    es = _element_shape(draw, dtype, big_ok)
    group = _group(draw, op, ws)
    members = group or list(range(ws))
    args: dict[str, Any] = {}
    if group:
        args["group"] = group
    if root:
        args[root] = int(draw(st.sampled_from(members)))
    if shape_kind == "tensor":
        shape = es
    elif shape_kind == "members":
        shape = [len(members), *(es or [1])]
    else:
        shape = [int(draw(st.integers(1, 4))), *(es or [1])]
    uneven = entry.takes_entry_shape and draw(st.integers(0, 5)) == 5
    if _fuzz(op).inplace and draw(st.integers(0, 3)) == 3:
        args["inplace"] = True
    if uneven:
        # Entries of different sizes (the _v forms): entry j's rows by a generic formula
        # ("rank + j + 1" only where each rank may give its own sizes: all_to_all).
        forms = UNEVEN_ROWS if entry.entries_per_sender else UNEVEN_ROWS[:-1]
        entry_shape: list[Any] = [str(draw(st.sampled_from(forms)))]
        if draw(st.integers(0, 3)) == 3:
            entry_shape.append(int(draw(st.integers(2, 3))))
        case.update(dtype=dtype, entry_shape=entry_shape)
        if shape_kind == "entries":
            case["entries"] = int(draw(st.integers(1, 4)))
    else:
        case.update(dtype=dtype, shape=shape)
    if entry.reduces:
        rop = _reduce_op(draw, dtype)
        case["reduce_op"] = rop
        if rop == "premul_sum":
            args["premul_factor"] = float(draw(st.sampled_from((0.5, 2.0, 3.0))))
    gen = _weighted(draw, [(8, "exact"), (2, "ranks"), (2, "random"), (1, "nan_inf")])
    if gen == "nan_inf" and dtype not in ("float32", "float64", "bfloat16", "float16"):
        gen = "exact"
    if (gen == "ranks" and case.get("reduce_op") in ROUNDING_OPS
            and dtype not in (*INT_DTYPES, "bool")):
        # The rank codes are exact one by one, not summed or multiplied: over 3 or more ranks
        # their float sums pass 2**24 (float32), so the result depends on the order of the
        # additions and no single expected value exists (the verdict only knows that of
        # `random` data). `exact` data is built to reduce exactly in any order.
        gen = "exact"
    case["input"] = {"generator": gen, "seed": int(draw(st.integers(0, 3)))}
    if not uneven and len(shape) >= 2 and draw(st.integers(0, 5)) == 5:
        layout = str(draw(st.sampled_from(LAYOUTS)))
        if layout == "channels_last":  # a 4-d tensor, or a list of 4-d entries
            lead = [shape[0], 2] if shape_kind == "members" else [shape[0]]
            shape[:] = [*lead, 2, 2, max(1, shape[-1] % 5)]
        case["layout"] = layout
    # An offset misaligns a contiguous buffer inside a larger allocation, so it must be
    # smaller than the smallest buffer's element count (the input: the offset ops' outputs
    # are at least as large); a 1-element, 0-dim or empty buffer takes none, nor a layout.
    numel = math.prod(case.get("shape", ()))
    offsets = [k for k in (1, 3, 5) if k < numel]
    if (not uneven and "layout" not in case and _fuzz(op).offset and offsets
            and draw(st.integers(0, 9)) == 9):
        case["offset"] = int(draw(st.sampled_from(offsets)))
    if draw(st.integers(0, 2)) == 2:
        case["async"] = True
    if args:
        case["args"] = args
    case["expected"] = "auto"
    return case


def _value(m: int, src: str) -> str:
    return f"{src} * 100 + i + {m * 1000}"


@st.composite
def p2p_case(draw: st.DrawFn, ws: int) -> dict[str, Any]:
    """Messages between rank pairs with tags, all posted before any wait; receives may be
    posted in another order than the sends; a slow sender; waits in any order."""
    ws = max(ws, 2)
    n = int(draw(st.integers(1, 3)))
    dtype = str(draw(st.sampled_from(("float32", "int64", "int32"))))
    size = int(draw(st.sampled_from((3, 1, 0, 17, 257))))
    tensors: dict[str, Any] = {}
    sends: list[dict[str, Any]] = []
    recvs: list[dict[str, Any]] = []
    expected: dict[str, Any] = {}
    for m in range(n):
        s = int(draw(st.integers(0, ws - 1)))
        r = int(draw(st.integers(0, ws - 2)))
        r = r + 1 if r >= s else r
        tag = int(draw(st.integers(0, 3)))
        tensors[f"s{m}"] = {"shape": [size], "init": _value(m, "rank")}
        tensors[f"r{m}"] = {"shape": [size], "init": "poison"}
        sends.append({"op": "isend", "tensor": f"s{m}", "dst": r, "tag": tag, "ranks": [s],
                      "handle": f"h{m}"})
        recvs.append({"op": "irecv", "tensor": f"r{m}", "src": s, "tag": tag, "ranks": [r],
                      "handle": f"h{m}"})
        expected[f"s{m}"] = "unchanged"
        expected[f"r{m}"] = {r: _value(m, str(s)), "others": "unchanged"}
    # Tags must tell messages of one pair apart for any receive order to be valid.
    pairs = [(d["ranks"][0], d["dst"], d["tag"]) for d in sends]
    if len(set(pairs)) < len(pairs):
        recv_order = list(range(n))
    else:
        recv_order = [int(x) for x in draw(st.permutations(list(range(n))))]
    steps: list[dict[str, Any]] = []
    if draw(st.integers(0, 3)) == 3:
        steps.append({"sleep": 0.05, "ranks": [int(draw(st.integers(0, ws - 1)))]})
    if draw(st.integers(0, 2)) == 2:
        # batch_isend_irecv: each rank posts its sends and receives (in the order above) as
        # one batch, then waits for it.
        ranks = sorted({d["ranks"][0] for d in sends} | {d["ranks"][0] for d in recvs})
        for rk in ranks:
            p2p = [{"op": "isend", "tensor": d["tensor"], "peer": d["dst"], "tag": d["tag"]}
                   for d in sends if d["ranks"][0] == rk]
            p2p += [{"op": "irecv", "tensor": recvs[i]["tensor"], "peer": recvs[i]["src"],
                     "tag": recvs[i]["tag"]} for i in recv_order if recvs[i]["ranks"][0] == rk]
            steps.append({"op": "batch_isend_irecv", "p2p": p2p, "ranks": [rk],
                          "handle": f"b{rk}"})
        steps += [{"wait": f"b{rk}", "ranks": [rk]} for rk in ranks]
        return {"name": "fuzz", "world_size": ws, "dtype": dtype, "tensors": tensors,
                "steps": steps, "expected": expected}
    steps += sends + [recvs[i] for i in recv_order]
    for m in draw(st.permutations(list(range(n)))):
        steps.append({"wait": f"h{m}", "ranks": sorted({sends[m]["ranks"][0],
                                                         sends[m]["dst"]})})
    return {"name": "fuzz", "world_size": ws, "dtype": dtype, "tensors": tensors,
            "steps": steps, "expected": expected}


@st.composite
def async_program(draw: st.DrawFn, ws: int) -> dict[str, Any]:
    """Several async all_reduce (SUM) / broadcast calls in flight, waited in any order; one
    draw in three scrambles them (``scramble:``): each op on a group of its own, issued and
    waited in each rank's own order."""
    n = int(draw(st.integers(1, 4)))
    scrambled = draw(st.integers(0, 2)) == 2
    made: list[dict[str, Any]] = []  # the groups, made before anything is in flight
    dtype = str(draw(st.sampled_from(("float32", "int64", "bfloat16", "int32"))))
    size = int(draw(st.sampled_from((4, 1, 0, 33, 1031))))
    tensors: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    if draw(st.integers(0, 3)) == 3:
        steps.append({"sleep": 0.05, "ranks": [int(draw(st.integers(0, ws - 1)))]})
    for m in range(n):
        if scrambled and m:  # op 0 on the world, each other op on a group of its own
            made.append({"new_group": f"g{m}", "members": list(range(ws))})
        on = {"group": f"g{m}"} if scrambled and m else {}
        if draw(st.booleans()):
            tensors[f"t{m}"] = {"shape": [size], "init": f"rank + i % 16 + {m}"}
            steps.append({"op": "all_reduce", "tensor": f"t{m}", "async": True,
                          "handle": f"h{m}", **on})
            expected[f"t{m}"] = (f"world_size * (i % 16 + {m}) + "
                                 "world_size * (world_size - 1) // 2")
        else:
            src = int(draw(st.integers(0, ws - 1)))
            tensors[f"t{m}"] = {"shape": [size], "init": f"rank * 100 + i % 16 + {m}"}
            steps.append({"op": "broadcast", "tensor": f"t{m}", "src": src, "async": True,
                          "handle": f"h{m}", **on})
            expected[f"t{m}"] = f"{src * 100} + i % 16 + {m}"
    for m in draw(st.permutations(list(range(n)))):
        steps.append({"wait": f"h{m}"})
    case = {"name": "fuzz", "world_size": ws, "dtype": dtype, "tensors": tensors,
            "steps": made + steps, "expected": expected}
    if scrambled:
        case["scramble"] = int(draw(st.integers(0, 999)))
    return case


@st.composite
def barrier_timing(draw: st.DrawFn, ws: int) -> dict[str, Any]:
    """One slow rank before a barrier: no rank may see it return before the slow one
    entered it."""
    ws = max(ws, 2)
    slow = int(draw(st.integers(0, ws - 1)))
    return {"name": "fuzz", "world_size": ws,
            "steps": [{"sleep": 0.05, "ranks": [slow]},
                      {"op": "barrier", "blocks_until_all": True}],
            "expected": {}}


@st.composite
def peer_death(draw: st.DrawFn, ws: int) -> dict[str, Any]:
    """Some ranks die (exit, abort, SIGKILL) before a collective; the survivors' call must
    raise in bounded time, they re-form the world and an all_reduce sums their values."""
    ws = max(ws, 2)
    dying = sorted(draw(st.sets(st.integers(0, ws - 1), min_size=1, max_size=ws - 1)))
    survivors = [r for r in range(ws) if r not in dying]
    how: dict[str, Any] = dict(draw(st.sampled_from(({"exit": 3}, {"abort": True},
                                                     {"kill": True}))))
    dtype = str(draw(st.sampled_from(("float32", "int64"))))
    size = int(draw(st.sampled_from((1, 4, 33))))
    detect: dict[str, Any] = {"match": "[Cc]onnection|[Cc]losed|[Rr]eset|[Pp]eer|[Tt]imed out",
                              "within": 10}
    if draw(st.booleans()):
        call: dict[str, Any] = {"op": "all_reduce", "tensor": "t", "raises": detect}
    else:  # a broadcast from a dead root: no survivor can get the data
        call = {"op": "broadcast", "tensor": "t", "src": dying[0], "raises": detect}
    return {"name": "fuzz", "world_size": ws, "dtype": dtype,
            "tensors": {"t": {"shape": [size], "init": "rank + 1"},
                        "u": {"shape": [size], "init": "rank + 1"}},
            "steps": [{**how, "ranks": dying}, call, {"reform": "survivors"},
                      {"op": "all_reduce", "tensor": "u"}],
            "unchecked": {"t": "a failed call leaves its buffer unspecified"},
            "expected": {"u": sum(r + 1 for r in survivors)}}


@st.composite
def cases(draw: st.DrawFn, op_names: tuple[str, ...], allowed_ws: tuple[int, ...]
          ) -> dict[str, Any]:
    """One generated case (a mapping in the case-file format) with a single instance."""
    name = str(draw(st.sampled_from(op_names)))
    ws = int(draw(world_sizes(allowed_ws)))
    if name == "p2p":
        case = draw(p2p_case(ws))
    elif name == "async_program":
        case = draw(async_program(ws))
    elif name == "barrier_timing":
        case = draw(barrier_timing(ws))
    elif name == "peer_death":
        case = draw(peer_death(ws))
    else:
        case = draw(shorthand_case(name, ws))
    case["deadline"] = DEADLINE_S
    return case


def program_op(case: dict[str, Any]) -> str:
    """The name a generated case is counted under (its op, or its program kind)."""
    if "op" in case:
        return str(case["op"])
    steps = case.get("steps", [])
    if any("blocks_until_all" in s for s in steps):
        return "barrier_timing"
    if any("reform" in s for s in steps):
        return "peer_death"
    # p2p_case's programs are the generated ones with point-to-point ops.
    if any(ops.ALL_OPS[s["op"]].point_to_point for s in steps if s.get("op") in ops.ALL_OPS):
        return "p2p"
    return "async_program"


def render_case(case: dict[str, Any]) -> str:
    """A generated case as a case-file document (YAML text)."""
    return yaml.dump({"cases": [case]}, Dumper=_DUMPER, sort_keys=False, width=100)
