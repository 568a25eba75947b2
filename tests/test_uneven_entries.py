"""List buffers with per-entry shapes (``entry_shape``): references, expansion, checks, errors.

The rank-side checks run here without process groups: the buffers an instance declares are
built, the op's result is written by hand (right, then with one wrong element), and
``check_results`` must pass the first and fail the second at the right element.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness import ops
from harness.model import Instance
from harness.ops import RefContext
from harness.program import interpreter, tensors
from tests.helpers import case_error as problems
from tests.helpers import case_instances as instances


def ctx(ws: int, reduce_op: str | None = None) -> RefContext:
    return RefContext(world_size=ws, group_ranks=tuple(range(ws)), reduce_op=reduce_op,
                      args={"premul_factor": 2.0}, out_shape=())


# -- reference model ------------------------------------------------------------------------

def test_all_gather_reference_keeps_uneven_entries_as_a_list() -> None:
    inputs = [torch.arange(r, dtype=torch.float32) + 10 * r for r in range(3)]
    got = ops.get("all_gather").reference(inputs, ctx(3))
    for r in range(3):
        assert isinstance(got[r], list) and [e.tolist() for e in got[r]] == [
            [], [10.0], [20.0, 21.0]]


def test_reduce_scatter_reference_reduces_entry_by_entry() -> None:
    inputs = [[torch.full((j,), float(r + 1)) for j in range(3)] for r in range(3)]
    got = ops.get("reduce_scatter").reference(inputs, ctx(3, "sum"))
    assert [g.tolist() for g in got] == [[], [6.0], [6.0, 6.0]]
    got = ops.get("reduce_scatter").reference(inputs, ctx(3, "max"))
    assert got[2].tolist() == [3.0, 3.0]


def test_all_to_all_reference_routes_uneven_chunks() -> None:
    # member s sends s + d + 1 elements valued 10 * s + d to member d
    inputs = [[torch.full((s + d + 1,), float(10 * s + d)) for d in range(2)] for s in range(2)]
    got = ops.get("all_to_all").reference(inputs, ctx(2))
    assert [e.tolist() for e in got[0]] == [[0.0], [10.0, 10.0]]
    assert [e.tolist() for e in got[1]] == [[1.0, 1.0], [11.0, 11.0, 11.0]]


def test_scatter_and_coalesced_references_take_entry_lists() -> None:
    src = [torch.full((j + 1,), float(j)) for j in range(3)]
    got = ops.get("scatter").reference([src, None, None], RefContext(
        world_size=3, group_ranks=(0, 1, 2), reduce_op=None, args={"src": 0}, out_shape=()))
    assert [g.tolist() for g in got] == [[0.0], [1.0, 1.0], [2.0, 2.0, 2.0]]
    lists = [[torch.full((j + 1,), float(r)) for j in range(2)] for r in range(2)]
    out = ops.get("all_reduce_coalesced").reference(lists, ctx(2, "sum"))
    assert [e.tolist() for e in out[1]] == [[1.0], [1.0, 1.0]]


def test_all_gather_coalesced_reference_concatenates_the_members_lists() -> None:
    lists = [[torch.full((j + 1,), float(10 * r + j)) for j in range(2)] for r in range(2)]
    out = ops.get("all_gather_coalesced").reference(lists, ctx(2))
    assert [e.tolist() for e in out[0]] == [[0.0], [1.0, 1.0], [10.0], [11.0, 11.0]]
    layouts = ops.get("all_gather_coalesced").entry_layouts(lambda s, j: (j + 1,), 2, 2)
    assert layouts is not None and layouts[1] == ([(1,), (2,)], [(1,), (2,), (1,), (2,)])


def test_ops_without_list_entries_say_so() -> None:
    assert ops.get("all_reduce").entry_layouts(lambda s, j: (j,), 2) is None
    assert ops.get("all_gather_into_tensor").entry_layouts(lambda s, j: (j,), 2) is None


# -- buffers ------------------------------------------------------------------------------

def test_entry_index_and_views() -> None:
    entries = ((2,), (0,), (1, 3))
    j, k = tensors.entry_index((5,), entries)
    assert j.tolist() == [0, 0, 2, 2, 2] and k.tolist() == [0, 1, 0, 1, 2]
    flat = torch.arange(5.0)
    views = tensors.entry_views(flat, entries)
    assert [tuple(v.shape) for v in views] == [(2,), (0,), (1, 3)]
    views[2].fill_(-1)  # views: writes land in the flat buffer
    assert flat.tolist() == [0, 1, -1, -1, -1]
    # plain tensors: j is the dim-0 slice, k the index inside it
    j, k = tensors.entry_index((2, 3), None)
    assert j.tolist() == [0, 0, 0, 1, 1, 1] and k.tolist() == [0, 1, 2, 0, 1, 2]


# -- expansion ----------------------------------------------------------------------------

ALL_GATHER_V = """
cases:
  - name: v
    op: all_gather
    world_size: 3
    entry_shape: ["j + 1", 2]
    input: "rank * 100 + i"
