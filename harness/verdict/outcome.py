"""Turn what the ranks did (:class:`PoolRun`) into an outcome and a message for a person."""

from __future__ import annotations

from ..casefile import patterns
from ..errors import trim_traceback
from ..model import BAD_OUTCOMES, Instance, InstanceResult, Outcome, PoolRun, RankResult, RankState
from ..ordering import verdicts as ordering
from . import deaths, evidence, numerics, p2pwait
from . import steps as stepverdicts

MAX_TB_LINES = 25


def _value_line(inst: Instance, results: dict[int, RankResult]) -> int | None:
    """The YAML line of the first buffer with a wrong value (its ``expected:``/``input:``)."""
    lines = dict(inst.value_lines)
    for _, res in sorted(results.items()):
        for c in res.checks:
            if not c.ok and c.tensor in lines:
                return lines[c.tensor]
    return None


def _step_line(inst: Instance, step: int) -> int | None:
    return inst.steps[step].line if 0 <= step < len(inst.steps) else None


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + ln for ln in text.splitlines())


def _tb(text: str) -> str:
    lines = text.rstrip().splitlines()
    if len(lines) > MAX_TB_LINES:
        lines = ["...", *lines[-MAX_TB_LINES:]]
    return "\n".join(lines)


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``0-3, 5``."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def _step_desc(inst: Instance, step: int) -> str:
    return inst.steps[step].describe() if 0 <= step < len(inst.steps) else f"step {step}"


def where_rank_was(st: RankState) -> str:
    """``in step 2 (all_reduce(tensor=t))``, or ``while building group [0, 2] (new_group)``
    for a rank that had not reached the program's steps ("" when nothing is known)."""
    if st.step >= 0:
        return f"in step {st.step} ({st.step_desc})"
    return f"while {st.step_desc}" if st.step_desc else ""


def describe_state(st: RankState, results: dict[int, RankResult], waits: str = "") -> str:
    """One block per rank for hang/crash/fail-fast reports (``waits``: whom a blocked rank
    waits for, :func:`harness.verdict.p2pwait.waiting`)."""
    if st.state == "finished":
        return f"  rank {st.rank}: finished"
    if st.state == "raised":
        res = results[st.rank]
        return f"  rank {st.rank}: raised {res.exc_type} in step {res.step}: {res.exc_message}"
    if st.state == "died":
        how = f"killed by {st.signal}" if st.signal else f"exited with code {st.exitcode}"
        text = f"  rank {st.rank}: DIED ({how}) {where_rank_was(st)}".rstrip()
        if st.stderr_tail:
            text += "\n    last output:\n" + _indent(st.stderr_tail)
        return text
    text = f"  rank {st.rank}: BLOCKED {where_rank_was(st)}".rstrip() + (
        f"; {waits}" if waits else "")
    if st.stack:
        text += "\n    Python stack:\n" + _indent(st.stack)
    if st.flight_recorder:
        text += "\n    flight recorder (last collectives):\n" + _indent(
            "\n".join(st.flight_recorder))
    if st.stderr_tail:
        text += "\n    last output (stdout and stderr, escaped):\n" + _indent(st.stderr_tail)
    return text


def _raised(results: dict[int, RankResult]) -> list[RankResult]:
    return [r for _, r in sorted(results.items()) if r.status == "raised"]


def _value_failures(inst: Instance, results: dict[int, RankResult]) -> list[str]:
    """One line per wrong buffer; ranks whose line would be the same word for word share one
    (``ranks 0-3, buffer 't' ...``), as identical raises do."""
    groups: dict[str, list[int]] = {}
    for rank, res in sorted(results.items()):
        for c in res.checks:
            if c.ok:
                continue
            if c.expectation == "guard":  # bytes outside the buffer, not elements in it
                groups.setdefault(f"buffer {c.tensor!r} (guard): {c.note}", []).append(rank)
                continue
            first = ", ".join(f"[{i}] expected {e} got {g}" for i, e, g in c.first_wrong)
            extra = f" ({c.note})" if c.note else ""
            text = (f"buffer {c.tensor!r} ({c.expectation}): {c.wrong} of {c.total} element(s) "
                    f"wrong{extra}" + (f"; first: {first}" if first else ""))
            groups.setdefault(text, []).append(rank)
    return [f"  rank {members[0]}, {text}" if len(members) == 1 else
            f"  ranks {rank_ranges(members)}, {text}" for text, members in groups.items()]


