"""Numerics verdicts: uncheckable expectations, error bounds against the FP64 reference, and
the properties a case requires (deterministic, offset_invariant, fusion_invariant), each with
its own line; rank agreement (the op table's ``agree``) is recorded as a property too.

A bound the case states itself (``error:``, ``tolerance:``) judges float values even where
the expected value is not unique (a sum whose order decides the rounding): ``uncheckable`` is
left for results no stated bound can judge.

Runs in the parent on what the ranks reported (:class:`~harness.model.TensorCheck` error and
inexactness, the extra runs' digests); never says more than they observed.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..model import ORDER_SENSITIVE, Instance, InstanceResult, NumericsPlan, RankResult, TensorCheck

FLOATS = ("float", "bfloat", "complex")
LABELS = {"run": "deterministic", "iteration": "iterations", "offset 0": "offset_invariant",
          "one by one": "fusion_invariant", "size": "size_invariant", "perf": "perf_check"}
# Properties whose extra runs are judged by their own value checks, not by bits against run 1.
VALUED = ("iterations", "perf_check")


def own_bound(inst: Instance) -> str:
    """The bound the case states for its float values, in words ("" if none): its ``error:``
    bounds against FP64, else its ``tolerance:``. Either judges a result whose exact value is
    not unique at this dtype and world size, so such a result is never uncheckable."""
    if inst.numerics is not None and inst.numerics.error:
        return "error bound " + ", ".join(f"{k} {v:g}" for k, v in inst.numerics.error)
    return inst.tolerance.describe() if inst.tolerance is not None else ""


def _floats(inst: Instance, check: TensorCheck) -> bool:
    """Whether a checked buffer holds floats (the only values a bound can judge)."""
    return bool(check.error) or inst.dtype.startswith(FLOATS)


def _random_input(inst: Instance) -> bool:
    """Whether the shorthand's input comes from the ``random`` generator on some rank."""
    if inst.shorthand is None:
        return False
    spec = next((t for t in inst.tensors if t.name == inst.shorthand[0]), None)
    if spec is None:
        return False
    fills = [spec.init.for_rank(r) for r in range(inst.world_size)]
    return any(f.kind == "generator" and f.data[0] == "random" for f in fills)


def static_reason(inst: Instance) -> str:
    """Why the expected value of the instance is not unique, known before it runs ("" if it
    is): a reduction of random float data whose result depends on the order of the
    operations, with neither a tolerance nor an error bound to judge it by."""
    if (inst.reduce_op not in ORDER_SENSITIVE or inst.shorthand is None
            or not ops.get(inst.op).reduces or not inst.dtype.startswith(FLOATS)
            or inst.tolerance is not None or not _random_input(inst)
            or (inst.numerics is not None and inst.numerics.error)):
        return ""
    n = inst.group_size()
    # Two operands: a + b is one correctly rounded addition, whatever the order.
    order_free = (n <= 2 and inst.reduce_op in ("sum", "avg", "product")) or n <= 1
    if order_free:
        return ""
    return (f"{inst.reduce_op} of random {inst.dtype} data over {n} ranks: the result depends "
            "on the order of the operations and the case gives no tolerance or error bound "
            "(add error: {rel_l2: ...} or tolerance: auto)")


def worst_errors(results: dict[int, RankResult]) -> dict[str, dict[str, float]]:
    """Per buffer, the largest of each error metric over the ranks."""
    out: dict[str, dict[str, float]] = {}
    for rr in results.values():
        for c in rr.checks:
            for k, v in c.error.items():
                cur = out.setdefault(c.tensor, {})
                cur[k] = max(cur.get(k, 0.0), float(f"{v:.4g}"))
    return out


def _fmt(errors: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{name!r}: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(m.items()))
                     for name, m in sorted(errors.items()))


