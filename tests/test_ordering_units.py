"""Unit tests of the ordering checks: case syntax, planning and verdicts (no ranks started)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from harness.casefile import expand, overrides, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Instance, InstanceResult, RankResult, StepEvent
from harness.ordering import plan as ordering
from harness.ordering import verdicts
from harness.report import ordering_table


def _instances(text: str, backend: str = "gloo") -> list[Instance]:
    doc = yamlload.load_text(text, "case.yaml")
    return [i for c in validate.load_cases(doc) for i in expand.expand(c, backend)]


def _errors(text: str) -> list[str]:
    with pytest.raises(CaseFileErrors) as info:
        _instances(text)
    return [str(e) for e in info.value.errors]


PROGRAM = """
cases:
  - name: prog
    world_size: 2
    tensors:
      t: {shape: [3], init: zeros}
    steps:
%s
    expected: {t: 0}
"""


def _program(*steps: str, extra: str = "") -> str:
    return PROGRAM.replace("    world_size: 2\n", "    world_size: 2\n" + extra) % "\n".join(
        "      - " + s for s in steps)


def test_bad_ordering_steps_are_collection_errors_with_positions() -> None:
    errs = _errors(_program("{op: all_reduce, tensor: t, handle: h, thread: true, stream: side}",
                            "{read: u, expect: auto}",
                            "{write: t, delay: 0.1}",
                            "{future: nope}",
                            "{read: t, delay: 1}"))
    def at(line: int, message: str) -> bool:
        return any(e.startswith(f"case.yaml:{line}:") and message in e for e in errs)

    assert at(8, "'thread' does not apply to an op step")
    assert at(8, "'stream: side' needs CUDA tensors")
    assert at(9, "unknown tensor 'u'")
    assert at(9, "'auto' cannot be used in a snapshot expectation")
    assert at(10, "a write step needs 'value: FILL'")
    assert at(11, "no earlier step has handle 'nope'")
    assert at(12, "'delay' does not apply to a read step")
    assert len(errs) == 7


def test_write_value_must_cover_the_ranks_that_run_it() -> None:
    with pytest.raises(CaseFileError) as info:
        _instances(_program("{write: t, value: {0: 1}, ranks: [0, 1]}",
                            "{op: all_reduce, tensor: t}"))
    assert str(info.value).startswith("case.yaml:8:27: at cases[0].steps[0].value: no value "
                                      "for rank(s) 1")
    # Rank 1 does not run the step: nothing to cover.
    assert _instances(_program("{write: t, value: {0: 1}, ranks: [0]}",
                               "{op: all_reduce, tensor: t}"))


def test_ordering_steps_expand_to_typed_steps() -> None:
    inst, = _instances(_program(
        "{delay_stream: 0.05, ranks: [1]}",
        "{write: t, value: \"rank + i\", delay: 0.02}",
        "{op: all_reduce, tensor: t, async: true, handle: h}",
        "{read: t, as: early, expect: {0: stale, others: unspecified}}",
        "{future: h, tensor: t, expect: final}",
        "{wait: h, thread: true}",
        "{read: t}"))
    kinds = [s.kind for s in inst.steps]
    assert kinds == ["delay_stream", "write", "op", "read", "future", "wait", "read"]
    delay, write, _, early, fut, wait, plain = inst.steps
    assert delay.value == 0.05 and delay.ranks == (1,)
    assert write.value.kind == "expr" and dict(write.args) == {"delay": 0.02}
    assert early.handle == "early" and early.value.for_rank(0).kind == "stale"
    assert early.value.for_rank(1).kind == "unspecified"
    assert fut.waits == ("h",) and fut.value.kind == "final" and fut.bufs == (("tensor", "t"),)
    assert dict(wait.args) == {"thread": True}
    assert plain.value is None and plain.handle == "t@step6"
    assert inst.ordering is not None and inst.ordering.declared and inst.ordering.async_steps


SHORTHAND = """
cases:
  - name: ar
    op: %s
    world_size: [2, 4]
    dtype: [float32, int64]
    async: [false, true]
    shape: [4]
    input: "rank + i"
