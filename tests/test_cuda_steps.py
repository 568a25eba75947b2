"""CUDA-only steps (capture/replay, wait_stream, block_current_stream) and future chains.

No GPU is needed: what can be checked without one is checked here (the format, the skips and
their reasons, that a CUDA step reached on a CPU rank raises instead of passing, and the
capture/replay wiring against a stand-in for ``torch.cuda.graph``). The bundled
``cases/cuda.yaml`` runs the real thing on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Instance, Step
from harness.program import graphs as graphs_mod
from harness.run import capabilities, torchfacts

from .helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = """
cases:
  - name: p
    device: cuda
    world_size: 2
    tensors:
      t: {{shape: [4], init: 1}}
    steps:
{steps}
    expected: {{t: 2}}
"""


def _instances(text: str, backend: str = "gloo") -> list[Instance]:
    doc = yamlload.load_text(textwrap.dedent(text), "cases/x.yaml")
    out: list[Instance] = []
    for case in validate.load_cases(doc):
        out.extend(expand.expand(case, backend))
    return out


def _program(steps: str, **kw: str) -> list[Instance]:
    text = textwrap.dedent(PROGRAM).format(steps=textwrap.indent(textwrap.dedent(steps),
                                                                 "      "))
    for key, value in kw.items():
        text = text.replace("    world_size: 2\n", f"    world_size: 2\n    {key}: {value}\n")
    return _instances(text)


GOOD = """
- {op: all_reduce, tensor: t}
- capture: g
  steps:
    - {op: all_reduce, tensor: t}
    - {op: all_reduce, tensor: t, async: true, handle: a}
    - {wait: a}
    - {op: broadcast, tensor: t, src: "world_size - 1"}