def bound_violations(inst: Instance, results: dict[int, RankResult]) -> list[str]:
    """One line per (rank, buffer, metric) above the case's ``error:`` bound: the bound, the
    measured error and, where the expected value is not unique, whether any result or every
    order of the additions could meet the bound."""
    bounds = dict(inst.numerics.error) if inst.numerics is not None else {}
    lines: list[str] = []
    for r, rr in sorted(results.items()):
        for c in rr.checks:
            for k, b in bounds.items():
                head = f"  rank {r}, buffer {c.tensor!r}: "
                if k in c.error:
                    if c.error[k] > b:
                        lines.append(f"{head}{k} {c.error[k]:.3g} exceeds the bound {b:g}"
                                     + _standing(inst, c, k, b))
                elif k == "rel_l2" and c.error.get("max_abs", 0.0) > 0:
                    # ||ref|| is 0 (or not finite) and the error is not: no ratio to measure,
                    # and no bound on it can hold.
                    lines.append(f"{head}rel_l2 cannot be met (the FP64 reference's norm is 0 "
                                 f"or not finite, the error's is not: max_abs "
                                 f"{c.error['max_abs']:.3g}), bound {b:g}")
    return lines


def _standing(inst: Instance, c: TensorCheck, k: str, b: float) -> str:
    """Where bound ``b`` on metric ``k`` stands against the expected value's ambiguity."""
    if k in c.rounded_error and c.rounded_error[k] > b:
        return (f" (no {inst.dtype} result can meet it: the exact result rounded once to "
                f"{inst.dtype} is already at {k} {c.rounded_error[k]:.3g})")
    if k in c.order_error and c.order_error[k] > b:
        return (f" (a correct order of the additions could exceed it too: the most any order "
                f"gives here is {k} {c.order_error[k]:.3g})")
    if k in c.order_error:
        return (f" (no order of the additions gives that: every order stays within {k} "
                f"{c.order_error[k]:.3g})")
    return ""


def _decided_text(inst: Instance, results: dict[int, RankResult], reason: str) -> str:
    """For a pass the case's own bound decided although the expected value is not unique:
    why it is not, and whether every order of the additions meets the bound."""
    text = (f"the expected value is not unique here ({reason.split(', so')[0]}), so the "
            f"case's {own_bound(inst)} decided")
    bounds = dict(inst.numerics.error) if inst.numerics is not None else {}
    worst = {k: max(c.order_error[k] for rr in results.values() for c in rr.checks
                    if k in c.order_error)
             for k in bounds if any(k in c.order_error for rr in results.values()
                                    for c in rr.checks)}
    if not worst:
        return text
    over = {k: v for k, v in worst.items() if v > bounds[k]}
    if over:
        return text + ("; a correct order of the additions could exceed it: "
                       + ", ".join(f"{k} up to {v:.3g}" for k, v in over.items()))
    return text + ("; every order of the additions meets it: "
                   + ", ".join(f"{k} at most {v:.3g}" for k, v in worst.items()))


