"""Parent-side judgement of per-step expectations observed on the ranks.

- A step's ``raises:`` (what :mod:`harness.program.lifecycle` recorded): the error must match
  the pattern (RE2, as the case's own ``raises:``), be of a class ``type:`` names (or of a
  subclass of one: the class names of the error's MRO were recorded) and, with
  ``not_before: S``, must not have come earlier than S seconds after the step was entered
  (with ``within: W``, no later than W: "detected after 0.8 s, bound 2 s").
  Each observation becomes a check of the rank ("error of step N"), with what was seen in its
  note: the type, the message and the seconds it took.
- ``blocks_until_all`` (a barrier): every rank that ran the step must have seen it complete
  no earlier than the last rank entered it. Only this direction is judged: a loaded machine
  can make a rank late, never make a barrier return before a peer arrived, so a violation
  cannot be produced by load. The times are CLOCK_MONOTONIC, one clock per host: when the
  ranks ran on more than one host nothing is judged and the record says so (outcome
  ``error``: the harness could not make the check, which is no verdict on the backend).
"""

from __future__ import annotations

from typing import Any

from ..casefile import patterns
from ..model import Instance, InstanceResult, RankResult, TensorCheck


def _error_check(inst: Instance, obs: dict[str, Any]) -> TensorCheck:
    idx = int(obs["step"])
    step = inst.steps[idx]
    assert step.raises is not None
    what = f"error of step {idx} ({step.describe()})"
    after = float(obs["after_s"])
    bound = step.raises_not_before
    if not obs["raised"]:
        return TensorCheck(tensor=what, ok=False, expectation="raises", wrong=1, total=1,
                           first_wrong=[(0, repr(step.raises), "no error")],
                           note=f"the step completed after {after:.3f} s without raising")
    got = f"{obs['type']}: {obs['message']}"
    seen = f"after {after:.3f} s raised {got[:200]}"
    types = step.raises_types
    if types and not set(types) & set(obs.get("classes", [obs["type"]])):
        return TensorCheck(tensor=what, ok=False, expectation="raises", wrong=1, total=1,
                           first_wrong=[(0, f"type {' or '.join(types)}", obs["type"])],
                           note=f"{seen}; {obs['type']} is none of {', '.join(types)} nor "
                                "a subclass of one")
    if not patterns.search(step.raises, got):
        return TensorCheck(tensor=what, ok=False, expectation="raises", wrong=1, total=1,
                           first_wrong=[(0, repr(step.raises), got[:200])],
                           note=f"{seen}; does not match the pattern")
    if bound is not None and after < bound:
        return TensorCheck(tensor=what, ok=False, expectation="raises", wrong=1, total=1,
                           first_wrong=[(0, f"not before {bound:g} s", f"{after:.3f} s")],
                           note=f"{seen}: earlier than the {bound:g} s it must not come before")
    within = step.raises_within
    if within is not None and after > within:
        return TensorCheck(tensor=what, ok=False, expectation="raises", wrong=1, total=1,
                           first_wrong=[(0, f"within {within:g} s", f"{after:.3f} s")],
                           note=f"{seen}: detected after {after:.3f} s, bound {within:g} s")
    limit = f", not before {bound:g} s" if bound is not None else ""
    if within is not None:
        limit += f"; detected after {after:.3f} s, bound {within:g} s"
    kind = f", a {' or '.join(types)}" if types else ""
    return TensorCheck(tensor=what, ok=True, expectation="raises", total=1,
                       note=f"{seen} (matches {step.raises!r}{kind}{limit})")


def step_error_checks(inst: Instance, results: dict[int, RankResult]
                      ) -> list[tuple[int, str]]:
    """Add every rank's step-error checks to its result; (step, line) for the failed ones."""
    bad: list[tuple[int, str]] = []
    for rank, res in sorted(results.items()):
        for obs in res.step_errors:
            check = _error_check(inst, obs)
            res.checks.append(check)
            if not check.ok:
                bad.append((int(obs["step"]), f"  rank {rank}, {check.tensor}: {check.note}"))
    return bad


def barrier_timing(inst: Instance, results: dict[int, RankResult]
                   ) -> tuple[list[tuple[int, str]], list[str], str]:
    """(violations, observations, why not judged) of the ``blocks_until_all`` steps.

    Times are printed relative to the first entry into the step, in seconds.
    """
    bad: list[tuple[int, str]] = []
    seen: list[str] = []
    for idx, step in enumerate(inst.steps):
        if not step.blocks_until_all:
            continue
        marks = {r: res.timing["steps"][str(idx)] for r, res in sorted(results.items())
                 if str(idx) in res.timing.get("steps", {})}
        if not marks:
            continue
        hosts = {results[r].timing.get("host") for r in marks}
        if len(hosts) != 1:
            return [], [], (f"step {idx} ({step.describe()}) asks whether the barrier returned "
                            "before the last rank entered it, which needs every rank's clock "
                            f"to be one clock; its ranks ran on {len(hosts)} hosts, so nothing "
                            "was judged")
        t0 = min(m["enter"] for m in marks.values())
        last_rank, last = max(((r, m["enter"]) for r, m in marks.items()), key=lambda x: x[1])
        done = {r: m["done"] for r, m in marks.items()}
        head = (f"  step {idx} ({step.describe()}): last entry rank {last_rank} at "
                f"+{last - t0:.3f} s; completed on " + ", ".join(
                    f"rank {r} at +{d - t0:.3f} s" if d is not None else f"rank {r}: not seen"
                    for r, d in done.items()))
        early = [r for r, d in done.items() if d is not None and d < last]
        if early:
            bad.append((idx, head + f"; rank(s) {', '.join(map(str, early))} saw it complete "
                        f"before rank {last_rank} entered it"))
        elif any(d is None for d in done.values()):
            return [], [], (f"step {idx} ({step.describe()}): a rank's completion time was not "
                            "recorded, so nothing was judged")
        else:
            seen.append(head + " (CLOCK_MONOTONIC of one host): no rank saw it complete "
                        "before the last rank entered it")
    return bad, seen, ""


def _where(inst: Instance, step: int | None = None) -> str:
    return inst.where(inst.steps[step].line if step is not None else None)


def apply(inst: Instance, results: dict[int, RankResult], res: InstanceResult) -> None:
    """Fold the step checks into a verdict that the rest of the judgement reached."""
    violations, seen, unjudged = barrier_timing(inst, results)
    bad = step_error_checks(inst, results) + violations
    if res.outcome != "passed":
        return  # already not a pass; the checks are in the record for the reader
    if bad:
        first = min(i for i, _ in bad)  # the failure names the YAML line of the first step
        res.outcome = "failed"
        res.message = (f"{_where(inst, first)}: a step did not behave as the case states\n"
                       + "\n".join(text for _, text in sorted(bad)))
        return
    if unjudged:
        res.outcome = "error"
        res.message = f"{_where(inst)}: {unjudged}"
        return
    notes = [f"  rank {r}, {c.tensor}: {c.note}" for r, rr in sorted(results.items())
             for c in rr.checks if c.expectation == "raises" and c.ok]
    if notes or seen:
        res.message += "\n" + "\n".join(notes + seen)
