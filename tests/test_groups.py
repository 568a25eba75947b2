"""Named groups (``new_group`` steps), omitted arguments (``omit:``) and ``torch_modes``."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import ops
from harness.ops.base import CallContext
from tests.helpers import HANG_S
from tests.helpers import case_error as problems
from tests.helpers import case_instances as instances

from .helpers import load_report, subprocess_env

PROGRAM = """
cases:
  - name: p
    world_size: 4
    tensors:
      t: {shape: [2], init: "rank"}
    steps:
      - {new_group: pairs, subgroups: 2}
      - {op: all_reduce, tensor: t, group: pairs}
    expected: {t: unspecified}
"""


def test_a_named_group_reaches_the_steps_and_isolates_the_instance() -> None:
    (inst,) = instances(PROGRAM)
    make, op = inst.steps
    assert make.kind == "new_group" and make.value == "pairs"
    assert dict(make.args) == {"how": "subgroups", "size": 2}
    assert dict(op.args)["group"] == "pairs"
    # Its groups stay in torch's registry of the ranks: never on a shared pool.
    assert inst.isolate


@pytest.mark.parametrize(("old", "new", "message", "line"), [
    ("group: pairs}", "group: pears}", "no earlier new_group step makes group 'pears'", 9),
    ("{new_group: pairs, subgroups: 2}", "{new_group: pairs}",
     "a new_group step needs exactly one of 'members'", 8),
    ("{new_group: pairs, subgroups: 2}", "{new_group: pairs, subgroups: 2, sort_ranks: false}",
     "'sort_ranks' is an option of new_group", 8),
    ("{new_group: pairs, subgroups: 2}", "{new_group: pairs, split: [[0, 1]], parent: x}",
     "no earlier new_group step makes group 'x'", 8),
    ("{new_group: pairs, subgroups: 2}", "{new_group: pairs, members: [\"rank +\"]}",
     "bad expression", 8),
    ("- {op: all_reduce, tensor: t, group: pairs}",
     "- {new_group: pairs, members: [0, 1]}\n      - {op: all_reduce, tensor: t, group: pairs}",
     "group 'pairs' is already made by step 0", 9),
    ("{op: all_reduce, tensor: t, group: pairs}", "{op: all_reduce, tensor: t, members: [0]}",
     "'members' belongs to new_group steps", 9),
])
def test_bad_group_steps_are_reported_at_their_line(old: str, new: str, message: str,
                                                     line: int) -> None:
    text = problems(PROGRAM.replace(old, new))
    assert message in text and f"cases/x.yaml:{line}:" in text, text


SHORTHAND = """
cases:
  - name: s
    op: gather
    world_size: 2
    shape: [2]
    input: "rank"
    args: {omit: [dst]}
"""


def test_an_omitted_root_is_not_passed_but_used_for_bookkeeping() -> None:
    (inst,) = instances(SHORTHAND)
    args = dict(inst.steps[0].args)
    assert args["omit"] == ("dst",) and args["dst"] == 0  # torch's documented default


@pytest.mark.parametrize(("args", "extra", "message"), [
    ("{omit: [src]}", "", "gather has no argument 'src' with a default"),
    ("{omit: [dst], dst: 1}", "", "'dst' is given and omitted"),
])
def test_bad_omit_is_reported(args: str, extra: str, message: str) -> None:
    text = problems(SHORTHAND.replace("{omit: [dst]}", args) + extra)
    assert message in text and "cases/x.yaml:8:" in text, text


def test_an_omitted_reduce_op_must_be_the_default() -> None:
    text = problems("""
cases:
  - name: r
    op: all_reduce
    reduce_op: [sum, max]
    shape: [2]
    input: 1
    args: {omit: [reduce_op]}
""")
    assert "with 'reduce_op' omitted torch reduces with its default (sum)" in text
    assert "cases/x.yaml:8:" in text


class _Recorder:
    """Stands in for torch.distributed: records the keyword arguments of each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append(kwargs)
        return call


@pytest.mark.parametrize(("op", "omit", "absent", "bufs"), [
    ("all_reduce", ("reduce_op",), "op", {"tensor": None}),
    ("gather", ("dst",), "dst", {"input": None, "output": None}),
    ("scatter", ("src",), "src", {"input": None, "output": None}),
])
def test_omitted_arguments_are_left_out_of_the_call(op: str, omit: tuple[str, ...],
                                                    absent: str, bufs: dict[str, Any]) -> None:
    for args, present in (({"omit": omit, "dst": 0, "src": 0}, False),
                          ({"dst": 0, "src": 0}, True)):
        rec = _Recorder()
        ctx = CallContext(dist=rec, rank=0, world_size=2, group=None, group_ranks=(0, 1),
                          reduce_op="SUM", async_op=False, args=args)
        ops.get(op).call(ctx, bufs)
        assert (absent in rec.calls[0]) is present, rec.calls