def property_lines(inst: Instance, results: dict[int, RankResult]
                   ) -> tuple[dict[str, str], list[str]]:
    """Per property: ``held`` or what broke it; and the failure lines."""
    plan = inst.numerics
    asked: dict[str, str] = {}
    if plan is not None:
        if plan.deterministic > 1:
            asked["deterministic"] = "held"
        if plan.iterations > 1:
            asked["iterations"] = "held"
        if plan.offset_invariant:
            asked["offset_invariant"] = "held"
        if plan.fusion_invariant:
            asked["fusion_invariant"] = "held"
        if plan.size:
            asked["size_invariant"] = "held"
        if plan.same_bits:
            asked["same_bits"] = "held"
        if plan.perf_check:
            asked["perf_check"] = "held"
    lines: list[str] = []
    for r, rr in sorted(results.items()):
        first = {c.tensor: c.digest for c in rr.checks if c.digest}
        for group in plan.same_bits if plan is not None else ():
            if len({first.get(n) for n in group}) > 1:
                text = (f"rank {r}: " + ", ".join(f"{n!r} {first.get(n)}" for n in group)
                        + ": not the same bits")
                if asked.get("same_bits") == "held":
                    asked["same_bits"] = text
                lines.append(f"  same_bits: {text}")
        for run in rr.reruns:
            label = str(run.get("label", ""))
            prop = _property_of(label)
            if not prop:
                continue
            if run.get("status") != "ok":
                text = f"rank {r}: the {label} run raised {run.get('error', '')}"
            elif prop in VALUED:
                if not run.get("wrong"):
                    continue
                inputs = ("fresh inputs" if prop == "iterations" or (plan and plan.perf_fresh)
                          else "the case's inputs")
                after = ", after the timing loop" if prop == "perf_check" else ""
                text = f"rank {r}: {label} ({inputs}{after}) failed: {run['wrong']}"
            else:
                digests: dict[str, Any] = run.get("digests", {})
                mine = ({c.tensor: c.prefix_digest for c in rr.checks if c.prefix_digest}
                        if prop == "size_invariant" else first)
                diff = sorted(n for n in mine if digests.get(n) != mine[n])
                if not diff:
                    continue
                what = {"deterministic": f"differ in {label} from run 1",
                        "offset_invariant": "differ at offset 0 from the "
                                            f"offset {_offset(inst)} run",
                        "fusion_invariant": "differ when the entries are issued one by one "
                                            "from the coalesced call",
                        "size_invariant": _size_text(plan)}[prop]
                text = (f"rank {r}: bits of {', '.join(map(repr, diff))} {what} ("
                        + ", ".join(f"{mine[n]} vs {digests.get(n)}" for n in diff) + ")")
            if asked.get(prop) == "held":
                asked[prop] = text
            lines.append(f"  {prop}: {text}")
    compared = compared_buffers(inst, results)
    for prop, verdict in asked.items():
        if verdict == "held" and not compared.get(prop):
            # A property over no buffer (none checked or digested, or all of them empty)
            # would "hold" on nothing: it does not hold. (One broken otherwise keeps its cause.)
            asked[prop] = ("compared nothing: no non-empty buffer of the run was checked or "
                           "digested")
            lines.append(f"  {prop}: {asked[prop]}")
    return asked, lines


def _property_of(label: str) -> str:
    """The property an extra run's label belongs to ("" for none)."""
    return LABELS.get(label.split(" ")[0]
                      if label.startswith(("run ", "iteration ", "size ", "perf check "))
                      else label, "")


def compared_buffers(inst: Instance, results: dict[int, RankResult]
                     ) -> dict[str, dict[str, Any]]:
    """Per property asked: the non-empty buffers whose digests it compared, on which ranks,
    and in how many runs (the evidence of :mod:`harness.verdict.evidence`)."""
    plan = inst.numerics
    out: dict[str, dict[str, Any]] = {}
    for r, rr in sorted(results.items()):
        sized = {c.tensor for c in rr.checks if c.total > 0}
        first = {c.tensor for c in rr.checks if c.digest} & sized
        # Fresh-input iterations compare values, not bits: only buffers with a value count.
        valued = {c.tensor for c in rr.checks if c.expectation != "unspecified"} & sized
        prefixed = {c.tensor for c in rr.checks if c.prefix_digest}
        seen: dict[str, set[str]] = {}
        runs: dict[str, int] = {}
        for group in plan.same_bits if plan is not None else ():
            if set(group) <= first:
                seen.setdefault("same_bits", set()).update(group)
        for run in rr.reruns:
            prop = _property_of(str(run.get("label", "")))
            names = {"size_invariant": prefixed, "iterations": valued,
                     "perf_check": valued}.get(prop, first) & set(
                run.get("digests", {}))
            if prop and run.get("status") == "ok" and names:
                seen.setdefault(prop, set()).update(names)
                runs[prop] = runs.get(prop, 1) + 1
        for prop, names in seen.items():
            entry = out.setdefault(prop, {"buffers": set(), "ranks": []})
            entry["buffers"] |= names
            entry["ranks"].append(r)
            if prop in runs:
                entry["runs"] = runs[prop]
    return {p: {**e, "buffers": sorted(e["buffers"])} for p, e in out.items()}