"""


def test_expansion_gives_each_rank_its_shapes() -> None:
    (inst,) = instances(ALL_GATHER_V)
    inp = next(s for s in inst.tensors if s.name == "input")
    out = next(s for s in inst.tensors if s.name == "output")
    assert [inp.shape_for(r) for r in range(3)] == [(1, 2), (2, 2), (3, 2)]
    assert inp.entries_for(0) is None
    assert [out.shape_for(r) for r in range(3)] == [(12,)] * 3
    assert out.entries_for(1) == ((1, 2), (2, 2), (3, 2))


def test_all_to_all_entry_shape_may_use_the_sender() -> None:
    (inst,) = instances("""
cases:
  - name: v
    op: all_to_all
    world_size: 2
    entry_shape: ["rank + 2 * j"]
    input: "i"
""")
    inp = next(s for s in inst.tensors if s.name == "input")
    out = next(s for s in inst.tensors if s.name == "output")
    assert inp.entries_for(1) == ((1,), (3,))  # member 1 sends 1 to 0 and 3 to itself
    assert out.entries_for(0) == ((0,), (1,))  # member 0 receives 0 from itself, 1 from 1


def _run_checks(inst: Instance, rank: int, corrupt: bool) -> list[Any]:
    renv = interpreter.RankEnv(rank=rank, world_size=inst.world_size, device="cpu")
    env: dict[str, Any] = dict(inst.params)
    bufs = interpreter.build_buffers(inst, renv, env)
    before = {n: tensors.snapshot(t) for n, t in bufs.items()}
    out = bufs["output"]
    entries = next(s for s in inst.tensors if s.name == "output").entries_for(rank)
    assert entries is not None
    # What an all_gather_v writes: rank s's input in entry s.
    for s, view in enumerate(tensors.entry_views(out, entries)):
        n = view.numel()
        view.copy_((s * 100 + torch.arange(n)).reshape(view.shape).to(view.dtype))
    if corrupt:
        out[-1] += 1
    return interpreter.check_results(inst, renv, env, bufs, before, {"output"})


def test_checks_pass_the_right_result_and_fail_a_wrong_element() -> None:
    (inst,) = instances(ALL_GATHER_V)
    good = _run_checks(inst, 1, corrupt=False)
    assert all(c.ok for c in good), good
    bad = {c.tensor: c for c in _run_checks(inst, 1, corrupt=True)}
    assert not bad["output"].ok and bad["output"].wrong == 1
    assert bad["output"].first_wrong[0][0] == 11  # the last element of the flat list
    assert bad["input"].ok


def test_explicit_expectations_can_use_the_entry_index() -> None:
    (inst,) = instances("""
cases:
  - name: v
    op: all_gather
    world_size: 3
    entry_shape: ["j + 1", 2]
    input: "rank * 100 + i"
    expected: "j * 100 + k"
""")
    assert all(c.ok for c in _run_checks(inst, 2, corrupt=False))
    assert not all(c.ok for c in _run_checks(inst, 2, corrupt=True))


def test_program_tensors_with_entries() -> None:
    (inst,) = instances("""
cases:
  - name: p
    world_size: 2
    tensors:
      inp: {entries: world_size, entry_shape: ["j + 1"], init: "rank * 10 + j"}
      out: {shape: ["rank + 1"], init: poison}
    steps:
      - {op: reduce_scatter, input: inp, output: out}
    expected:
      out: "(0 + 10 + 2 * rank) * 1"
""")
    inp = next(s for s in inst.tensors if s.name == "inp")
    assert inp.entries_for(0) == ((1,), (2,)) and inp.shape_for(1) == (3,)
    renv = interpreter.RankEnv(rank=1, world_size=2, device="cpu")
    bufs = interpreter.build_buffers(inst, renv, {})
    assert bufs["inp"].tolist() == [10, 11, 11]


# -- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "message"), [
    ('op: all_reduce\n    entry_shape: ["j"]', "op all_reduce has no list buffer whose entries"),
    ('op: all_gather\n    shape: [2]\n    entry_shape: ["j"]',
     "'shape' and 'entry_shape' cannot both be given"),
    ('op: all_gather\n    entry_shape: ["rank + j"]', "only all_to_all's entry shapes may"),
    ('op: all_gather\n    entries: 3\n    entry_shape: ["j"]', "lists have one entry per"),
    ('op: all_reduce_coalesced\n    entries: 3', "'entries' needs 'entry_shape'"),
    ('op: all_gather\n    entry_shape: ["j - 1"]', "whole numbers >= 0, got -1 for j=0"),
    ('op: all_gather\n    layout: strided\n    entry_shape: ["j"]', "is contiguous"),
    ('op: all_gather\n    entry_shape: ["j + nope"]', "bad entry_shape expression"),
])
def test_bad_entry_shapes_are_reported_at_their_line(body: str, message: str) -> None:
    text = f"""
cases:
  - name: bad
    world_size: 2
    {body}
    input: "i"
"""
    err = problems(text)
    assert message in err, err
    assert "cases/x.yaml:" in err


def test_program_tensor_needs_both_entry_keys() -> None:
    err = problems("""
cases:
  - name: p
    tensors:
      t: {entries: 2, init: 0}
    steps:
      - {op: all_reduce, tensor: t}
""")
    assert "needs both 'entries' and 'entry_shape'" in err and "cases/x.yaml:5:" in err