- {replay: g, times: 3}
- {op: all_reduce, tensor: t, async: true, handle: h, stream: side}
- {block_current_stream: h}
- {wait_stream: side}
- {wait: h}
"""


def test_cuda_steps_expand_into_steps_with_their_captured_ops() -> None:
    (inst,) = _program(GOOD)
    kinds = [s.kind for s in inst.steps]
    assert kinds == ["op", "capture", "replay", "op", "block_current_stream", "wait_stream",
                     "wait"]
    capture = inst.steps[1]
    assert capture.handle == "g" and [s.kind for s in capture.steps] == ["op", "op", "wait",
                                                                         "op"]
    assert capture.steps[1].async_op and capture.steps[1].handle == "a"
    src = dict(capture.steps[3].args)["src"]
    assert src({"world_size": 2, "rank": 0}) == 1  # expressions inside a capture are parsed
    assert capture.steps[0].line == capture.line + 2  # each captured step has its own line
    assert inst.steps[2].waits == ("g",) and inst.steps[2].value == 3
    assert inst.steps[4].waits == ("h",) and inst.steps[5].value == "side"
    assert "capture(g: 4 step(s))" in capture.describe()


@pytest.mark.parametrize(("steps", "message", "line"), [
    ("- {replay: g}", "no earlier step captures graph 'g'", 9),
    ("- {capture: g}", "a capture step needs 'steps: [...]'", 9),
    ("- capture: g\n  steps: [{read: t}]", "a capture records op and wait steps only, not "
     "'read'", 10),
    ("- capture: g\n  steps: [{op: all_reduce, tensor: t, async: true, handle: a}]",
     "handle 'a' is never waited inside capture 'g'", 10),
    ("- capture: g\n  steps: [{op: all_reduce, tensor: t, async: true, handle: a}, "
     "{wait: a}]\n- {wait: a}", "handle 'a' was issued inside capture 'g'", 11),
    ("- {op: all_reduce, tensor: t, async: true, handle: h}\n- capture: g\n  steps: "
     "[{wait: h}]", "no earlier step of capture 'g' has handle 'h'", 11),
    ("- capture: g\n  steps: [{op: all_reduce, tensor: t, stream: side}]",
     "'stream' cannot be used inside a capture", 10),
    ("- capture: g\n  steps: [{op: al_reduce, tensor: t}]", "unknown op 'al_reduce'", 10),
    ("- {block_current_stream: h}", "no earlier step has handle 'h'", 9),
    ("- {sleep: 0.1, times: 2}", "'times' does not apply to a sleep step", 9),
    ("- {wait_stream: current}", "'current' is not allowed", 9),
    ("- capture: g\n  steps: [{capture: h, steps: [{op: all_reduce, tensor: t}]}]",
     "a capture records op and wait steps only, not 'capture'", 10),
])
def test_bad_cuda_steps_fail_collection_at_their_line(steps: str, message: str,
                                                      line: int) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        _program(steps)
    text = str(info.value)
    assert message in text and f"cases/x.yaml:{line}" in text, text


def test_cuda_steps_need_cuda_tensors() -> None:
    text = textwrap.dedent(PROGRAM).format(steps="      - {replay: g}").replace(
        "    device: cuda\n", "")
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        _instances(text)
    assert "'replay' needs CUDA tensors" in str(info.value)
    assert "add 'device: cuda' to the case" in str(info.value)


# -- future chains ---------------------------------------------------------------------------

@pytest.mark.parametrize(("step", "message"), [
    ("{future: h, then: [{mul: 3}], tensor: t, expect: 1}", "checks the value the chain "
     "returns, not a tensor"),
    ("{future: h, then: [{mul: 3}]}", "needs 'expect: FILL'"),
    ("{future: h, then: [{mul: 3}], expect: stale}", "'stale' refers to a tensor"),
    ("{future: h, then: [{div: 3}], expect: 1}", "div"),
    ("{future: h, then: [{mul: 3, add: 1}], expect: 1}", "then"),
    ("{future: h, then: [{mul: \"rank\"}], expect: 1}", "then"),
    ("{future: h, then: [{mul: 3}], expect: 1, held: true}", "a held future cannot chain"),
])
def test_bad_then_chains_are_rejected(step: str, message: str) -> None:
    steps = f"- {{op: all_reduce, tensor: t, async: true, handle: h}}\n- {step}"
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        _program(steps)
    assert message in str(info.value) and "cases/x.yaml:10" in str(info.value), str(info.value)


def test_a_then_chain_reaches_the_step() -> None:
    (inst,) = _program("- {op: all_reduce, tensor: t, async: true, handle: h}\n"
                       "- {future: h, then: [{mul: 3}, {add: 1.5}], expect: 7}")
    fut = inst.steps[1]
    assert dict(fut.args)["then"] == (("mul", 3), ("add", 1.5)) and fut.bufs == ()


@contextmanager
def _single_rank_group() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(),  # type: ignore[attr-defined]
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_then_chain_is_compared_with_its_expectation() -> None:
    from harness.program.interpreter import RankEnv, run_instance

    text = """
    cases:
      - name: chain
        world_size: 1
        tensors:
          t: {shape: [3], init: 2}
        steps:
          - {op: all_reduce, tensor: t, async: true, handle: h}
          - {future: h, then: [{mul: 3}, {add: 1}], as: good, expect: 7}
          - {future: h, then: [{add: 1}, {mul: 3}], as: bad, expect: 7}
          - {wait: h}
        expected: {t: 2}
    """
    (inst,) = _instances(text)
    with _single_rank_group():
        res = run_instance(inst, RankEnv(rank=0, world_size=1, device="cpu"))
    assert res.status == "ok", res.traceback
    reads = {r["name"]: r for r in res.ordering["reads"]}
    assert reads["good"]["ok"] and reads["good"]["tensor"] == "value of h"
    assert not reads["bad"]["ok"] and "expected 7.0 got 9.0" in reads["bad"]["wrong_text"]
    assert all(f["callback_ran"] for f in res.ordering["futures"])


HELD = """
cases:
  - name: held
    world_size: 1
    tensors:
      a: {shape: [2], init: 1}
      b: {shape: [2], init: 1}
    steps:
      - {op: all_reduce, tensor: a, async: true, handle: ha}
      - {op: all_reduce, tensor: b, async: true, handle: hb}
      - {future: ha, tensor: a, result: 0, held: true, as: value_a, expect: 5}
      - {future: hb, tensor: b, result: 0, held: true, as: value_b, expect: 5}
    expected: {a: 1, b: 1}