def _size_text(plan: NumericsPlan | None) -> str:
    if plan is None or not plan.size:
        return ""
    return (f"differ in the first {plan.prefix} element(s) when the buffer holds {plan.size} "
            "elements")


def _offset(inst: Instance) -> int:
    return max((t.offset for t in inst.tensors), default=0)


def apply(inst: Instance, results: dict[int, RankResult], res: InstanceResult,
          disagree: list[str]) -> None:
    """Fold the numerics into a verdict the value checks reached (``disagree``: the rank
    agreement lines of :func:`~harness.verdict.outcome.disagreements`)."""
    if inst.expectation.kind != "pass" or res.outcome not in ("passed", "failed"):
        return
    if not all(rr.status == "ok" for rr in results.values()) or not results:
        return
    errors = worst_errors(results)
    props, lines = property_lines(inst, results)
    if inst.shorthand is not None and ops.get(inst.op).agree and (props or disagree):
        props["ranks_agree"] = disagree[0].strip() if disagree else "held"
    numerics: dict[str, Any] = {}
    if errors:
        numerics["error"] = errors
    if props:
        numerics["properties"] = props
    own = own_bound(inst)
    inexact = [c for _, rr in sorted(results.items()) for c in rr.checks if c.inexact]
    # A float buffer under the case's own bound is judged by it, unique expected value or not.
    open_ = [c.inexact for c in inexact if not (own and _floats(inst, c))]
    decided = next((c.inexact for c in inexact if own and _floats(inst, c)), "")
    reason = static_reason(inst) or (open_[0] if open_ else "")
    if reason:
        numerics["uncheckable"] = reason
    elif decided:
        numerics["inexact"] = decided
    res.numerics = numerics
    where = inst.where()
    beyond = [f"  rank {r}, buffer {c.tensor!r}: {c.beyond_order} element(s) outside what any "
              "order of the operations gives (|error| > gamma_k x sum|x| + 2 ulp)"
              for r, rr in sorted(results.items()) for c in rr.checks if c.beyond_order]
    if reason and beyond:
        # The exact value is not unique, but no order explains this result: a failure.
        res.outcome = "failed"
        res.message = (f"{where}: wrong values although {reason.split(':')[0]} has no single "
                       "expected value\n" + "\n".join(beyond))
        return
    if reason:
        seen = f"; observed error against FP64: {_fmt(errors)}" if errors else ""
        res.message = (f"{where}: uncheckable: {reason}{seen}\n  (not a pass: the expected "
                       f"value is inexact; the value check alone said {res.outcome})")
        res.outcome = "uncheckable"
        return
    over = bound_violations(inst, results)
    bad = over + lines
    if res.outcome == "passed" and bad:
        res.outcome = "failed"
        heads = ((["the error against the FP64 reference exceeds the case's bound"] if over
                  else []) + (["numerics properties do not hold"] if lines else []))
        line = inst.numerics.error_line if over and inst.numerics is not None else 0
        res.message = f"{inst.where(line or None)}: {'; '.join(heads)}\n" + "\n".join(bad)
    elif res.outcome == "passed":
        held = [k for k, v in props.items() if v == "held"]
        measured = {k: max((m[k] for m in errors.values() if k in m), default=None)
                    for k, _ in (inst.numerics.error if inst.numerics is not None else ())}
        extra = (["error within " + ", ".join(
            f"{k} {b:g}" + (f" (measured {measured[k]:.3g})" if measured[k] is not None
                            else "") for k, b in inst.numerics.error)]
                 if inst.numerics is not None and inst.numerics.error else [])
        if decided:
            extra.append(_decided_text(inst, results, decided))
        if held or extra:
            res.message += " (" + "; ".join(extra + [f"{k} held" for k in held]) + ")"
    elif bad:
        res.message += "\n" + "\n".join(bad)
    if res.outcome == "failed" and decided:
        res.message += (f"\n  (the expected value is not unique here: {decided}; the case's "
                        f"{own_bound(inst)} decides)")
