"""collective-guard's C++ side against its Python reference, and its side channel's batches.

The C++ kernel digests dense CPU tensors itself (harness/record/native/digest.cpp); those
digests must be the reference's (harness/guard/digest.py) bit for bit, for every dtype the
guard handles, every chunking (full chunks, a short tail, chunks that are not a multiple of the
16 lanes), the vector and the element-by-element loops. The spec a C++ record is decided under
must be the one the Python path makes for the same call. The side channel publishes a batch of
calls as one message per peer, over a store with queues and over one without (keys).
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from harness.guard import calls, channel, check, digest
from harness.guard.calls import Entry
from harness.guard.plan import plan_for, spec_of
from harness.record import native

FLOATS = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16,
        torch.uint32, torch.uint64]
# (elements, chunk): one short chunk, lanes not filled, a tail, more chunks than MAX_CHUNKS
SHAPES = [(1, 7), (37, 16), (1000, 100), (70001, 65536), (300000, 64), (4099, 4099)]


@pytest.fixture(scope="module")
def cpp() -> Any:
    return native.load()


def _values(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        big = torch.finfo(dtype).max
        x = torch.randn(n, generator=gen, dtype=torch.float64)
        x = x * 10.0 ** torch.randint(-3, 4, (n,), generator=gen)
        return x.clamp(-big, big).to(dtype)
    if dtype == torch.bool:
        return torch.rand(n, generator=gen) > 0.5
    ints = torch.iinfo(dtype)
    hi = int(min(ints.max, 2**62))
    lo = int(max(ints.min, -(2**62)))
    return torch.randint(lo, hi, (n,), generator=gen, dtype=torch.int64).to(dtype)


def _bits(rows: list[list[Any]]) -> list[list[Any]]:
    """Floats as their bit patterns: equal lists then mean equal bits (-0.0 differs from 0.0)."""
    return [[struct.pack("<d", v) if isinstance(v, float) else v for v in row] for row in rows]


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS, torch.bool], ids=str)
def test_cpp_exact_digest_is_the_reference_bit_for_bit(cpp: Any, dtype: torch.dtype) -> None:
    for k, (n, chunk) in enumerate(SHAPES):
        x = _values(dtype, n, k)
        assert cpp.guard_exact(x, chunk) == digest.exact(x, chunk).tolist(), (n, chunk)


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS], ids=str)
def test_cpp_linear_digest_is_the_reference_bit_for_bit(cpp: Any, dtype: torch.dtype) -> None:
    for k, (n, chunk) in enumerate(SHAPES):
        x = _values(dtype, n, k)
        assert _bits(cpp.guard_linear(x, chunk)) == _bits(digest.linear(x, chunk).tolist()), \
            (n, chunk)


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS], ids=str)
def test_cpp_one_pass_digests_are_the_reference_bit_for_bit(cpp: Any, dtype: torch.dtype) -> None:
    # a reduction's output: both digests in one loop (float64/32, bfloat16), two elsewhere
    for k, (n, chunk) in enumerate(SHAPES):
        x = _values(dtype, n, k)
        lin, ex = cpp.guard_linear_and_exact(x, chunk)
        assert _bits(lin) == _bits(digest.linear(x, chunk).tolist()), (n, chunk)
        assert ex == digest.exact(x, chunk).tolist(), (n, chunk)


def test_cpp_linear_digest_of_nonfinite_values_is_nonfinite_where_the_reference_is(
        cpp: Any) -> None:
    x = torch.tensor([1.0, -math.inf] + [2.0] * 62 + [math.nan] + [3.0] * 63 + [4.0] * 64)
    got, want = cpp.guard_linear(x, 64), digest.linear(x, 64).tolist()
    assert [[math.isfinite(v) for v in row] for row in got] == \
        [[math.isfinite(v) for v in row] for row in want] == [[False, False]] * 2 + [[True] * 2]
    assert got[2] == want[2]


def test_cpp_digests_refuse_what_they_do_not_read(cpp: Any) -> None:
    for x in (torch.ones(4, 4).t(), torch.ones(3, dtype=torch.complex64)):
        with pytest.raises(RuntimeError, match="not a tensor the C\\+\\+"):
            cpp.guard_exact(x, 16)


class _PG:
    """What plan_for reads of a process group argument: nothing (a placeholder)."""


@pytest.mark.parametrize("name", ["allreduce_", "broadcast_", "_allgather_base_",
                                  "_reduce_scatter_base_", "send", "recv_"])
def test_spec_of_a_cpp_record_is_the_python_path_spec(name: str) -> None:
    t = torch.ones(5000, dtype=torch.bfloat16)
    pg = _PG()
    args: dict[str, tuple[Any, ...]] = {
        "allreduce_": ([t], pg, dist.ReduceOp.AVG, None),
        "broadcast_": ([t], pg, 1, 0),
        "_allgather_base_": (torch.ones(10000, dtype=torch.bfloat16), t, pg),
        "_reduce_scatter_base_": (t, torch.ones(10000, dtype=torch.bfloat16), pg,
                                  dist.ReduceOp.SUM),
        "send": ([t], pg, 1, 7),
        "recv_": ([t], pg, 1, 7),
    }
    plan = plan_for(name, args[name], [3, 5], 1024)
    assert plan is not None
    reduce = {"allreduce_": 1, "_reduce_scatter_base_": 0}.get(name, -1)
    root = 1 if name == "broadcast_" else -1
    peer, tag = (1, 7) if name in ("send", "recv_") else (-1, 0)
    assert spec_of(name, [3, 5], torch.bfloat16, plan.spec["chunk"], reduce, root, peer,
                   tag) == plan.spec


def _entry(seq: int, me: int) -> Entry:
    spec = spec_of("allreduce_", [0, 1], torch.float32, 64, 0)
    rows_in = [[[float(seq), 1.0]]]  # digests, of rows (chunks), of numbers
    rows_out = [[[float(seq), 1.0]], [[seq, -seq, 2**63 - 1]]]
    return Entry("allreduce_", seq, "0", spec, me, rows_in, rows_out, seq, 0,
                 lambda: ({}, "?"), lambda: [])


@pytest.mark.parametrize("store", ["queues", "keys"])
def test_a_batch_of_calls_is_one_message_per_peer(store: str, tmp_path: Path) -> None:
    base = c10d.HashStore() if store == "queues" else c10d.FileStore(str(tmp_path / "s"), 1)
    inboxes = [channel.Inbox(base, r) for r in (0, 1)]
    assert [i.queues for i in inboxes] == [store == "queues"] * 2
    sides = [channel.Exchange(i) for i in inboxes]
    mine = [[_entry(s, r) for s in range(10)] for r in (0, 1)]
    for r in (0, 1):
        sides[r].publish(mine[r])
    for r in (0, 1):
        assert sides[r].collect() == 1
        assert sides[r].pushes == sides[r].pops == 1
        assert all(sides[r].ready(e) for e in mine[r])
        digs = sides[r].digests(mine[r][4])
        assert [d["rank"] for d in digs] == [0, 1]
        assert digs[1 - r]["in"] == [[[4.0, 1.0]]]
        assert digs[1 - r]["out"] == [[[4.0, 1.0]], [[4, -4, 2**63 - 1]]]
        assert sides[r].collect() == 0  # a pop removed what it read


def test_a_message_that_is_not_the_guards_is_a_channel_error() -> None:
    store = c10d.HashStore()
    inbox = channel.Inbox(store, 0)
    inbox.push(0, '{"from": 1, "d": [[["0", "all_reduce", 0], 5]]}')
    with pytest.raises(channel.ChannelError, match="not the guard's"):
        channel.Exchange(inbox).collect()


def test_packed_digests_keep_every_bit() -> None:
    for rows in ([[-0.0, 5e-324], [1.7976931348623157e308, -1.5]], [[-(2**63), 2**63 - 1, 0]],
                 []):
        back = channel.unpack(channel.pack(rows))
        assert _bits(back) == _bits(rows)
    for bad in (["x", 1, ""], ["d", 3, "AAAAAAAAAAA="], ["d", 1, "not base64!"]):
        with pytest.raises((ValueError, TypeError)):
            channel.unpack(bad)


def _reduce(cpp: Any, ins: list[torch.Tensor], outs: list[torch.Tensor],
            chunk: int) -> list[dict[str, Any]]:
    """Raw digests of an all_reduce as the C++ kernel takes them, per rank."""
    digs = []
    for r, (x, y) in enumerate(zip(ins, outs, strict=True)):
        lin, ex = cpp.guard_linear_and_exact(y, chunk)
        digs.append({"rank": r, "in": [calls.raw(cpp.guard_linear(x, chunk))],
                     "out": [calls.raw(lin), calls.raw(ex)]})
    return digs


def _found(spec: dict[str, Any], digs: list[dict[str, Any]]) -> set[tuple[int, int]]:
    return {(m.rank, m.chunk) for m in
            check.decide(spec, [channel.as_rows(d) for d in digs]).mismatches}


def test_only_an_honest_reduction_is_passed_on_its_bytes(cpp: Any) -> None:
    spec = spec_of("allreduce_", [0, 1], torch.float32, 256, 0)
    xs = [_values(torch.float32, 1000, s) for s in (1, 2)]
    y = xs[0] + xs[1]
    digs = _reduce(cpp, xs, [y, y.clone()], 256)
    assert check.honest(spec, digs, cpp.guard_sum_ok)
    assert not check.honest(spec, digs, None)  # no C++ test: decide judges it
    assert _found(spec, digs) == set()
    bad = y.clone()
    bad[300] += 1.0  # chunk 1, on rank 1 only: the ranks disagree
    digs = _reduce(cpp, xs, [y, bad], 256)
    assert not check.honest(spec, digs, cpp.guard_sum_ok)
    assert (1, 1) in _found(spec, digs)
    digs = _reduce(cpp, xs, [bad, bad.clone()], 256)  # on both alike: only the sum shows it
    assert not check.honest(spec, digs, cpp.guard_sum_ok)
    assert _found(spec, digs) == {(0, 1), (1, 1)}


def test_a_sum_near_its_bound_is_left_to_decide(cpp: Any) -> None:
    spec = spec_of("allreduce_", [0, 1], torch.float32, 64, 0)
    ins, a_out = [[1.0, 40.0], [2.0, 50.0]], 90.0
    bound = check.sum_bound(spec, 90.0, a_out)
    exact = calls.raw([[1, 2, 3]])
    for off, decided_on_bytes, found in ((0.25, True, set()), (0.75, False, set()),
                                         (1.5, False, {(0, 0), (1, 0)})):
        out = calls.raw([[3.0 + off * bound, a_out]])
        digs = [{"rank": r, "in": [calls.raw([ins[r]])], "out": [out, exact]} for r in (0, 1)]
        assert check.honest(spec, digs, cpp.guard_sum_ok) is decided_on_bytes, off
        assert _found(spec, digs) == found, off


def test_a_data_moving_call_is_passed_on_its_bytes_only_where_they_are_equal() -> None:
    a, b = calls.raw([[1, 2, 3]]), calls.raw([[1, 2, 4]])
    bcast = {"kind": "broadcast", "root": 1, "group": [0, 1]}
    assert check.honest(bcast, [{"out": [a]}, {"out": [a]}], None)
    assert not check.honest(bcast, [{"out": [b]}, {"out": [a]}], None)
    gather = {"kind": "gather", "group": [0, 1]}
    assert check.honest(gather, [{"in": [a], "out": [a, b]}, {"in": [b], "out": [a, b]}], None)
    assert not check.honest(gather, [{"in": [a], "out": [b, a]}, {"in": [b], "out": [a, b]}],
                            None)
    p2p = {"kind": "p2p", "group": [0, 1]}
    assert check.honest(p2p, [{"in": [a], "out": []}, {"in": [], "out": [a]}], None)
    assert not check.honest(p2p, [{"in": [a], "out": []}, {"in": [], "out": [b]}], None)
