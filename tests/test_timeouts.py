"""Timeouts, step-level ``raises``, ``blocks_until_all``, ``group_timeout``, ``set_timeout``
and ``destroy``: validation at its line, expansion, the parent's judgement of what ranks
observed, and real runs (Gloo, and the mutant backend whose barrier does not wait).

No test here sleeps: the sleeps and timeouts are inside the cases, as the behaviour under test.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Instance, InstanceResult, RankResult
from harness.mutate import faults
from harness.verdict import steps as stepverdicts

from .helpers import HANG_S, load_report

ROOT = Path(__file__).resolve().parent.parent


def instances(steps: str, extra: str = "", backend: str = "gloo") -> list[Instance]:
    text = textwrap.dedent("""
    cases:
      - name: t
        world_size: 2
        tensors:
          t: {shape: [2], init: 1}
        expected: {}
    """) + textwrap.indent(textwrap.dedent(extra), "    ") + "    steps:\n" + textwrap.indent(
        textwrap.dedent(steps), "      ")
    doc = yamlload.load_text(text, "cases/x.yaml")
    out: list[Instance] = []
    for case in validate.load_cases(doc):
        out.extend(expand.expand(case, backend))
    return out


def test_step_keys_reach_the_steps_and_imply_a_private_pool() -> None:
    (inst,) = instances("""
    - {op: barrier, group: [0, 1], group_timeout: 1.5, ranks: [0],
       raises: {match: "Timed out", not_before: 1}}
    - {op: barrier, blocks_until_all: true}
    - {set_timeout: 2, group: [0, 1], group_timeout: 1.5}
    - {destroy: true}
    - {op: all_reduce, tensor: t, raises: ValueError}
    """)
    s0, s1, s2, s3, s4 = inst.steps
    assert dict(s0.args)["group_timeout"] == 1.5
    assert (s0.raises, s0.raises_not_before) == ("Timed out", 1.0)
    assert s1.blocks_until_all and s1.raises is None
    assert (s2.kind, s2.value, dict(s2.args)) == ("set_timeout", 2.0,
                                                  {"group": (0, 1), "group_timeout": 1.5})
    assert (s3.kind, s3.args) == ("destroy", ())
    assert (s4.raises, s4.raises_not_before) == ("ValueError", None)
    assert inst.isolate
    (plain,) = instances("- {op: barrier, blocks_until_all: true}\n")
    assert not plain.isolate  # timing alone does not need a private pool


@pytest.mark.parametrize(("steps", "message"), [
    ("- {op: barrier, group_timeout: 1}\n", "'group_timeout' needs 'group:'"),
    ("- {op: all_reduce, tensor: t, blocks_until_all: true}\n",
     "'blocks_until_all' is the contract of a barrier"),
    ("- {sleep: 1, raises: x}\n", "'raises' does not apply to a sleep step"),
    ("- {op: barrier, raises: \"(a\"}\n", "bad pattern"),
    ("- {op: barrier, raises: {match: x, not_before: 0}}\n", "less than or equal to"),
    ("- {set_timeout: -1}\n", "less than or equal to"),
    ("- {destroy: false}\n", "True was expected"),
    ("- {op: barrier, repeat: 2, raises: x}\n", "a step that must raise cannot be repeated"),
    ("- {sleep: 1, blocks_until_all: true}\n", "does not apply to a sleep step"),
    ("- {op: barrier, async: true, handle: a}\n- {op: barrier, async: true, handle: b}\n"
     "- {wait: [a, b], raises: x}\n", "a wait that must raise waits one handle"),
    ("- {op: barrier, async: true, handle: a}\n- {wait: a, thread: true, raises: x}\n",
     "cannot run in another thread"),
])
def test_bad_step_keys_are_reported_at_their_line(steps: str, message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(steps)
    text = str(info.value)
    assert message in text, text
    assert "cases/x.yaml:" in text


def _inst(steps: str) -> Instance:
    (inst,) = instances(steps)
    return inst


def _passed() -> InstanceResult:
    return InstanceResult("passed", "cases/x.yaml:2: t[id]: passed")


def test_a_matching_error_no_earlier_than_its_bound_passes_and_says_what_was_seen() -> None:
    inst = _inst("- {op: barrier, ranks: [0], raises: {match: \"Timed out\", not_before: 1}}\n")
    rr = RankResult(rank=0, status="ok", step_errors=[
        {"step": 0, "raised": True, "type": "RuntimeError", "message": "Timed out waiting",
         "after_s": 1.013}])
    res = _passed()
    stepverdicts.apply(inst, {0: rr, 1: RankResult(rank=1, status="ok")}, res)
    assert res.outcome == "passed"
    assert "after 1.013 s raised RuntimeError: Timed out waiting" in res.message
    assert rr.checks[0].ok and rr.checks[0].expectation == "raises"


@pytest.mark.parametrize(("obs", "why"), [
    ({"raised": True, "type": "RuntimeError", "message": "Timed out", "after_s": 0.42},
     "earlier than the 1 s"),
    ({"raised": True, "type": "RuntimeError", "message": "Connection reset", "after_s": 1.2},
     "does not match the pattern"),
    ({"raised": False, "after_s": 1.5}, "without raising"),
])
def test_an_early_wrong_or_missing_error_fails_at_the_step_line(obs: dict[str, Any],
                                                                why: str) -> None:
    inst = _inst("- {op: barrier, ranks: [0], raises: {match: \"Timed out\", not_before: 1}}\n")
    res = _passed()
    stepverdicts.apply(inst, {0: RankResult(rank=0, status="ok",
                                            step_errors=[{"step": 0, **obs}])}, res)
    assert res.outcome == "failed"
    assert why in res.message
    assert res.message.startswith(f"cases/x.yaml:{inst.steps[0].line}:")


def _timing(host: str, enter: float, done: float | None) -> dict[str, Any]:
    return {"clock": "CLOCK_MONOTONIC", "host": host,
            "steps": {"0": {"enter": enter, "done": done}}}


def test_a_barrier_that_returns_before_the_last_entry_fails_with_the_times() -> None:
    inst = _inst("- {op: barrier, blocks_until_all: true}\n")
    results = {0: RankResult(rank=0, status="ok", timing=_timing("h", 100.3, 100.301)),
               1: RankResult(rank=1, status="ok", timing=_timing("h", 100.0, 100.001))}
    res = _passed()
    stepverdicts.apply(inst, results, res)
    assert res.outcome == "failed"
    assert "last entry rank 0 at +0.300 s" in res.message
    assert "rank 1 at +0.001 s" in res.message
    assert "rank(s) 1 saw it complete before rank 0 entered it" in res.message


def test_a_barrier_that_waits_passes_and_the_message_keeps_the_times() -> None:
    inst = _inst("- {op: barrier, blocks_until_all: true}\n")
    results = {0: RankResult(rank=0, status="ok", timing=_timing("h", 100.3, 100.301)),
               1: RankResult(rank=1, status="ok", timing=_timing("h", 100.0, 100.302))}
    res = _passed()
    stepverdicts.apply(inst, results, res)
    assert res.outcome == "passed"
    assert "completed on rank 0 at +0.301 s, rank 1 at +0.302 s" in res.message
    assert "no rank saw it complete before the last rank entered it" in res.message


def test_clocks_of_two_hosts_are_never_compared() -> None:
    inst = _inst("- {op: barrier, blocks_until_all: true}\n")
    results = {0: RankResult(rank=0, status="ok", timing=_timing("a", 100.3, 100.301)),
               1: RankResult(rank=1, status="ok", timing=_timing("b", 5.0, 5.001))}
    res = _passed()
    stepverdicts.apply(inst, results, res)
    assert res.outcome == "error"
    assert "2 hosts" in res.message and "nothing was judged" in res.message


def test_a_verdict_that_is_no_pass_is_left_alone() -> None:
    inst = _inst("- {op: barrier, blocks_until_all: true}\n")
    res = InstanceResult("hang", "hung")
    stepverdicts.apply(inst, {0: RankResult(rank=0, status="ok",
                                            timing=_timing("h", 1.0, 0.5))}, res)
    assert (res.outcome, res.message) == ("hang", "hung")


CASES = """
cases:
  - name: timeout_raises_not_early
    backends: [gloo]
    world_size: 2
    pg_timeout: 1
    deadline: 20
    steps:
      - {op: barrier, ranks: [0], raises: {match: "Timed out", not_before: 1}}
    expected: {}
  - name: timeout_is_not_that_late
    backends: [gloo]
    world_size: 2
    pg_timeout: 1
    deadline: 20
    steps:
      - {op: barrier, ranks: [0], raises: {match: "Timed out", not_before: 30}}
    expected: {}
  - name: missing_error
    world_size: 2
    tensors:
      t: {shape: [2], init: 1}
    steps:
      - {op: all_reduce, tensor: t, raises: "anything"}
    expected:
      t: 2
  - name: destroyed_world
    world_size: 2
    tensors:
      t: {shape: [2], init: 1}
    steps:
      - {destroy: true}
      - {op: all_reduce, tensor: t, raises: "ValueError: Default process group"}
      - {op: barrier, raises: "ValueError"}
    expected: {}
  - name: barrier_waits
    world_size: 2
    steps:
      - {sleep: 0.2, ranks: [1]}
      - {op: barrier, blocks_until_all: true}
    expected: {}
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
         *args: str) -> dict[str, dict[str, Any]]:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    (pytester.path / "cases").mkdir()
    (pytester.path / "cases" / "t.yaml").write_text(CASES)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "cases", "--deadline", "30", "--report-json", str(report), "--report-md",
        str(pytester.path / "r.md"), "--report-html", str(pytester.path / "r.html"),
        "-p", "no:cacheprovider", "-q", *args, timeout=HANG_S)
    assert report.exists(), result.stdout.str()[-3000:]
    return {r["case"]: r for r in load_report(report)["records"]}  # schema-valid