def test_torch_modes_hold_during_the_program_and_are_restored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from harness.program.interpreter import RankEnv, run_instance

    (inst,) = instances("""
cases:
  - name: m
    op: all_reduce
    world_size: 1
    torch_modes: [inference_mode, deterministic_algorithms]
    shape: [2]
    input: 1
""")
    seen: list[tuple[bool, bool]] = []
    entry = ops.get("all_reduce")
    real = entry.call

    def spy(ctx: CallContext, bufs: dict[str, Any]) -> Any:
        seen.append((torch.is_inference_mode_enabled(),
                     torch.are_deterministic_algorithms_enabled()))
        return real(ctx, bufs)

    monkeypatch.setattr(entry, "call", spy)
    dist.init_process_group("gloo", store=dist.HashStore(),  # type: ignore[attr-defined]
                            rank=0, world_size=1)
    try:
        res = run_instance(inst, RankEnv(rank=0, world_size=1, device="cpu"))
    finally:
        dist.destroy_process_group()
    assert res.status == "ok", res.traceback
    assert seen == [(True, True)]
    assert not torch.is_inference_mode_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def run_child(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=HANG_S,
                          env=subprocess_env())


ORDERED = """
cases:
  - name: ordered
    world_size: 4
    tensors:
      a: {shape: [2], dtype: int64, init: "rank * 10 + i"}
      g: {shape: [4, 2], dtype: int64, init: poison}
    steps:
      - {new_group: rev, members: [3, 2, 1, 0], sort_ranks: false}
      - {op: all_gather, input: a, output: g, group: rev}
    expected:
      g: "(3 - j) * 10 + k"
"""


