"""What a verdict compared: the evidence behind an outcome, and the rule that a pass needs some.

Every judged record carries an ``evidence`` object (docs/reference/report.md#evidence) built
here from what the ranks reported and what the other verdict stages concluded:

- ``checks``: each comparison with an expected value (a buffer's contents against the case's
  values, its initial contents, the reference model; a step's return value, warning, error or
  Work state; a new group's membership), the ranks it was made on and the elements compared;
- ``agreement``: buffers whose bytes were compared across the ranks that must agree;
- ``properties``: each numerics property that held, with the buffers whose digests it compared
  (a property that compared no buffer does not hold: :mod:`harness.verdict.numerics`);
- ``raised`` / ``observed``: the error pattern that every required rank's error matched, or
  the hang or crash that the case declared and the pool observed;
- ``completed``: for an op with no buffer at all (``barrier``), the ranks on which the call
  returned: the only thing such a call lets anyone observe;
- ``ordering``: the async-contract checks that ran and held.

Whatever is not listed was not compared. A run that reached ``passed`` with nothing to list is
turned into a failure here (:func:`require`), which names what was missing: nothing passes on
nothing.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..model import Instance, InstanceResult, PoolRun
from . import numerics

# TensorCheck.expectation values that compare nothing: a digest kept for another comparison.
NOT_COMPARED = ("unspecified",)


def gather(inst: Instance, run: PoolRun, res: InstanceResult) -> dict[str, Any]:
    """The evidence behind ``res`` (empty when nothing was compared)."""
    out: dict[str, Any] = {}
    checks: dict[tuple[str, str], dict[str, Any]] = {}
    digested: dict[str, set[int]] = {}
    for rank, rr in sorted(run.results.items()):
        for c in rr.checks:
            if c.digest:
                digested.setdefault(c.tensor, set()).add(rank)
            if c.expectation in NOT_COMPARED:
                continue
            entry = checks.setdefault((c.tensor, c.expectation), {
                "what": c.tensor, "how": c.expectation, "ranks": [], "elements": 0})
            entry["ranks"].append(rank)
            entry["elements"] += c.total
    if checks:
        out["checks"] = list(checks.values())
    members = agreement_members(inst)
    if inst.shorthand is not None and members:
        seen = sorted(digested.get(inst.shorthand[1], set()) & set(members))
        if len(seen) > 1:  # the bytes the verdict compared across the members
            out["agreement"] = [{"buffer": inst.shorthand[1], "ranks": seen}]
    props = res.numerics.get("properties", {})
    compared = numerics.compared_buffers(inst, run.results)
    held = [{"property": name, **compared.get(name, {})}
            for name, verdict in sorted(props.items()) if verdict == "held"
            and name != "ranks_agree"]
    if held:
        out["properties"] = held
    exp = inst.expectation
    if res.outcome == "passed" and exp.kind == "raises":
        raised = sorted(r for r, rr in run.results.items() if rr.status == "raised")
        if raised:
            out["raised"] = {"pattern": exp.match, "ranks": raised}
    if res.outcome == "passed" and exp.kind in ("hangs", "crashes"):
        states = "blocked" if exp.kind == "hangs" else "died"
        out["observed"] = {"state": "hang" if exp.kind == "hangs" else "crash",
                           "ranks": sorted(s.rank for s in run.states if s.state == states)}
    bare = _bare_calls(inst)
    if bare and run.kind == "done" and run.results and all(
            rr.status == "ok" for rr in run.results.values()):
        out["completed"] = {"ops": bare, "ranks": sorted(run.results)}
    ordering = sorted(name for name, v in res.ordering.items()
                      if isinstance(v, dict) and v.get("status") == "ok")
    if ordering:
        out["ordering"] = ordering
    return out


def agreement_members(inst: Instance) -> list[int]:
    """The ranks whose output bytes must be identical (the op table's ``agree``, shorthand
    form): the op's group, or the world; empty where no agreement is promised."""
    if inst.shorthand is None or not ops.get(inst.op).agree:
        return []
    group = dict(inst.steps[0].args).get("group")
    return sorted(group) if group else list(range(inst.world_size))


def _bare_calls(inst: Instance) -> list[str]:
    """The ops of the program that take no buffer at all (their return is their contract)."""
    return sorted({s.op for s in inst.steps if s.kind == "op" and s.op is not None
                   and ops.get(s.op).takes_no_buffer})


def require(inst: Instance, res: InstanceResult) -> None:
    """A ``passed`` result with no evidence becomes a failure that says what was missing."""
    if res.outcome != "passed" or res.evidence:
        return
    res.outcome = "failed"
    res.message = (f"{inst.where()}: nothing was compared, so this cannot pass: no buffer was "
                   "compared with an expected value on any rank (buffers under unchecked: are "
                   "not), no step stated a return, warning or error, no numerics property "
                   "compared a buffer and no ordering check ran; give a buffer a value under "
                   "expected: or ask for a property (deterministic, same_bits)"
                   + (f"\n  (the run itself: {res.message})" if res.message else ""))