def test_real_runs_on_gloo(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    by = _run(pytester, monkeypatch)
    ok = by["timeout_raises_not_early"]
    assert ok["outcome"] == "passed", ok["message"]
    check = next(c for c in ok["ranks"][0]["checks"] if c["expectation"] == "raises")
    after = float(check["note"].split("after ")[1].split(" s")[0])
    assert after >= 1.0  # what the record says was observed, and the bound it met
    late = by["timeout_is_not_that_late"]
    assert late["outcome"] == "failed" and "earlier than the 30 s" in late["message"]
    assert by["missing_error"]["outcome"] == "failed"
    assert "without raising" in by["missing_error"]["message"]
    destroyed = by["destroyed_world"]
    assert destroyed["outcome"] == "passed", destroyed["message"]
    assert destroyed["message"].count("raised ValueError: Default process group") == 4
    waits = by["barrier_waits"]
    assert waits["outcome"] == "passed" and "last entry rank 1" in waits["message"]
    # The raw readings behind the verdict are in the record, and they say what it says.
    marks = [r["timing"]["steps"]["1"] for r in waits["ranks"]]
    assert {r["timing"]["clock"] for r in waits["ranks"]} == {"CLOCK_MONOTONIC"}
    assert min(m["done"] for m in marks) >= max(m["enter"] for m in marks)


def test_a_barrier_that_does_not_wait_is_caught(pytester: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "barrier_no_wait")
    by = _run(pytester, monkeypatch, "--backend-module", faults.BACKEND_MODULE, "--backend",
              faults.BACKEND, "-k", "barrier_waits")
    rec = by["barrier_waits"]
    assert rec["outcome"] == "failed"
    assert "rank(s) 0 saw it complete before rank 1 entered it" in rec["message"]


def test_skips_where_set_timeout_is_missing_or_the_world_would_be_destroyed() -> None:
    import torch.distributed as dist

    from harness.run.capabilities import Capabilities

    (setter,) = instances("- {set_timeout: 1}\n")
    (destroyer,) = instances("- {destroy: true}\n")
    (sub,) = instances("- {destroy: true, group: [0, 1]}\n")
    real = Capabilities.of_modules("x", 0, dist, SimpleNamespace(float32=1))
    # The installed torch decides the set_timeout step (2.4.1's ProcessGroup has none).
    assert real.skip_reason(setter) == ("" if hasattr(dist.ProcessGroup, "set_timeout") else
                                        "torch x's ProcessGroup has no set_timeout "
                                        "(the set_timeout step)")
    assert real.skip_reason(destroyer) == ""
    assert "external-ranks mode" in real.skip_reason(destroyer, local_rank=0)
    assert real.skip_reason(sub, local_rank=0) == ""  # a subgroup may go
    (timed,) = instances("- {op: barrier}\n", "pg_timeout: 1\n")
    assert real.skip_reason(timed) == ""
    assert "external-ranks mode runs every instance" in real.skip_reason(timed, local_rank=0)
    old = SimpleNamespace(ProcessGroup=object, is_backend_available=lambda b: True)
    caps = Capabilities.of_modules("1.0", 0, old, SimpleNamespace(float32=1))
    assert caps.skip_reason(setter) == ("torch 1.0's ProcessGroup has no set_timeout "
                                        "(the set_timeout step)")