"""


class _PendingWork:
    """A Work whose future completes when the test says so."""

    def __init__(self) -> None:
        self.future: torch.futures.Future[Any] = torch.futures.Future()

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future

    def is_completed(self) -> bool:
        return self.future.done()


def test_a_held_future_is_asked_for_at_its_step_and_waited_at_the_end() -> None:
    """Two futures in flight at once: neither step waits (their futures are still pending
    when both steps returned); wait_held waits for them and compares their values."""
    from harness.program.timeline import ProgramState

    (inst,) = _instances(HELD)
    assert dict(inst.steps[2].args)["held"] is True
    bufs = {"a": torch.ones(2), "b": torch.ones(2)}
    state = ProgramState(inst, 0, 1, "cpu", 0.0, {}, bufs, {k: v.clone() for k, v in
                                                             bufs.items()}, set())
    works = {"ha": _PendingWork(), "hb": _PendingWork()}
    state.works.update(works)
    state.run(inst.steps[2], 2)
    state.run(inst.steps[3], 3)
    assert len(state.held) == 2 and not state.futures
    works["hb"].future.set_result([torch.full((2,), 5.0)])
    works["ha"].future.set_result([torch.full((2,), 4.0)])
    state.wait_held()
    reads = {r["name"]: r for r in state.results()["reads"]}
    assert reads["value_b"]["ok"]
    assert not reads["value_a"]["ok"] and "expected 5.0 got 4.0" in reads["value_a"]["wrong_text"]
    assert [f["handle"] for f in state.futures] == ["ha", "hb"]


# -- no CUDA step passes without having run --------------------------------------------------

def _caps(cuda_devices: int) -> capabilities.Capabilities:
    # A copy: probe() is cached for the process, and later tests (pytester runs in this
    # process) must still see this machine's real devices and backends.
    real = capabilities.probe(())
    return dataclasses.replace(real, facts=dataclasses.replace(
        real.facts, available=torchfacts.BUILTIN_BACKENDS, cuda_devices=cuda_devices))


def test_cuda_steps_skip_without_a_gpu_with_the_reason() -> None:
    (inst,) = _program(GOOD)
    assert _caps(0).skip_reason(inst) == ("needs a CUDA device (block_current_stream, "
                                          "capture, replay, wait_stream); there is none on "
                                          "this machine")


def test_graph_capture_skips_on_gloo_and_runs_elsewhere() -> None:
    (inst,) = _program("- capture: g\n  steps: [{op: all_reduce, tensor: t}]\n"
                       "- {replay: g}")
    caps = _caps(4)
    assert "gloo cannot record collectives in a CUDA graph" in caps.skip_reason(inst)
    nccl = _instances(textwrap.dedent(PROGRAM).format(
        steps="      - capture: g\n        steps: [{op: all_reduce, tensor: t}]"), "nccl")[0]
    assert caps.skip_reason(nccl) == ""
    # block_current_stream and wait_stream are not graph capture: Gloo with CUDA runs them.
    (other,) = _program("- {op: all_reduce, tensor: t, async: true, handle: h}\n"
                        "- {block_current_stream: h}")
    assert caps.skip_reason(other) == ""


def test_an_nccl_group_with_more_members_than_gpus_skips_with_the_reason() -> None:
    # Seen on an H100: Gloo with CUDA tensors at world size 2 making new_group(backend=
    # "nccl") over both ranks failed with NCCL's "Duplicate GPU detected" (both ranks share
    # the one GPU), a failure the case does not state.
    (inst,) = _program("- {new_group: g, members: [0, 1], backend: nccl}\n"
                       "- {op: broadcast, tensor: t, src: 0, group: g}")
    assert _caps(1).skip_reason(inst) == ("a new_group on NCCL needs one GPU per member: "
                                          "2 members > 1 GPU(s)")
    assert _caps(2).skip_reason(inst) == ""
    (one,) = _program("- {new_group: g, members: [1], backend: nccl}\n"
                      "- {op: broadcast, tensor: t, src: 1, group: g, ranks: [1]}")
    assert _caps(1).skip_reason(one) == ""
    (gloo,) = _program("- {new_group: g, members: [0, 1], backend: gloo}\n"
                       "- {op: broadcast, tensor: t, src: 0, group: g}")
    assert _caps(1).skip_reason(gloo) == ""


@pytest.mark.parametrize("steps", [
    "- capture: g\n  steps: [{op: all_reduce, tensor: t}]",
    "- {op: all_reduce, tensor: t, async: true, handle: h}\n- {block_current_stream: h}",
    "- {wait_stream: side}",
])
def test_a_cuda_step_on_a_cpu_rank_raises_instead_of_passing(steps: str) -> None:
    from harness.program.interpreter import RankEnv, run_instance

    (inst,) = _program(steps)
    inst = _one_rank(inst)
    with _single_rank_group():
        res = run_instance(inst, RankEnv(rank=0, world_size=1, device="cpu"))
    assert res.status == "raised" and "needs CUDA tensors and a GPU" in res.exc_message
    assert not res.checks  # nothing was compared, so nothing can read as a pass


def _one_rank(inst: Instance) -> Instance:
    import dataclasses

    return dataclasses.replace(inst, world_size=1)


def test_the_bundled_cuda_cases_skip_here_and_never_pass(pytester: pytest.Pytester) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CUDA cases run instead of skipping")
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        str(ROOT / "cases" / "cuda.yaml"), "-k",
        "not future_then_chain and not p2p_non_dense and not wait_tensor",
        "--report-json", str(report), "--report-md", str(pytester.path / "r.md"),
        "--rootdir", str(ROOT), "-p", "no:cacheprovider", "-rs", timeout=HANG_S)
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 10 and set(outcomes) <= {"skipped", "deselected"}, outcomes
    records = json.loads(report.read_text())["records"]
    assert records and all(r["outcome"] == "skipped" for r in records)
    reasons = {r["reason"] for r in records}
    assert all("needs a CUDA device" in why or "no CUDA device" in why for why in reasons)
    assert any("(capture, replay)" in why for why in reasons), reasons


# -- capture and replay wiring, against a stand-in for torch.cuda.graph ----------------------

class _FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


class _FakeWork:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait(self) -> None:
        self.log.append(f"wait {self.name}")


def test_capture_records_inside_the_graph_and_replay_repeats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    capturing: list[bool] = [False]

    @contextmanager
    def fake_graph(graph: Any) -> Iterator[None]:
        capturing[0] = True
        log.append("begin")
        yield
        log.append("end")
        capturing[0] = False

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    (inst,) = _program("- capture: g\n  steps:\n    - {op: all_reduce, tensor: t}\n"
                       "    - {op: all_reduce, tensor: t, async: true, handle: a}\n"
                       "    - {wait: a}\n"
                       "- {replay: g, times: 5}")
    capture, replay = inst.steps
    g = graphs_mod.Graphs("cuda")

    def run_inner(step: Step, works: dict[str, Any]) -> None:
        assert capturing[0], "a captured step ran outside the capture"
        log.append(f"run {step.kind}")
        if step.handle:
            works[step.handle] = _FakeWork(log, step.handle)
        for h in step.waits:
            works.pop(h).wait()

    g.capture(capture, run_inner)
    assert log == ["begin", "run op", "run op", "run wait", "wait a", "end"]
    first = g.graphs["g"]
    g.replay(replay)
    assert first.replays == 5
    g.capture(capture, run_inner)  # capturing again replaces the graph
    assert g.graphs["g"] is not first
    with pytest.raises(RuntimeError, match="graph 'h' was not captured on this rank"):
        g.replay(Step("replay", 1, waits=("h",), value=1))


# -- wait_tensor / register_work ---------------------------------------------------------------

def test_wait_tensor_and_register_work_reach_the_steps() -> None:
    (inst,) = _program("- {op: all_reduce, tensor: t, async: true, handle: h, "
                       "register_work: true}\n- {wait_tensor: t}\n- {wait: h}")
    assert inst.steps[0].register_work and not inst.steps[2].register_work
    assert inst.steps[1].kind == "wait_tensor" and inst.steps[1].bufs == (("tensor", "t"),)


@pytest.mark.parametrize(("step", "message"), [
    ("{wait_tensor: w}", "unknown tensor 'w'"),
    ("{sleep: 0.1, register_work: true}", "'register_work' does not apply to a sleep step"),
    ("{wait_tensor: t, register_work: true}", "'register_work' does not apply to a "
     "wait_tensor step"),
])
def test_bad_wait_tensor_steps_are_rejected(step: str, message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        _program(f"- {step}")
    assert message in str(info.value) and "cases/x.yaml:9" in str(info.value), str(info.value)


def test_register_work_skips_where_torch_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    (inst,) = _program("- {op: all_reduce, tensor: t, async: true, handle: h, "
                       "register_work: true}\n- {wait: h}")
    caps = _caps(1)
    # The installed torch decides (2.4.1's functional collectives lack the context manager).
    import torch.distributed._functional_collectives as funcol

    has_ctx = hasattr(funcol, "allow_inflight_collective_as_graph_input_ctx")
    assert (caps.skip_reason(inst) == "") == has_ctx, caps.skip_reason(inst)
    older = dataclasses.replace(caps, facts=dataclasses.replace(caps.facts, inflight_ctx=False))
    assert "has no allow_inflight_collective_as_graph_input_ctx" in older.skip_reason(inst)