def test_a_constructor_that_builds_another_group_fails_the_group_check(tmp_path: Path) -> None:
    """tests/group_fault.py makes new_group ignore sort_ranks=False: the group check names
    the group, what the case implies and what torch built."""
    (tmp_path / "c.yaml").write_text(ORDERED)
    ok = run_child(["c.yaml", "-q", "--no-report"], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr  # passed (skipped where torch 2.4.1
    # lacks sort_ranks; the fault module below claims the parameter, so that run is checked)
    bad = run_child(["c.yaml", "-q", "--no-report", "--backend-module", "group_fault"],
                    tmp_path)
    assert bad.returncode == 1
    assert ("rank 0, buffer \"group 'rev' (step 0)\" (explicit): 1 of 1 element(s) wrong; "
            "first: [0] expected members [3, 2, 1, 0], this rank at 3 got members "
            "[0, 1, 2, 3], this rank at 0") in bad.stdout


LEAK = """
cases:
  - name: a_made_by_two
    world_size: 4
    tensors:
      t: {shape: [2], dtype: int64, init: 1}
    steps:
      - {new_group: low, members: [0, 1], ranks: [0, 1]}
      - {op: all_reduce, tensor: t, group: low, ranks: [0, 1]}
    expected:
      t: {0: 2, 1: 2, others: unchanged}
  - name: b_next
    op: all_reduce
    world_size: 4
    args: {group: [0, 2]}
    dtype: int64
    shape: [2]
    input: "rank"
  - name: c_raises
    world_size: 4
    steps:
      - {new_group: big, subgroups: 3}
    expected: {}
    raises: "ValueError: The world size (\\\\(4\\\\) )?must be divisible by 'group_size(=3)?'"
"""


def test_groups_of_one_instance_do_not_reach_the_next(tmp_path: Path) -> None:
    """Only ranks 0 and 1 call new_group in the first case, which advances their group
    counters alone; on a shared pool the next case's new_group([0, 2]) would pair ranks whose
    counters differ. The named-group instance runs on a private pool, so the next passes."""
    (tmp_path / "c.yaml").write_text(LEAK)
    res = run_child(["c.yaml", "-q", "--deadline", "20"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    report = load_report(tmp_path / "reports" / "conformance.json")
    by_case = {r["case"]: r for r in report["records"]}
    assert by_case["a_made_by_two"]["outcome"] == "passed"
    assert by_case["b_next"]["outcome"] == "passed"
    assert by_case["c_raises"]["outcome"] == "passed"
    # The error is the constructor's, in its step.
    assert {r["exception"]["step"] for r in by_case["c_raises"]["ranks"]} == {0}


def test_instances_skip_where_torch_lacks_the_constructor_or_parameter() -> None:
    from types import SimpleNamespace

    import torch.distributed as dist

    from harness.run.capabilities import Capabilities

    (split,) = instances(PROGRAM.replace("{new_group: pairs, subgroups: 2}",
                                         "{new_group: pairs, split: [[0, 1]]}"))
    (ordered,) = instances(PROGRAM.replace("{new_group: pairs, subgroups: 2}",
                                           "{new_group: pairs, members: [1, 0], "
                                           "sort_ranks: false}"))
    real = Capabilities.of_modules("x", 0, dist, SimpleNamespace(float32=1))
    # The installed torch decides (2.4.1 has neither split_group nor sort_ranks).
    has_split = hasattr(dist, "split_group")
    has_sort = "sort_ranks" in inspect.signature(dist.new_group).parameters
    assert real.skip_reason(split) == ("" if has_split else
                                       "torch x has no torch.distributed.split_group")
    assert real.skip_reason(ordered) == ("" if has_sort else
                                         "torch x has no new_group parameter 'sort_ranks'")

    def new_group(ranks: Any = None, timeout: Any = None) -> None:
        raise AssertionError("not called")

    old = SimpleNamespace(new_group=new_group, all_reduce=dist.all_reduce,
                          is_backend_available=lambda b: True)
    caps = Capabilities.of_modules("1.0", 0, old, SimpleNamespace(float32=1))
    assert caps.skip_reason(split) == "torch 1.0 has no torch.distributed.split_group"
    assert caps.skip_reason(ordered) == "torch 1.0 has no new_group parameter 'sort_ranks'"


def test_omit_in_a_step_needs_an_op_with_a_known_default() -> None:
    text = problems("""
cases:
  - name: p
    world_size: 2
    tensors:
      t: {shape: [2], init: 1}
    steps:
      - {op: broadcast, tensor: t, omit: [src]}
    expected: {t: unspecified}
""")
    assert "broadcast takes no 'omit'" in text and "cases/x.yaml:8:" in text, text


def test_an_op_on_a_group_torch_gave_none_is_refused_not_run_on_the_world() -> None:
    """A non-member of a use_local_synchronization group gets None, and group=None would
    mean the default group: the harness refuses the step instead of running it there."""
    import torch.distributed as dist

    from harness.program.groups import Named, resolve
    from harness.program.interpreter import RankEnv, run_instance

    # Collected at world size 2 (members out of the world are a collection error), run on a
    # world of one, where rank 1 does not exist: torch's local-synchronization path does not
    # check it and gives rank 0 None.
    (inst,) = instances("""
cases:
  - name: none
    world_size: 2
    tensors:
      t: {shape: [2], init: 1}
    steps:
      - {new_group: far, members: [1], use_local_synchronization: true}
      - {op: all_reduce, tensor: t, group: far}
    expected: {t: unchanged}
""")
    dist.init_process_group("gloo", store=dist.HashStore(),  # type: ignore[attr-defined]
                            rank=0, world_size=1)
    try:
        res = run_instance(inst, RankEnv(rank=0, world_size=1, device="cpu"))
    finally:
        dist.destroy_process_group()
    if res.status == "raised":  # torch returned None (observed on 2.13.0): refused
        assert res.step == 1, res.traceback
        assert "rank 0 is not a member of group 'far' (torch returned None" in res.exc_message
    else:
        # torch 2.15.0 returns GroupMember.NON_GROUP_MEMBER instead, which torch's ops treat
        # as "this rank is not in the group" (they return without communicating): the
        # harness passes it on, and the group check names what torch returned (a harness
        # that ran the op on the world for None would fail here: its check would be ok).
        group = next(c for c in res.checks if c.tensor == "group 'far' (step 0)")
        assert group.first_wrong == [(0, "None", "NON_GROUP_MEMBER")], group
        assert res.status == "ok", res.traceback
    # The refusal itself, whichever value the installed torch returns.
    for member, says in ((False, "rank 0 is not a member of group 'g' (torch returned None"),
                         (True, "torch returned None for group 'g' on rank 0, which the case "
                                "makes a member")):
        with pytest.raises(RuntimeError, match=re.escape(says)):
            resolve({"g": Named(None, (0,) if member else (1,), member, "members")}, "g", 0)