def disagreements(inst: Instance, results: dict[int, RankResult]) -> list[str]:
    """For ops whose output must agree across the group (the op table's ``agree``): the ranks
    whose bytes differ, as report lines (empty when all members hold the same digest)."""
    members = evidence.agreement_members(inst)
    if inst.shorthand is None or not members:
        return []
    out_name = inst.shorthand[1]
    by_digest: dict[str, list[int]] = {}
    for r in members:
        res = results.get(r)
        check = next((c for c in res.checks if c.tensor == out_name and c.digest), None) \
            if res is not None else None
        if check is not None:
            by_digest.setdefault(check.digest, []).append(r)
    if len(by_digest) <= 1:
        return []
    held = "; ".join(f"rank(s) {', '.join(map(str, rs))} hold {d}" for d, rs in
                     sorted(by_digest.items(), key=lambda kv: kv[1]))
    return [f"  ranks disagree on {out_name!r}, which {inst.op} must leave identical on every "
            f"member: {held}"]


def checked_text(results: dict[int, RankResult]) -> str:
    """What the value checks of a run that met every check verified, and nothing more: a case
    with ``expected: {}`` checks nothing, and must not be said to have "correct values"."""
    names = sorted({f"{c.tensor!r} ({c.expectation})" for r in results.values()
                    for c in r.checks})
    if not names:
        return "outputs were not checked"
    return "the checked buffers held what was expected: " + ", ".join(names)


def judge(inst: Instance, run: PoolRun, deadline_s: float) -> InstanceResult:
    """The outcome of one instance given what the pool observed."""
    exp = inst.expectation
    res = _judge(inst, run, deadline_s)
    stepverdicts.apply(inst, run.results, res)
    if run.kind == "done":
        numerics.apply(inst, run.results, res, disagreements(inst, run.results))
    ordering.apply(inst, run.results, res,
                   completed=run.kind == "done" and not _raised(run.results))
    if inst.deaths:  # a program through a failure: every rank accounted
        problems, res.deaths = deaths.account(inst, run)
        if any(not d["by_design"] for d in res.deaths["deaths"]):
            res.outcome = "crash"  # a death nobody planned, whatever the survivors did
        if problems:  # said whatever else went wrong; a pass it turns into a failure
            if res.outcome == "passed":
                res.outcome = "failed"
            res.message = (f"{inst.where()}: a planned death did not happen as planned\n"
                           + "\n".join(problems) + "\n" + res.message)
    res.evidence = evidence.gather(inst, run, res)
    if res.deaths.get("deaths") and res.outcome == "passed":
        res.evidence["deaths"] = [f"rank {d['rank']} {d['observed']} at step {d['step']} "
                                  f"({d['how']}), as planned" for d in res.deaths["deaths"]]
    evidence.require(inst, res)
    res.expected_kind = exp.kind
    res.reason = exp.reason
    if exp.xfail:
        if res.outcome == "passed":
            res.outcome = "xpass"
            res.message = f"{inst.where()}: passed, but was expected to fail: {exp.xfail}"
        elif res.outcome in BAD_OUTCOMES:
            res.message = f"expected failure ({exp.xfail}):\n{res.message}"
            res.outcome = "xfail"
        res.reason = exp.xfail
    if res.outcome == "passed" and exp.kind != "pass" and exp.reason:
        # Rejected, crashed or hung as an override declares for this backend: a limitation,
        # not a pass. (A case whose own contract is to raise or hang, such as misuse in
        # errors.yaml, passes when it does: that is what the contract says.)
        res.outcome = "limitation"
    known = sorted(c for c, v in res.ordering.items() if isinstance(v, dict) and v.get("known"))
    if res.outcome == "passed" and (exp.diverges or known):
        # The values or the ordering it met are what an override declares instead of the
        # contract: a declared divergence, counted with the limitations, never conformant.
        res.outcome = "limitation"
        res.reason = exp.diverges or res.ordering[known[0]]["known"]
        res.message += (f"\n  not conformant: passed only against what an override declares "
                        f"instead of the contract ({res.reason})")
    return res


def rank_outcomes(inst: Instance, run: PoolRun) -> dict[int, str]:
    """What every rank did: ``finished``, ``raised``, ``blocked`` (no answer by the deadline
    or the fail-fast grace) or ``died``."""
    states = {s.rank: s.state for s in run.states}
    out: dict[int, str] = {}
    for r in range(inst.world_size):
        res = run.results.get(r)
        if res is not None:
            out[r] = "raised" if res.status == "raised" else "finished"
        else:
            out[r] = "died" if states.get(r) == "died" else "blocked"
    return out


def _did(r: int, state: str, run: PoolRun) -> str:
    """One line: what rank ``r`` did."""
    if state == "raised":
        res = run.results[r]
        return f"rank {r} raised {res.exc_type} in step {res.step}: {res.exc_message[:200]}"
    st = next((s for s in run.states if s.rank == r), None)
    where = f" {where_rank_was(st)}" if st is not None and st.step_desc else ""
    if state == "died" and st is not None:
        how = f"killed by {st.signal}" if st.signal else f"exit code {st.exitcode}"
        return f"rank {r} died ({how}){where}"
    if state == "blocked":
        return f"rank {r} blocked{where}"
    return f"rank {r} finished"


