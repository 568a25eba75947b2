"""collective-record's traces (issue 28): every family of torch.distributed calls seen and
translated, a dead rank's partial case file, a rank killed while blocked still leaves its trace,
and bad traces or bad input to the command said in one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness.record.cli import translate_traces
from harness.record.trace import TraceError, read_trace

from .helpers import HANG_S, REPO
from .record_helpers import PY, cases_of, record

FAMILIES = r'''
import os, sys, torch, torch.distributed as dist
import torch.distributed._functional_collectives as fc
rank = int(sys.argv[1])
# A file store: a port chosen free by the launcher could be taken before rank 0 listens on it,
# and rank 1 then retried its connection for the store's whole timeout (seen once in a run).
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
t = torch.ones(4)
dist.all_reduce(t); dist.broadcast(t, 1); dist.reduce(t, 0)
dist.all_gather([torch.zeros(4), torch.zeros(4)], t)
dist.all_gather_into_tensor(torch.zeros(8), t)
dist.reduce_scatter_tensor(torch.zeros(2), t)
dist.all_to_all_single(torch.zeros(4), t)
dist.all_reduce_coalesced([t, torch.ones(2)])
dist.gather(t, [torch.zeros(4), torch.zeros(4)] if rank == 0 else None, 0)
dist.scatter(t, [torch.ones(4), torch.ones(4)] if rank == 0 else None, 0)
dist.broadcast_object_list([rank], 0)
dist.barrier()
w = dist.isend(t, 1 - rank) if rank == 0 else dist.irecv(t, 0)
w.wait()
dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1 - rank),
                        dist.P2POp(dist.irecv, torch.zeros(4), 1 - rank)])[0].wait()
sub = dist.new_group([0, 1]); dist.all_reduce(t, group=sub)
x = fc.all_reduce(torch.ones(3), "sum", dist.group.WORLD); x = x + 1
dist.destroy_process_group()
'''

FAMILY_OPS = {"c10d::allreduce_", "c10d::broadcast_", "c10d::reduce_", "c10d::allgather_",
              "c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::alltoall_base_",
              "c10d::allreduce_coalesced_", "c10d::gather_", "c10d::scatter_",
              "c10d::barrier", "c10d::send", "c10d::recv_", "_c10d_functional::all_reduce"}


def test_every_family_is_seen_and_translated(tmp_path: Path) -> None:
    script = tmp_path / "fam.py"
    script.write_text(FAMILIES)
    launcher = tmp_path / "launch.py"
    store = tmp_path / "store"
    launcher.write_text(
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, {str(script)!r}, str(r), {str(store)!r}]) "
        "for r in (0, 1)]\n"
        "sys.exit(max(p.wait() for p in ps))\n")
    res = record(tmp_path, PY, str(launcher))
    assert res.returncode == 0, res.stderr
    traces = [read_trace(p) for p in sorted((tmp_path / "traces").glob("trace-*.jsonl"))]
    traces = [t for t in traces if t.rank >= 0]
    assert len(traces) == 2
    ops = {c["op"] for c in traces[0].calls}
    assert ops >= FAMILY_OPS, FAMILY_OPS - ops
    # the functional all_reduce's wait (the async tensor's first use) is seen and matched
    assert any(w["what"] == "tensor" and w["call"] is not None for w in traces[0].waits)
    # the group made by new_group is written as global ranks; the object collective's
    # broadcasts show up under its API name
    assert {c.get("api") for c in traces[0].calls} >= {"broadcast_object_list",
                                                         "batch_isend_irecv", "isend"}
    text = (tmp_path / "out.yaml").read_text()
    assert "p2p_float32_0to1" in text and "not replayed" not in text


DIES = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.all_reduce(torch.ones(3))
    if rank == 1:
        os._exit(3)   # a dead rank: no clean shutdown
    dist.barrier()    # never completes: rank 1 is gone
if __name__ == "__main__":
    import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(port,), nprocs=2)
'''


def test_a_dead_rank_leaves_a_partial_case_file_that_says_where(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    res = record(tmp_path, PY, str(script))
    assert res.returncode == 1, res.stderr
    assert "PARTIAL" in res.stdout
    text = (tmp_path / "out.yaml").read_text()
    assert "# PARTIAL recording" in text
    assert "exited with status" in text
    assert "rank 1 stopped by os._exit(3) after 1 call(s); last: c10d::allreduce_ at " in text
    assert "dies.py:6" in text
    assert any(c["op"] == "all_reduce" for c in cases_of(tmp_path / "out.yaml"))


def _trace(tmp: Path, *records: object, end: bool = True, raw: str = "") -> Path:
    head = {"header": {"format": "collective-record-trace", "version": 1, "torch": "x",
                       "rank": 0, "world_size": 2}}
    lines = [json.dumps(head), *(json.dumps(r) for r in records)]
    if end:
        lines.append(json.dumps({"end": {"calls": len(records)}}))
    path = tmp / "trace-1.jsonl"
    path.write_text("\n".join(lines) + "\n" + raw)
    return path


CALL = {"call": {"op": "c10d::allreduce_", "seq": 0, "site": "t.py:3", "group": [0, 1],
                 "args": {"tensors": [{"shape": [2], "dtype": "float32", "device": "cpu"}],
                          "async_op": False}, "reduce_op": "sum", "api": "all_reduce"}}


def test_a_torn_last_record_is_kept_as_a_note(tmp_path: Path) -> None:
    t = read_trace(_trace(tmp_path, CALL, end=False, raw='{"call": {"op": "c10'))
    assert len(t.calls) == 1 and not t.ended
    assert t.truncated == "record 3 cut off mid-write"


@pytest.mark.parametrize(("text", "message"), [
    ('{"header": {"format": "something-else"}}\n', "record 1: not a collective-record-trace"),
    ("\x00\xff garbage", "not UTF-8"),
    ("", "empty"),
])
def test_a_foreign_trace_names_the_file_andrecord(tmp_path: Path, text: str,
                                                   message: str) -> None:
    path = tmp_path / "trace-9.jsonl"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(TraceError, match=message) as err:
        read_trace(path)
    assert str(path) in str(err.value)


def test_a_bad_record_in_the_middle_is_an_error_not_a_skip(tmp_path: Path) -> None:
    path = _trace(tmp_path, CALL, {"call": {"op": "c10d::allreduce_"}})
    with pytest.raises(TraceError, match=r"record 3: call field 'seq' is missing"):
        read_trace(path)


def test_an_op_the_table_lacks_is_named_never_dropped(tmp_path: Path) -> None:
    odd = {"call": {**CALL["call"], "op": "c10d::frobnicate_", "seq": 1}}
    trace = read_trace(_trace(tmp_path, CALL, odd))
    with pytest.raises(Exception, match=r"trace-1.jsonl: call record 2 \(seq 1\): "
                                        r"c10d::frobnicate_ is not in the op table"):
        translate_traces([trace], skip_unknown=False)
    calls, unknown = translate_traces([trace], skip_unknown=True)
    assert [c.op for c in calls] == ["all_reduce"]
    assert len(unknown) == 1 and "c10d::frobnicate_" in unknown[0]


def test_bad_input_to_the_command_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = record(tmp_path, str(tmp_path / "no-such-program"))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("collective-record: error:")
    res = record(tmp_path, PY, "-c", "print('no collectives here')")
    assert res.returncode == 2 and "made no collective call" in res.stderr
    assert not (tmp_path / "out.yaml").exists()


BLOCKED = r'''
import os, sys, time, torch, torch.distributed as dist
rank, ready = int(sys.argv[1]), sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=rank, world_size=2)
dist.all_reduce(torch.ones(3))
if rank == 0:
    w = dist.irecv(torch.zeros(3), src=1)   # never sent: rank 0 blocks in wait()
    open(ready, "w").close()
    w.wait()
else:
    time.sleep(60)
'''


def test_a_rank_killed_while_blocked_in_a_collective_leaves_its_trace(tmp_path: Path) -> None:
    """Records are written in batches; SIGTERM to a rank blocked inside C++ still writes
    them (well inside the 0.5 s timer), and the rank dies by the signal as it would have."""
    script, ready, traces = tmp_path / "blocked.py", tmp_path / "ready", tmp_path / "traces"
    script.write_text(BLOCKED)
    traces.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "harness" / "record" /
                                                            "site"), str(REPO)]),
           "COLLECTIVE_RECORD_DIR": str(traces)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([PY, str(script), str(r), port, str(ready)], env=env)
             for r in (0, 1)]
    try:
        deadline = time.monotonic() + HANG_S
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ready.exists()
        time.sleep(0.05)  # inside wait() now; the flusher's timer is 0.5 s
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=HANG_S) == -signal.SIGTERM
    finally:
        for p in procs:
            p.kill()
            p.wait()
    (trace,) = [t for t in (read_trace(p) for p in traces.glob("trace-*.jsonl"))
                if t.rank == 0]
    assert [c["op"] for c in trace.calls] == ["c10d::allreduce_", "c10d::recv_"]
    assert not trace.ended and trace.stopped == "SIGTERM"  # flushed, so it knows its end

