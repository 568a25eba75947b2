"""The completion check on point-to-point ops of programs (no ranks started).

A p2p Work whose ``is_completed()`` is True when the call returns must already have its data
in the receive buffers: the timeline snapshots them then and compares after ``wait()``; the
verdict turns a difference into a ``completion`` violation.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.model import Instance, RankResult, StepEvent
from harness.ordering import verdicts
from harness.program.interpreter import receive_buffers
from harness.program.timeline import ProgramState

PROGRAM = """
cases:
  - name: p2p
    world_size: 2
    tensors:
      t: {shape: [3], init: {0: [1, 2, 3], 1: zeros}}
      u: {shape: [3], init: zeros}
    steps:
      - {op: isend, tensor: t, dst: 1, ranks: [0], handle: s}
      - {op: irecv, tensor: t, src: 0, ranks: [1], handle: r}
      - op: batch_isend_irecv
        p2p:
          - {op: isend, tensor: t, peer: "1 - rank"}
          - {op: irecv, tensor: u, peer: "1 - rank"}
        handle: b
      - {wait: [s, r, b]}
    expected: {t: [1, 2, 3], u: [1, 2, 3]}
"""


def _instance() -> Instance:
    doc = yamlload.load_text(PROGRAM, "case.yaml")
    return next(i for c in validate.load_cases(doc) for i in expand.expand(c, "gloo"))


class FakeWork:
    """A Work that says ``completed`` at once; ``wait()`` runs ``land`` (the data arriving)."""

    def __init__(self, completed: bool, land: Callable[[], object] | None = None) -> None:
        self.completed = completed
        self.land = land

    def is_completed(self) -> bool:
        return self.completed

    def wait(self) -> bool:
        if self.land is not None:
            self.land()
        self.completed = True
        return True


def _state(bufs: dict[str, torch.Tensor]) -> ProgramState:
    before = {n: t.clone() for n, t in bufs.items()}
    return ProgramState(_instance(), 1, 2, "cpu", time.perf_counter(), {}, bufs, before, set())


def test_receive_buffers_are_the_buffers_a_p2p_step_writes() -> None:
    steps = _instance().steps
    assert receive_buffers(steps[0]) == []  # isend
    assert receive_buffers(steps[1]) == ["t"]  # irecv
    assert receive_buffers(steps[2]) == ["u"]  # the batch's irecv entry only


def test_completed_at_return_before_the_data_landed_is_recorded() -> None:
    t = torch.zeros(3)
    state = _state({"t": t})
    ev = StepEvent(1, "irecv(tensor=t)", 0.0, 0.001)
    work = FakeWork(True, land=lambda: t.copy_(torch.tensor([1.0, 2.0, 3.0])))
    state.returned(work, ev, ["t"])
    state.wait(work, ev)
    assert ev.completed_at_return is True and ev.at_return_in_place is False


def test_completed_at_return_with_the_data_in_place_is_fine() -> None:
    t = torch.tensor([1.0, 2.0, 3.0])
    state = _state({"t": t})
    ev = StepEvent(1, "irecv(tensor=t)", 0.0, 0.001)
    work = FakeWork(True)
    state.returned(work, ev, ["t"])
    state.wait(work, ev)
    assert ev.at_return_in_place is True


def test_not_completed_at_return_or_buffer_reused_is_not_judged() -> None:
    t = torch.zeros(3)
    state = _state({"t": t})
    ev = StepEvent(1, "irecv(tensor=t)", 0.0, 0.001)
    work = FakeWork(False, land=lambda: t.fill_(7))
    state.returned(work, ev, ["t"])
    state.wait(work, ev)
    assert ev.completed_at_return is False and ev.at_return_in_place is None
    # Another step uses the buffer before the wait: a change proves nothing about the op.
    ev2 = StepEvent(1, "irecv(tensor=t)", 0.0, 0.001)
    work2 = FakeWork(True, land=lambda: t.fill_(9))
    state.returned(work2, ev2, ["t"])
    state.touching(["t"])
    state.wait(work2, ev2)
    assert ev2.at_return_in_place is None


def _judge(ev: StepEvent) -> dict[str, str]:
    inst = _instance()
    results = {0: RankResult(0, "ok"), 1: RankResult(1, "ok", events=[ev])}
    return verdicts.judge(inst, results)["completion"]  # type: ignore[no-any-return]


def test_early_p2p_completion_violates_the_completion_check() -> None:
    ev = StepEvent(1, "irecv(tensor=t)", 0.0, 0.001, completed_at_return=True,
                   t_wait_return=0.2, completed_after_wait=True, at_return_in_place=False)
    v = _judge(ev)
    assert v["status"] == "violated"
    assert "rank 1: step 1 irecv(tensor=t): is_completed() was True when the call returned" \
        in v["detail"]
    ev.at_return_in_place = True
    assert _judge(ev)["status"] == "ok"
    ev.at_return_in_place = None  # not observed: no claim either way
    assert _judge(ev)["status"] == "ok"
