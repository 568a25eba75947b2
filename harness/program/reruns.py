"""Rank-side numerics properties: the extra runs a property needs.

``deterministic: N`` runs the program N-1 more times on the same pool and inputs;
``offset_invariant`` runs it once more with every buffer at offset 0; ``fusion_invariant``
once more with the coalesced op's entries issued one by one; ``size_invariant: M`` once more
with every buffer holding M elements (the leading elements of both runs are compared). Each
extra run records the digests of the buffers it checked; the parent compares them with the
first run's (:mod:`harness.verdict.numerics`). Every rank runs the same extra runs in the
same order, so their collectives match. Runs in rank processes (imports torch).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..model import Fill, Instance, NumericsPlan, RankResult
from .interpreter import Probes, RankEnv, Timer, run_instance


def reseeded(fill: Fill, k: int) -> Fill:
    """``fill`` with its generator seed moved for iteration ``k`` (fresh inputs); other fills
    (lists, expressions) stay as they are."""
    if fill.kind == "per_rank":
        return Fill("per_rank", {r: reseeded(f, k) for r, f in fill.data.items()})
    if fill.kind != "generator":
        return fill
    name, params = fill.data
    moved = {**dict(params), "seed": int(dict(params).get("seed", 0)) + 1_000 * k}
    return Fill("generator", (name, tuple(sorted(moved.items()))))


def variants(inst: Instance) -> list[tuple[str, Instance]]:
    """The extra runs the instance's properties need: (label, instance to run)."""
    plan = inst.numerics
    if plan is None:
        return []
    # The extra runs keep the error bounds (their values are judged the same way), not the
    # properties (no runs of their own); they digest every buffer, as the first run does.
    bare = replace(inst, perf=None, numerics=NumericsPlan(error=plan.error, rerun=True))
    out = [(f"run {k}", bare) for k in range(2, plan.deterministic + 1)]
    out += [(f"iteration {k}", replace(bare, tensors=tuple(
        replace(t, init=reseeded(t.init, k)) for t in inst.tensors)))
        for k in range(2, plan.iterations + 1)]
    # After the timing loop (the first run's, inside run_instance): seeds far from the
    # iterations' so that no check run repeats an iteration's inputs.
    out += [(f"perf check {k}", replace(bare, tensors=tuple(
        replace(t, init=reseeded(t.init, 500 + k)) for t in inst.tensors))
        if plan.perf_fresh else bare) for k in range(1, plan.perf_check + 1)]
    if plan.offset_invariant:
        out.append(("offset 0", replace(bare, tensors=tuple(replace(t, offset=0)
                                                            for t in inst.tensors))))
    if plan.fusion_invariant and plan.unfused:
        out.append(("one by one", replace(bare, steps=(*plan.unfused, *inst.steps[1:]))))
    if plan.size:
        resized = replace(bare, numerics=NumericsPlan(error=plan.error, prefix=plan.prefix,
                                                      rerun=True),
                          tensors=tuple(replace(t, shape=(plan.size,)) for t in inst.tensors))
        out.append((f"size {plan.size}", resized))
    return out


def summary(label: str, res: RankResult) -> dict[str, Any]:
    """What the parent needs of an extra run: its status and the checked buffers' digests."""
    entry: dict[str, Any] = {"label": label, "status": res.status,
                             "digests": {c.tensor: c.prefix_digest or c.digest
                                         for c in res.checks if c.digest}}
    if res.status == "raised":
        entry["error"] = f"{res.exc_type}: {res.exc_message[:200]}"
    wrong = [c for c in res.checks if not c.ok]
    if wrong:  # an iteration's own value check (iterations: N)
        c = wrong[0]
        first = ", ".join(f"[{i}] expected {e} got {g}" for i, e, g in c.first_wrong[:3])
        entry["wrong"] = (f"buffer {c.tensor!r}: {c.wrong} of {c.total} element(s) wrong"
                          + (f"; first: {first}" if first else ""))
    return entry


def run(inst: Instance, renv: RankEnv, probes: Probes | None = None,
        timer: Timer | None = None) -> RankResult:
    """:func:`~harness.program.interpreter.run_instance`, then the property runs.

    The extra runs write into the first run's allocations, each refilled in place (fresh
    inputs, fresh poison, fresh guards) as nccl-tests' ``-c`` reuses its buffers: a backend
    right only on a buffer's first use, or stale on a later one, fails on that iteration.
    """
    extra = variants(inst)
    renv.reuse = {} if extra else None
    try:
        res = run_instance(inst, renv, probes, timer)
        if not extra or res.status != "ok":
            return res
        t0 = time.perf_counter()
        for label, variant in extra:
            again = run_instance(variant, renv)
            res.reruns.append(summary(label, again))
            if again.status != "ok":
                break  # every rank stops here: the pool's fail-fast settles the others
        res.phases["reruns"] = time.perf_counter() - t0
    finally:
        renv.reuse = None
    return res
