"""Recorded cases at other world sizes (``--world-size 2,4,8``).

A recording at world size W always replays at W. A case also runs at the sizes asked for
where its pattern generalizes: it runs on the whole world (no subgroup), it is not a
point-to-point program between recorded ranks, its roots exist at every size asked, and its
shapes either do not depend on the world size (all_reduce, broadcast, all_gather, ...) or
scale with it (a reduce_scatter's input of W chunks, a scatter's list of W entries): those
are rewritten as expressions of ``world_size`` (``"world_size * 3"``, ``[world_size, 4]``).
Every case that stays at W says why in its description, and the file's header says which
sizes were asked and how many cases took them.
"""

from __future__ import annotations

from typing import Any

# ops whose per-rank input is [members, *entry] (a list of one tensor per member)
LISTED = {"reduce_scatter", "scatter", "all_to_all"}
# ops whose input's first dimension is members * chunk
CHUNKED = {"reduce_scatter_tensor", "all_to_all_single"}
ROOT_ARGS = ("src", "dst")


def _why_not(case: dict[str, Any], world: int, asked: list[int]) -> str | None:
    if "op" not in case:
        return "a point-to-point program between recorded ranks: which ranks would talk at " \
               "another world size is not known"
    args = case.get("args", {})
    if "group" in args:
        return f"recorded on the subgroup {args['group']}: which group it would be at " \
               "another world size is not known"
    for key in ROOT_ARGS:
        roots = args.get(key)
        roots = roots if isinstance(roots, list) else [roots] if roots is not None else []
        if any(r >= min(asked) for r in roots):
            return f"its {key} {max(roots)} does not exist at world size {min(asked)}"
    if case["op"] in LISTED | CHUNKED:
        for s in _shapes(case):
            if not s or s[0] % world or (case["op"] in LISTED and s[0] != world):
                return f"its shape {s} does not scale with the world size {world}"
    return None


def _shapes(case: dict[str, Any]) -> list[list[int]]:
    shape = case.get("shape")
    if shape is None:
        return []
    return shape if shape and isinstance(shape[0], list) else [shape]


def _scaled(op: str, s: list[int], world: int) -> list[Any]:
    if op in LISTED:
        return ["world_size", *s[1:]]
    k = s[0] // world
    return ["world_size" if k == 1 else f"world_size * {k}", *s[1:]]


def generalize(cases: list[dict[str, Any]], world: int, asked: list[int]) -> list[str]:
    """Widen each case that generalizes to ``[world, *asked]``; header lines to write."""
    sizes = sorted({world, *asked})
    if sizes == [world]:
        return []
    widened = 0
    for case in cases:
        why = _why_not(case, world, [s for s in sizes if s != world])
        if why is not None:
            case["description"] = f"{case['description']} Replayed at world size {world} " \
                                  f"only: {why}."
            continue
        if case["op"] in LISTED | CHUNKED:
            scaled = [_scaled(case["op"], s, world) for s in _shapes(case)]
            case["shape"] = scaled if len(scaled) > 1 else scaled[0]
        case["world_size"] = list(sizes)
        widened += 1
    return [f"world sizes asked: {', '.join(map(str, sizes))}; {widened} of {len(cases)} "
            f"case(s) generalize to them (every group is the world, shapes fixed or scaling "
            f"with it); the others say why they stay at {world}"]
