"""collective-record on long runs (issue 38): the trace is capped and collapsed while it is
written. Identical calls past the in-order window are counted, not written, and the case file
is the same as from a trace of every call (not partial); distinct calls past the caps are
counted and named, and the file is partial; every file stays inside the reader's limits; a
SIGKILLed rank's header says its end is unknown instead of naming a last call."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from harness.record import store
from harness.record.capture import BOOL, GROUP, INT, REDUCE, TENSORS, tensor_meta
from harness.record.cases import Recording, build, render
from harness.record.cli import partial_notes, translate_traces, wait_points
from harness.record.optable import Call
from harness.record.programs import build_programs
from harness.record.recorder import Recorder
from harness.record.trace import (
    MAX_LINE,
    MAX_TRACE_BYTES,
    RankTrace,
    TraceError,
    read_trace,
    tally_path,
)

from .helpers import HANG_S, REPO

PY = sys.executable
SITES = ['"/work/train.py:40"', '"/work/train.py:41"']


@functools.cache
def _meta(shape: tuple[int, ...]) -> tuple[Any, ...]:
    return tensor_meta(torch.empty(shape))


def _call(rec: Recorder, shape: tuple[int, ...], site: str = SITES[0],
          op: str = "c10d::allreduce_", tensors: int = 1) -> int:
    """One call as the hook records it (the same tuple, through the same queue)."""
    meta = _meta(shape)
    args: tuple[tuple[str, Any], ...] = (
        ("tensors", (TENSORS, (meta,) * tensors)), ("process_group", (GROUP, (0,))),
        ("reduce_op", (REDUCE, 0)), ("async_op", (BOOL, True)), ("timeout", (INT, -1)))
    seq = rec.next_seq()
    rec.count_call()
    rec.emit((op, args, "all_reduce", site, "MainThread", seq))
    return seq


def _wait(rec: Recorder, seq: int, site: str = '"/work/train.py:50"') -> None:
    rec.emit((seq, "work", rec.call_count(), site))


def _workload(rec: Recorder, steps: int) -> None:
    """A DDP-like loop: three bucket shapes from two sites, each waited after the next call."""
    shapes = [(65792,), (394752,), (1024, 3)]
    for step in range(steps):
        prev = None
        for k, shape in enumerate(shapes):
            seq = _call(rec, shape, SITES[k % 2])
            if prev is not None:
                _wait(rec, prev)
            prev = seq
        if prev is not None and step % 2:
            _wait(rec, prev)


def _recorded(tmp: Path, limits: store.Limits, fill: Any) -> tuple[RankTrace, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    rec = Recorder(str(tmp))
    rec.store = store.Store(limits)
    fill(rec)
    rec.close()
    (path,) = tmp.glob("trace-*.jsonl")
    return read_trace(path), path


def _case_file(trace: RankTrace, order: bool = False) -> str:
    calls, unknown = translate_traces([trace], skip_unknown=False)
    rec = Recording(world_size=1, calls=calls, source="test", unknown=unknown,
                    partial=partial_notes([trace], 0, order), waits=wait_points([trace]))
    return render(rec, build_programs if order else build)


WIDE = store.Limits(window_bytes=1 << 30, store_bytes=1 << 30)


def test_identical_calls_past_the_window_are_counted_and_the_case_file_is_the_same(
        tmp_path: Path) -> None:
    """The capped trace is a small fraction of the uncapped one, yet the case file built from
    it is the same text (counts, sites, waits and their distances): nothing it needs is lost,
    and it is not marked partial."""
    small = store.Limits(window_bytes=16 << 10)
    capped, path = _recorded(tmp_path / "capped", small, lambda r: _workload(r, 20_000))
    full, full_path = _recorded(tmp_path / "full", WIDE, lambda r: _workload(r, 20_000))
    assert path.stat().st_size <= small.window_bytes + 1024
    assert full_path.stat().st_size > 20 * path.stat().st_size
    assert capped.tally is not None and full.tally is None
    assert capped.tally.seen == 60_000 and capped.ended
    assert capped.tally.ordered_until is not None
    assert not capped.tally.dropped and not capped.tally.waits_dropped
    text = _case_file(capped)
    assert text == _case_file(full)
    assert "PARTIAL" not in text
    (case,) = yaml.safe_load(text)["cases"]
    assert case["description"] == (
        "Recorded: all_reduce issued 60000 time(s) by rank -1 at train.py:40 "
        "(torch.distributed.all_reduce, 40000x); train.py:41 (torch.distributed.all_reduce, "
        "20000x). Waited at train.py:50 after 1 later call(s) (40000x) and 1 other place(s).")
    assert partial_notes([capped], 0) == []


def test_two_hundred_thousand_identical_calls_stay_in_the_window(tmp_path: Path) -> None:
    """200,000 calls through the recorder's own queue and writer: the trace is bounded by the
    window, the count exact, the end record there."""
    def fill(rec: Recorder) -> None:
        for _ in range(200_000):
            _wait(rec, _call(rec, (1,)))

    limits = store.Limits(window_bytes=64 << 10)
    trace, path = _recorded(tmp_path, limits, fill)
    assert path.stat().st_size <= limits.window_bytes + 1024
    assert trace.ended and trace.tally is not None and trace.tally.seen == 200_000
    text = _case_file(trace)
    assert "PARTIAL" not in text
    (case,) = yaml.safe_load(text)["cases"]
    assert case["description"] == (
        "Recorded: all_reduce issued 200000 time(s) by rank -1 at train.py:40 "
        "(torch.distributed.all_reduce, 200000x). Waited at train.py:50 after 0 later call(s) "
        "(200000x).")


def test_distinct_calls_past_the_cap_are_counted_named_and_partial(tmp_path: Path) -> None:
    """300 distinct calls, each made 3 times, with room for 100: the 100 are stored with
    their repeats, the other 600 calls counted by op and reason, and the file says so."""
    limits = store.Limits(window_bytes=0, max_signatures=100)

    def fill(rec: Recorder) -> None:
        for _ in range(3):
            for k in range(1, 301):
                _call(rec, (k,))

    trace, _ = _recorded(tmp_path, limits, fill)
    assert trace.tally is not None
    assert (trace.tally.seen, trace.tally.stored, len(trace.calls)) == (900, 100, 100)
    assert sum(trace.tally.same.values()) == 200
    assert trace.tally.dropped == [("c10d::allreduce_", "past the cap of 100 distinct calls",
                                    600)]
    notes = partial_notes([trace], 0)
    assert notes == ["rank -1: 600 of its 900 call(s) were counted but not stored: 600 "
                     "c10d::allreduce_ (past the cap of 100 distinct calls)"]
    text = _case_file(trace)
    assert "# PARTIAL recording" in text and "issued 300 time(s)" in text
    assert "# 300 call(s)" in text


def test_a_wait_that_reaches_the_writer_before_its_call_is_still_counted() -> None:
    """The C++ kernel queues its calls apart from the Python waits: a wait can be in a batch
    before its call, or a batch before it. It is counted once its call comes; at exit, a wait
    whose call never came is counted as not stored."""
    rec = Recorder("/nonexistent")  # never writes: the store alone is driven here
    w = store.Store(store.Limits(window_bytes=0))

    def call(seq: int) -> tuple[Any, ...]:
        args = (("tensors", (TENSORS, (_meta((2,)),))), ("process_group", (GROUP, (0,))))
        return ("c10d::allreduce_", args, "all_reduce", SITES[0], "MainThread", seq)

    def wait(seq: int) -> tuple[Any, ...]:
        return (seq, "work", seq + 1, '"/work/train.py:50"')

    w.add_batch([{"header": rec.header()}, call(0), wait(0)])
    w.add_batch([wait(1), call(1)])  # the same batch, the wait first
    w.add_batch([wait(2)])  # its call in the next batch
    assert w.later and not w.waits_dropped
    w.add_batch([call(2)])
    assert w.waits == {(0, "work", 0, '"/work/train.py:50"'): 3} and not w.waits_dropped
    w.add_batch([wait(9)], final=True)
    assert w.waits_dropped == {"its call was never seen": 1} and not w.later


def test_counted_sends_and_receives_are_matched_by_their_counts() -> None:
    """A send counted 5 times meets receives counted 3 and 4: 5 messages, and the 2 receives
    left over are listed once with their count."""
    def p2p(op: str, rank: int, peer: int, count: int, site: str) -> Call:
        return Call(op=op, rank=rank, group=(0, 1), shape=(4,), dtype="float32", device="cpu",
                    layout="contiguous", peer=peer, site=site, api=op, count=count)

    calls = [p2p("send", 0, 1, 5, "a.py:1"), p2p("recv", 1, 0, 3, "b.py:1"),
             p2p("recv", 1, 0, 4, "b.py:2")]
    doc, notes = build(Recording(world_size=2, calls=calls, source="test"))
    (case,) = doc["cases"]
    assert case["description"].startswith("Recorded: 5 message(s) rank 0 -> rank 1")
    assert "a.py:1 (torch.distributed.send, 5x)" in case["description"]
    assert "b.py:1 (torch.distributed.recv, 3x); b.py:2 (torch.distributed.recv, 2x)" in (
        case["description"])
    assert notes == ["not replayed: unmatched recv on rank 1 (peer 0) at b.py:2 (2x)"]


def test_the_trace_never_grows_past_its_byte_cap(tmp_path: Path) -> None:
    limits = store.Limits(window_bytes=4 << 10, store_bytes=32 << 10)
    trace, path = _recorded(tmp_path, limits, lambda r: [_call(r, (k,)) for k in range(1, 5000)])
    assert path.stat().st_size <= limits.store_bytes + 100  # + the end record
    assert trace.tally is not None
    ((_, why, n),) = trace.tally.dropped
    assert why == "past the trace's cap of 32768 bytes" and n == 4999 - len(trace.calls)
    assert partial_notes([trace], 0)


def test_a_call_longer_than_the_readers_line_limit_is_counted_not_written(
        tmp_path: Path) -> None:
    """Such a line would make the reader refuse the whole trace: it is left out, by op."""
    def fill(rec: Recorder) -> None:
        _call(rec, (2,))
        _call(rec, (3,), tensors=12_000)  # about 1.3 MB of JSON
        _call(rec, (2,))

    trace, path = _recorded(tmp_path, store.LIMITS, fill)
    assert max(len(line) for line in path.read_text().splitlines()) < MAX_LINE
    assert [c["args"]["tensors"][0]["shape"] for c in trace.calls] == [[2], [2]]
    assert trace.tally is not None and trace.tally.dropped == [
        ("c10d::allreduce_", "its record is longer than the reader's 1 MiB line limit", 1)]
    assert "1 of its 3 call(s) were counted but not stored" in partial_notes([trace], 0)[0]


def test_the_default_caps_sit_inside_the_readers_limits() -> None:
    """By construction: a trace is at most store_bytes plus its header and end lines (each
    under MAX_LINE), a tally at most tally_bytes."""
    lim = store.LIMITS
    assert lim.window_bytes <= lim.store_bytes
    assert lim.store_bytes + 2 * MAX_LINE <= MAX_TRACE_BYTES
    assert lim.tally_bytes <= MAX_TRACE_BYTES
    assert store.Store(lim).wait_budget > lim.tally_bytes // 2


def test_program_granularity_says_the_order_past_the_window_is_lost(tmp_path: Path) -> None:
    """Programs need the issue order, which only the window keeps: they cover it, and the
    file is partial for programs (and only for them)."""
    trace, _ = _recorded(tmp_path, store.Limits(window_bytes=8 << 10),
                         lambda r: _workload(r, 2000))
    assert trace.tally is not None and trace.tally.ordered_until is not None
    assert partial_notes([trace], 0) == []
    (note,) = partial_notes([trace], 0, order=True)
    until = trace.tally.ordered_until
    assert note == (f"rank -1: its first {until} call(s) were stored in issue order and the "
                    f"programs cover them; its {6000 - until} later call(s) were counted per "
                    "distinct call, their order not kept")
    text = _case_file(trace, order=True)
    assert "# PARTIAL recording" in text and "program_step" in text


def _tally(tmp: Path, *lines: str) -> Path:
    head = {"header": {"format": "collective-record-trace", "version": 2, "torch": "x",
                       "rank": 0, "world_size": 1}}
    call = {"call": {"op": "c10d::allreduce_", "seq": 0, "site": "t.py:3", "group": [0],
                     "args": {"tensors": [{"shape": [2], "dtype": "float32", "device": "cpu"}]},
                     "api": "all_reduce"}}
    path = tmp / "trace-1.jsonl"
    path.write_text(json.dumps(head) + "\n" + json.dumps(call) + "\n")
    tally_path(path).write_text("".join(line + "\n" for line in lines))
    return path


GOOD_HEAD = '{"tally":{"format":"collective-record-trace","version":2,"seen":3,"stored":1,' \
            '"ordered_until":0}}'


@pytest.mark.parametrize(("lines", "message"), [
    ((GOOD_HEAD, '{"same":[7,2]}'), "record 2: counts for call seq 7, which its trace does "
                                    "not hold"),
    ((GOOD_HEAD, '{"same":[0,-2]}'), "record 2: 'same' must be a list of int, int"),
    ((GOOD_HEAD, '{"wait":[0,"work",true,"t.py:4",1]}'), "record 2: 'wait' must be a list"),
    ((GOOD_HEAD, '{"frob":1}'), "record 2: unknown record kind 'frob'"),
    ((GOOD_HEAD, '{"same":[0,'), "record 2: not JSON"),
    (('{"tally":{"format":"x"}}',), "record 1: not a collective-record-trace tally"),
    ((GOOD_HEAD.replace('"seen":3', '"seen":"3"'),), "record 1: seen and stored must be"),
])
def test_a_bad_tally_is_one_line_naming_the_file_and_record(tmp_path: Path,
                                                            lines: tuple[str, ...],
                                                            message: str) -> None:
    path = _tally(tmp_path, *lines)
    with pytest.raises(TraceError, match=message) as err:
        read_trace(path)
    assert str(tally_path(path)) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("which", ["trace", "tally"])
def test_a_trace_or_tally_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path,
                                                                       which: str) -> None:
    """The size limit is of what is read, not of what stat() says: /dev/zero claims 0 bytes."""
    path = _tally(tmp_path, GOOD_HEAD)
    target = path if which == "trace" else tally_path(path)
    target.unlink()
    target.symlink_to("/dev/zero")
    with pytest.raises(TraceError, match="not a regular file") as err:
        read_trace(path)
    assert str(target) in str(err.value)


LOOP = r'''
import os, sys, torch, torch.distributed as dist
from pathlib import Path
n, port = int(sys.argv[1]), sys.argv[2]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(1)
for _ in range(n):
    dist.all_reduce(t)
if len(sys.argv) > 3:   # wait until the flusher has written repeats' counts, then die unflushed
    import signal, time
    tally = Path(os.environ["COLLECTIVE_RECORD_DIR"]) / f"trace-{os.getpid()}.tally"
    while '"same"' not in (tally.read_text() if tally.exists() else ""):  # the test's limit
        time.sleep(0.01)  # bounds it; the tally is written whole, renamed in place
    os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
'''


def _record_loop(tmp: Path, calls: int, *extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp / "loop.py"
    script.write_text(LOOP)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    return subprocess.run([PY, "-m", "harness.record", "-o", str(tmp / "out.yaml"),
                           "--trace-dir", str(tmp / "traces"), "--", PY, str(script),
                           str(calls), port, *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)


def test_a_long_real_run_gives_a_complete_case_file_from_a_bounded_trace(
        tmp_path: Path) -> None:
    """100,000 real Gloo all_reduces (about five windows' worth): one trace under the window
    plus a few lines, a tally with every call, a complete case file with the exact count."""
    res = _record_loop(tmp_path, 100_000)
    assert res.returncode == 0, res.stderr
    (path,) = (tmp_path / "traces").glob("trace-*.jsonl")
    assert path.stat().st_size <= store.LIMITS.window_bytes + 4096
    trace = read_trace(path)
    assert trace.ended and trace.tally is not None and trace.tally.seen == 100_000
    text = (tmp_path / "out.yaml").read_text()
    assert "PARTIAL" not in text
    (case,) = yaml.safe_load(text)["cases"]
    assert case["description"].startswith("Recorded: all_reduce issued 100000 time(s) by rank 0")
    assert case["description"].endswith("Waited at loop.py:9 after 0 later call(s) (100000x).")


def test_a_sigkilled_rank_is_said_to_have_an_unknown_end(tmp_path: Path) -> None:
    """After SIGKILL no end or stop record: the header says what the trace knew by its last
    flush (calls made, stored) and never that its latest stored call was the last."""
    res = _record_loop(tmp_path, 30_000, "kill")
    assert res.returncode == 1, res.stderr
    text = (tmp_path / "out.yaml").read_text()
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert any("the launch command exited with status -9" in line for line in head)
    (note,) = [line for line in head if line.startswith("#   rank 0")]
    assert "rank 0: the end of its run is unknown (no end record" in note
    assert "any it made after its last flush are lost" in note
    assert "stopped" not in note and "last:" not in note
    made = int(note.split("accounts for ")[1].split(" ")[0])
    stored = int(note.split("call(s), ")[1].split(" ")[0])
    assert stored < made <= 30_000
    assert "latest distinct call stored: c10d::allreduce_ at " in note