%s
"""


def test_probes_are_planned_on_one_async_instance_per_world_size() -> None:
    insts = _instances(SHORTHAND % ("all_reduce", ""))
    planned = [i for i in insts if i.ordering is not None]
    assert all(i.async_op for i in planned) and len(planned) == 4
    sampled = sorted(i.id for i in planned if i.ordering and i.ordering.sampled)
    assert sampled == ["gloo-ws2-float32-sum-async", "gloo-ws4-float32-sum-async"]


def _Config(mode: str | None, delay: float | None) -> ordering.OrderingSettings:
    """The settings a session with ``--ordering mode --ordering-delay delay`` has."""
    return ordering.OrderingSettings(mode or "auto",
                                     0.02 if delay is None else delay)


@pytest.mark.parametrize(("case_mode", "option", "probed"), [
    ("", None, 2), ("    ordering: all", None, 4), ("    ordering: none", None, 0),
    ("    ordering: none", "all", 4), ("", "none", 0)])
def test_probe_mode_from_case_and_option(case_mode: str, option: str | None,
                                         probed: int) -> None:
    insts = _instances(SHORTHAND % ("all_reduce", case_mode))
    config: Any = _Config(option, 0.05)
    done = [ordering.configure(i, config) for i in insts]
    assert sum(1 for i in done if i.ordering and i.ordering.probes) == probed
    assert all(i.ordering.delay_s == 0.05 for i in done if i.ordering)


def test_raising_instances_get_no_probes() -> None:
    inst = next(i for i in _instances(SHORTHAND % ("all_reduce", "    ordering: all"))
                if i.async_op)
    raising = replace(inst, expectation=replace(inst.expectation, kind="raises"))
    configured = ordering.configure(raising, _Config(None, None))
    assert configured.ordering is not None and not configured.ordering.probes


@pytest.mark.parametrize(("op", "args", "ws", "rank"), [
    ("all_reduce", "", 4, 3), ("broadcast", "    args: {src: 1}", 2, 1),
    ("reduce", "    args: {dst: 1}", 2, 0), ("all_reduce", "    args: {group: [0, 2]}", 4, 2)])
def test_delayed_rank_is_one_every_other_member_depends_on(op: str, args: str, ws: int,
                                                          rank: int) -> None:
    text = (SHORTHAND % (op, args)).replace("world_size: [2, 4]", f"world_size: {ws}")
    inst = next(i for i in _instances(text) if i.async_op)
    assert inst.ordering is not None and inst.ordering.delayed_rank == rank


# -- verdicts ---------------------------------------------------------------------------------

def _probed() -> Instance:
    inst = next(i for i in _instances(SHORTHAND % ("all_reduce", "    ordering: all"))
                if i.async_op and i.world_size == 2)
    return ordering.configure(inst, _Config(None, 0.1))


def _obs(**over: Any) -> dict[str, Any]:
    post = {"delayed": False, "checked": True, "completed_at_return": False,
            "at_return_ok": None, "at_return_wrong": "", "completed_after_wait": True,
            "completed_after_sync": None, "immediate_ok": True, "immediate_wrong": "",
            "settled_ok": True, "settled_wrong": ""}
    pre = {"ok": True, "checked": True, "wrong": ""}
    hb = {"delayed": False, "observer": True, "return_s": 0.1, "immediate_ok": True,
          "immediate_wrong": ""}
    probes: dict[str, dict[str, Any]] = {"post": post, "pre": pre, "hb": hb}
    for key, value in over.items():
        probe, field = key.split("__")
        probes[probe][field] = value
    return {"probes": {"post_wait": post, "pre_op": pre, "host_blocking": hb}}


def _results(rank0: dict[str, Any], events: list[StepEvent] | None = None
             ) -> dict[int, RankResult]:
    r0 = RankResult(0, "ok", events=events or [], ordering=rank0)
    r1 = RankResult(1, "ok", ordering=_obs(post__delayed=True, hb__delayed=True,
                                           hb__observer=False, hb__return_s=0.0))
    return {0: r0, 1: r1}


def _status(v: dict[str, Any]) -> dict[str, str]:
    return {c: v[c]["status"] for c in verdicts.CHECKS}


def test_faithful_observations_are_all_ok() -> None:
    v = verdicts.judge(_probed(), _results(_obs()))
    assert _status(v) == {"pre_op": "ok", "post_wait": "ok", "completion": "ok",
                          "host_blocking": "ok", "declared": "n/a"}
    assert v["host_blocking"]["observed"] == "blocks" and v["delayed_rank"] == 1


def test_stale_read_after_wait_violates_post_wait_only() -> None:
    v = verdicts.judge(_probed(), _results(_obs(post__immediate_ok=False,
                                                post__immediate_wrong="4 of 4 wrong")))
    assert _status(v)["post_wait"] == "violated" and "4 of 4 wrong" in v["post_wait"]["detail"]
    assert _status(v)["pre_op"] == "ok" and _status(v)["completion"] == "ok"


def test_wrong_values_without_delays_make_probes_inconclusive() -> None:
    v = verdicts.judge(_probed(), _results(_obs(post__settled_ok=False, pre__ok=False,
                                                post__immediate_ok=False,
                                                post__settled_wrong="off by one")))
    assert _status(v)["pre_op"] == "inconclusive" and _status(v)["post_wait"] == "inconclusive"
    assert "off by one" in v["pre_op"]["detail"]


def test_completion_true_at_return_without_the_result_is_violated() -> None:
    v = verdicts.judge(_probed(), _results(_obs(post__completed_at_return=True,
                                                post__at_return_ok=False,
                                                post__at_return_wrong="nan")))
    assert _status(v)["completion"] == "violated" and "True when the call returned" in (
        v["completion"]["detail"])
    honest = verdicts.judge(_probed(), _results(_obs(post__completed_at_return=True,
                                                     post__at_return_ok=True)))
    assert _status(honest)["completion"] == "ok"


def test_completion_false_after_wait_in_the_timeline_is_violated() -> None:
    ev = StepEvent(0, "all_reduce(tensor=input)", 0.0, 0.001, completed_at_return=False,
                   t_wait_return=0.002, completed_after_wait=False)
    v = verdicts.judge(_probed(), _results(_obs(), [ev]))
    assert _status(v)["completion"] == "violated" and "step 0" in v["completion"]["detail"]


def test_pre_op_violation_and_blocking_property() -> None:
    v = verdicts.judge(_probed(), _results(_obs(pre__ok=False, pre__wrong="nan",
                                                hb__return_s=0.001)))
    assert _status(v)["pre_op"] == "violated"
    assert v["host_blocking"]["observed"] == "returns_early"
    assert _status(v)["host_blocking"] == "ok"  # returning early is allowed; stale data is not


def test_violation_fails_a_passing_instance_with_a_clear_message() -> None:
    inst = _probed()
    res = InstanceResult("passed", "passed")
    verdicts.apply(inst, _results(_obs(pre__ok=False, pre__wrong="nan")), res, completed=True)
    assert res.outcome == "failed"
    assert "case.yaml:3: ar[gloo-ws2-float32-sum-async]: async contract violated (pre_op); " \
           "the buffers' final values were right" in res.message
    wrong = InstanceResult("failed", "wrong values")
    verdicts.apply(inst, _results(_obs(post__immediate_ok=False)), wrong, completed=True)
    assert wrong.outcome == "failed" and "async contract violated too" in wrong.message


def test_override_documents_a_known_ordering_divergence() -> None:
    text = (SHORTHAND % ("all_reduce", "    ordering: all\n    overrides:\n"
                         "      - when: {backend: gloo, world_size: 2}\n"
                         "        ordering: [completion]\n"
                         "        reason: Work never reports completion"))
    insts = [i for i in _instances(text) if i.async_op]
    config: Any = _Config(None, 0.1)
    ws2, ws4 = (ordering.configure(overrides.resolve(i, "2.13.0"), config) for i in
                sorted(insts, key=lambda i: i.world_size)[::2])
    assert ws2.ordering is not None and ws2.ordering.known == (
        ("completion", "Work never reports completion"),)
    assert ws4.ordering is not None and ws4.ordering.known == ()
    res = InstanceResult("passed", "passed")
    never = _results(_obs(post__completed_after_wait=False))
    verdicts.apply(ws2, never, res, completed=True)
    assert res.outcome == "passed"
    assert res.ordering["completion"]["status"] == "violated"
    assert res.ordering["completion"]["known"] == "Work never reports completion"
    res4 = InstanceResult("passed", "passed")
    verdicts.apply(ws4, never, res4, completed=True)
    assert res4.outcome == "failed" and "known" not in res4.ordering["completion"]


def test_declared_snapshot_mismatch_is_violated() -> None:
    inst, = _instances(_program("{op: all_reduce, tensor: t, async: true, handle: h}",
                                "{read: t, as: early, expect: stale}", "{wait: h}"))
    reads = [{"name": "early", "tensor": "t", "step": 1, "kind": "read", "expect": "stale",
              "digest": "", "ok": False, "wrong": 3, "total": 3, "wrong_text": "3 of 3 wrong"}]
    results = {0: RankResult(0, "ok", ordering={"reads": reads}), 1: RankResult(1, "ok")}
    v = verdicts.judge(inst, results)
    assert _status(v)["declared"] == "violated" and "rank 0: early" in v["declared"]["detail"]


def test_async_contract_table_counts_per_op() -> None:
    ok = {"status": "ok", "detail": ""}
    bad = {"status": "violated", "detail": ""}
    na = {"status": "n/a", "detail": ""}
    recs = [{"op": "all_reduce", "ordering": {
        "pre_op": ok, "post_wait": bad, "completion": ok, "declared": na, "probes": True,
        "delay_s": 0.02, "delayed_rank": 1,
        "host_blocking": {**ok, "observed": "blocks"}}} for _ in range(2)]
    recs.append({"op": "barrier"})
    lines = ordering_table.render(recs)
    assert lines[0] == "## Async contract"
    row = next(ln for ln in lines if ln.startswith("| all_reduce"))
    assert row == ("| all_reduce | 2 | ✅\u00a02 | ❌\u00a02 | ✅\u00a02 | ✅\u00a02 | - "
                   "| blocks x2 |")
    assert ordering_table.render([{"op": "barrier"}]) == []


def test_completion_without_any_observed_value_is_not_ok() -> None:
    """A label is written only when observed: no is_completed() value, no "ok"."""
    results = _results(_obs(post__completed_after_wait=None))
    results[1].ordering["probes"]["post_wait"]["completed_after_wait"] = None
    v = verdicts.judge(_probed(), results)
    assert _status(v)["completion"] == "n/a"
    assert "no is_completed() value was observed" in v["completion"]["detail"]


class _NeverCompletes:
    """A Work whose is_completed() stays False (Gloo's reduce_scatter on torch 2.13)."""

    def __init__(self, completes_after: int | None = None) -> None:
        self.polls = 0
        self.completes_after = completes_after

    def is_completed(self) -> bool:
        self.polls += 1
        return self.completes_after is not None and self.polls > self.completes_after


def test_settle_ends_when_the_output_is_right_but_waits_out_a_wrong_one() -> None:
    import time

    from harness.program.timeline import Device

    dev = Device("cpu", settle_s=0.3)
    checks: list[bool] = []

    def right() -> bool:
        checks.append(True)
        return True

    work = _NeverCompletes()
    dev.settle(work, right)
    assert checks == [True] and work.polls == 1  # one check, then done

    # A result that never becomes right keeps the whole settle time for a late landing.
    wrong_checks: list[bool] = []

    def wrong() -> bool:
        wrong_checks.append(False)
        return False

    t0 = time.monotonic()
    dev.settle(_NeverCompletes(), wrong)
    assert time.monotonic() - t0 >= 0.3 and len(wrong_checks) > 1

    # A Work that reports completion settles on that signal; the values are not consulted.
    checks.clear()
    dev.settle(_NeverCompletes(completes_after=0), right)
    assert checks == []