def _every_rank(inst: Instance, run: PoolRun) -> str:
    return "\n".join("  " + _did(r, st, run) for r, st in rank_outcomes(inst, run).items())


def _judge(inst: Instance, run: PoolRun, deadline_s: float) -> InstanceResult:
    exp = inst.expectation
    ranks = [run.results[r] for r in sorted(run.results)]
    where = inst.where()
    states_text = "\n".join(describe_state(s, run.results, p2pwait.waiting(inst, s, run.states))
                            for s in run.states)
    if run.kind == "crash":
        died = [s for s in run.states if s.state == "died"]
        if exp.kind == "crashes":
            # A dead peer leaves the others anywhere (finished, raising a transport error,
            # blocked): each is recorded, none is required.
            return InstanceResult("passed", f"{where}: rank(s) {[s.rank for s in died]} crashed "
                                  f"as expected\n{_every_rank(inst, run)}", ranks, run.states)
        planned = {r for r, _, _ in inst.deaths}
        if planned:  # through a failure: say which death nobody planned
            undeclared = [s for s in died if s.rank not in planned]
            first = next((s for s in undeclared if s.step >= 0), None)
            where = inst.where(_step_line(inst, first.step)) if first is not None else where
            also = [s.rank for s in died if s.rank in planned]
            return InstanceResult(
                "crash", f"{where}: rank(s) {rank_ranges([s.rank for s in undeclared])} died "
                "undeclared (no fault step of the program plans it: a crash)"
                + (f"; rank(s) {rank_ranges(also)} died as planned" if also else "")
                + f"\n{states_text}", ranks, run.states)
        return InstanceResult("crash", f"{where}: rank(s) {', '.join(str(s.rank) for s in died)}"
                              f" died\n{states_text}", ranks, run.states)
    if run.kind == "hang":
        # No rank raised or died: each one finished or is blocked.
        blocked = [s.rank for s in run.states if s.state == "blocked"]
        if exp.kind == "hangs":
            return InstanceResult("passed", f"{where}: rank(s) {blocked} hung as expected "
                                  f"(detected after {deadline_s:g} s)\n{_every_rank(inst, run)}",
                                  ranks, run.states)
        if run.overdue:
            late = "; ".join(f"rank {r} still in step {s} ({_step_desc(inst, s)}) {t:.1f} s "
                             f"after it was seen entering it, past its bound of "
                             f"{inst.steps[s].raises_within:g} s" for r, s, t in run.overdue)
            where = inst.where(_step_line(inst, run.overdue[0][1]))
            return InstanceResult("hang", f"{where}: {late}\n{states_text}", ranks, run.states)
        line, waits = p2pwait.first_waiting(inst, run.states)
        return InstanceResult("hang", f"{inst.where(line)}: no result after the {deadline_s:g} s "
                              f"deadline; rank(s) {blocked} blocked"
                              + (f"; {waits}" if waits else "") + f"\n{states_text}",
                              ranks, run.states)
    raised = _raised(run.results)
    if exp.kind == "raises":
        return _check_raises(inst, raised, ranks, run)
    if raised:
        where = inst.where(_step_line(inst, raised[0].step))
        head = f"{where}: rank(s) {rank_ranges([r.rank for r in raised])} raised"
        if exp.kind in ("hangs", "crashes"):
            head += f" while {'a hang' if exp.kind == 'hangs' else 'a rank to crash'} was expected"
        parts = [head]
        # Ranks that raised the same thing in the same step share one block.
        groups: dict[tuple[int, str, str, str], list[int]] = {}
        for r in raised:
            key = (r.step, r.exc_type, r.exc_message, trim_traceback(r.traceback))
            groups.setdefault(key, []).append(r.rank)
        for (step, exc_type, message, tb), members in groups.items():
            who = f"rank {members[0]}" if len(members) == 1 else f"ranks {rank_ranges(members)}"
            parts.append(f"  {who}: {exc_type}: {message}\n"
                         f"    in step {step}: {_step_desc(inst, step)}\n{_indent(_tb(tb))}")
        others = [s for s in run.states if s.state != "raised"]
        if others:
            parts.append("  other ranks (stopped once each was blocked, idle, in a collective "
                         "that a rank which raised can no longer join):" if run.stranded else
                         "  other ranks (stopped after the fail-fast grace period):")
            parts.extend(describe_state(s, run.results) for s in others)
        else:
            parts.extend(f"  rank {r.rank}: finished" for r in ranks if r.status == "ok")
        return InstanceResult("error", "\n".join(parts), ranks, run.states)
    if exp.kind != "pass":
        what = {"hangs": "a hang", "crashes": "a rank to crash"}[exp.kind]
        why = f" ({exp.reason})" if exp.reason else ""
        bad = _value_failures(inst, run.results)
        return InstanceResult("failed", f"{where}: expected {what}{why}, but every rank "
                              "completed without raising"
                              + ("; values:\n" + "\n".join(bad) if bad else
                                 f"; {checked_text(run.results)}"), ranks, run.states)
    bad = _value_failures(inst, run.results)
    split = disagreements(inst, run.results)
    if bad or split:
        wrong_ranks = sorted({r.rank for r in ranks if any(not c.ok for c in r.checks)})
        head = (f"wrong values on rank(s) {rank_ranges(wrong_ranks)}" if wrong_ranks
                else "ranks disagree")
        where = inst.where(_value_line(inst, run.results))
        return InstanceResult("failed", f"{where}: {head}\n" + "\n".join(bad + split),
                              ranks, run.states)
    return InstanceResult("passed", f"{where}: passed", ranks, run.states)


