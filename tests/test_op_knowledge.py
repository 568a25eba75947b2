"""What the fuzzer, the recorder, the numerics checks and the bare timing loop know about an op
comes from its entry in the op table, and the entries' attributes agree with each other."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import ops
from harness.fuzz import space
from harness.record import optable

from .helpers import case_error

TENSOR = {"shape": [4, 2], "dtype": "float32", "device": "cpu"}
# Every argument some dispatcher schema reads, so each reader finds what it looks for.
EVERY_ARG = {"tensors": [TENSOR], "input": TENSOR, "inputs": [TENSOR], "outputs": [TENSOR],
             "input_tensors": [TENSOR], "output_tensors": [TENSOR], "input_tensor": TENSOR,
             "output_tensor": TENSOR, "tensor": TENSOR, "root_rank": 0, "src": 1, "dst": 1,
             "tag": 0}


def test_every_dispatcher_op_the_table_claims_has_a_reader_and_the_reverse() -> None:
    assert set(optable.READERS) == set(optable.RECORDED)


def test_no_dispatcher_op_is_claimed_by_two_ops() -> None:
    claims = Counter(name for op in ops.ALL_OPS.values() for name in op.recorded_as)
    assert [name for name, n in claims.items() if n > 1] == []


def test_every_op_the_recorder_emits_is_in_the_op_table() -> None:
    for name in optable.READERS:
        for ns in ("c10d::", "_c10d_functional::"):
            rec = {"op": ns + name, "args": EVERY_ARG, "group": [0, 1], "api": None,
                   "site": "train.py:1", "seq": 0, "reduce_op": "sum"}
            calls = optable.translate(rec, 0)
            assert calls, name
            assert {c.op for c in calls} == {optable.RECORDED[name]}, name
            assert all(c.op in ops.ALL_OPS for c in calls), name


def test_a_dispatcher_op_no_entry_claims_is_unknown() -> None:
    rec = {"op": "c10d::frobnicate_", "args": EVERY_ARG, "group": [0, 1], "api": None,
           "site": "x.py:1", "seq": 0}
    try:
        optable.translate(rec, 0)
    except optable.UnknownOp as exc:
        assert "not in the op table" in str(exc)
    else:
        raise AssertionError("an unclaimed dispatcher op was translated")


def test_the_fuzzed_ops_are_the_entries_with_a_fuzz_spec_in_their_order() -> None:
    fuzzed = [op for op in ops.ALL_OPS.values() if op.fuzz is not None]
    assert set(space.SHORTHAND) == {op.name for op in fuzzed}
    specs = [ops.get(name).fuzz for name in space.SHORTHAND]
    orders = [spec.order for spec in specs if spec is not None]
    assert len(orders) == len(specs) and orders == sorted(set(orders))
    assert space.DEFAULT_OPS[:len(space.SHORTHAND)] == space.SHORTHAND


def test_the_fuzz_specs_fit_the_ops_they_describe() -> None:
    for op in ops.ALL_OPS.values():
        spec = op.fuzz
        if spec is None:
            continue
        assert (spec.shape == "none") == (not op.roles), op.name
        assert (spec.shape == "entries") == op.entry_count_free, op.name
        assert not spec.inplace or "inplace" in op.args, op.name
        assert op.supports_async and not op.always_async, op.name
        assert not op.root_arg or op.root_arg in op.required_args, op.name


def test_table_flags_fit_each_other() -> None:
    assert {op.name for op in ops.ALL_OPS.values() if op.always_async} == ops.ALWAYS_ASYNC
    for op in ops.ALL_OPS.values():
        assert not op.always_async or op.point_to_point, op.name
        assert not op.bare_posts or op.always_async, op.name
        assert not op.entries_per_sender or op.takes_entry_shape, op.name
        assert not op.root_arg or op.root_arg in op.args, op.name
        assert not op.elementwise or (op.reduces and op.in_role == op.out_role), op.name
        if op.unfused:
            plain = ops.get(op.unfused)
            assert plain.reduces == op.reduces and plain.fuzz is not None, op.name
        if op.p2p_entries:  # its buffers are the step's p2p entries, not roles
            assert not op.roles and op.role("p2p.0").access == "inout", op.name


def test_numerics_read_the_table() -> None:
    """The size and fusion checks name the ops whose entries say they apply."""
    elementwise = [o.name for o in ops.ALL_OPS.values() if o.elementwise]
    coalesced = [o.name for o in ops.ALL_OPS.values() if o.unfused]
    assert elementwise and coalesced
    text = case_error("""
    cases:
      - name: c
        op: broadcast
        world_size: 2
        shape: [4]
        input: {generator: exact}
        args: {src: 0}
        expected: auto
        size_invariant: 9
    """)
    assert "it applies to the op: form of " + " and ".join(elementwise) in text
    text = case_error("""
    cases:
      - name: c
        op: all_reduce
        world_size: 2
        shape: [2, 4]
        input: {generator: exact}
        expected: auto
        fusion_invariant: true
    """)
    assert "it applies to the " + " and ".join(coalesced) + " ops" in text


class _Dist:
    """A stand-in for torch.distributed that records which functions a bare call uses."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def fn(*args: Any, **kwargs: Any) -> None:
            self.called.append(name)
        return fn


class _Buf:
    def chunk(self, n: int) -> list[_Buf]:
        return [_Buf() for _ in range(n)]


def test_a_bare_call_is_the_plain_function_of_the_same_name() -> None:
    bare = []
    for op in ops.ALL_OPS.values():
        bufs = {r.name: _Buf() for r in op.roles}
        for args in ({"src": 0, "dst": 1}, {"src": 0, "dst": 1, "inplace": True}):
            if args.get("inplace") and "inplace" not in op.args:
                continue
            dist = _Dist()
            call = op.bare_call(dist, bufs, args, "SUM", 0, 2)
            if call is None:
                continue
            bare.append(op.name)
            call()
            assert dist.called == [op.name], op.name
    assert set(bare) >= {"all_reduce", "broadcast", "isend", "irecv"}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck),
          database=None)
@given(st.data())
def test_every_generated_case_uses_only_what_its_op_entry_allows(data: st.DataObject) -> None:
    case = data.draw(space.cases(space.SHORTHAND, (1, 2, 3, 4)))
    op = ops.get(case["op"])
    spec = op.fuzz
    assert spec is not None
    args = case.get("args", {})
    if "group" in args:
        assert spec.subgroup
    if args.get("inplace"):
        assert spec.inplace
    if "offset" in case:
        assert spec.offset
    if "entry_shape" in case:
        assert op.takes_entry_shape
        assert "rank" not in str(case["entry_shape"]) or op.entries_per_sender
    if "reduce_op" in case:
        assert op.reduces
    roots = {k for k in ("src", "dst") if k in args}
    assert roots == ({op.root_arg} if op.root_arg else set())