def _check_raises(inst: Instance, raised: list[RankResult], ranks: list[RankResult],
                  run: PoolRun) -> InstanceResult:
    """``raises``: every rank is accounted for.

    The ranks in ``ranks`` (every rank when not given: every member of the op's group in the
    ``op:`` form with ``args: {group: ...}``) must raise an error matching the pattern; every
    other rank must do one of ``others`` (by default finish, or raise a matching error), and
    a rank outside the op's group may always finish (it never calls the op); a rank that
    dies makes it a crash.
    """
    exp = inst.expectation
    where = inst.where()
    dead = {r for r, _, _ in inst.deaths}  # accounted apart (harness.verdict.deaths)
    did = {r: s for r, s in rank_outcomes(inst, run).items() if r not in dead}
    group = dict(inst.steps[0].args).get("group") if inst.shorthand is not None else None
    outside = set(did) - set(group) if isinstance(group, tuple) else set()
    must = set(exp.ranks) if exp.ranks is not None else set(did) - outside
    lines: list[str] = []
    wrong: set[str] = set()  # the states of the ranks that broke the expectation
    for r, state in did.items():
        problem = ""
        if state == "raised":
            res = run.results[r]
            if not patterns.search(exp.match, f"{res.exc_type}: {res.exc_message}"):
                problem = "does not match the pattern"
            elif r not in must and "raised" not in exp.others:
                problem = f"not allowed: the other ranks may only {_may(exp.others)}"
        elif r in must:
            problem = "expected to raise"
        elif state not in exp.others and not (r in outside and state == "finished"):
            problem = f"not allowed: the other ranks may only {_may(exp.others)}"
        if problem:
            wrong.add(state)
        lines.append(f"  {_did(r, state, run)}" + (f"  <- {problem}" if problem else ""))
    for r in sorted(must - set(did)):  # a rank the world does not have can never raise
        lines.append(f"  rank {r} does not exist in a world of {inst.world_size}  <- expected "
                     "to raise")
        wrong.add("finished")
    who = (f"rank(s) {', '.join(map(str, exp.ranks))}" if exp.ranks is not None else
           f"every member of the group {sorted(must)}" if outside else "every rank")
    if wrong:
        if not raised:  # say what was verified of a run that finished, and nothing more
            bad = _value_failures(inst, run.results)
            lines.append("  no rank raised; values:\n" + "\n".join(bad) if bad else
                         f"  no rank raised; {checked_text(run.results)}")
        outcome: Outcome = "hang" if "blocked" in wrong else "failed"
        lines += [f"  rank {st.rank} last output (stdout and stderr, escaped):\n"
                  + _indent(st.stderr_tail) for st in run.states
                  if st.state in ("blocked", "died") and st.stderr_tail]
        head = (f"{where}: not rejected: {exp.reason}, yet no error on {who} (a "
                "declared-unsupported call must raise, never hang or compute)"
                if exp.unsupported else
                f"{where}: expected {who} to raise an error matching {exp.match!r}"
                + (f" (the others may {_may(exp.others)})" if exp.ranks is not None else ""))
        return InstanceResult(outcome, head + "\n" + "\n".join(lines), ranks, run.states)
    return InstanceResult("passed", f"{where}: {who} raised as expected: {raised[0].exc_type}: "
                          f"{raised[0].exc_message[:200]}\n" + "\n".join(lines),
                          ranks, run.states)


def _may(others: tuple[str, ...]) -> str:
    words = {"finished": "finish", "raised": "raise a matching error", "blocked": "block"}
    return " or ".join(words[o] for o in others)
