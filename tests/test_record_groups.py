"""collective-record and process groups (issue 28, issue 43.9): a sparse call, a group name torch
reuses after destroy_process_group, and a new_group of the whole world kept a group of its
own, with each kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.record.cases import Recording
from harness.record.cli import translate_traces
from harness.record.programs import build_programs
from harness.record.trace import read_trace

from .record_helpers import PY, cases_of, record

REUSE = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    g = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(2), group=g)
    i = torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    dist.all_reduce(i)                                     # sparse: no strides
    dist.destroy_process_group()
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            init_method=f"tcp://127.0.0.1:{port + 1}")
    h = dist.new_group([1])                                # torch may reuse the name of g
    if rank == 1:
        dist.all_reduce(torch.ones(2), group=h)
    dist.barrier()
    dist.destroy_process_group()
if __name__ == "__main__":
    import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(port,), nprocs=2)
'''


@pytest.mark.parametrize("hook", ["native", "python"])
def test_a_sparse_call_and_a_reused_group_name_are_recorded_right(tmp_path: Path,
                                                                   hook: str) -> None:
    """A sparse tensor is recorded with its layout and no strides; a group created after
    destroy_process_group gets its own ranks even where torch reuses a name."""
    script = tmp_path / "reuse.py"
    script.write_text(REUSE)
    res = record(tmp_path, PY, str(script), extra=("--hook", hook))
    assert res.returncode == 0, res.stderr
    traces = {t.rank: t for t in (read_trace(p) for p in
                                  (tmp_path / "traces").glob("trace-*.jsonl"))}
    groups = [c["group"] for c in traces[1].calls if c["op"] == "c10d::allreduce_"]
    assert groups == [[0, 1], [0, 1], [1]]
    sparse = [c for c in traces[1].calls if c["op"] == "c10d::allreduce_"][1]
    assert sparse["args"]["tensors"][0]["layout"] == "sparse_coo"
    assert sparse["args"]["tensors"][0]["stride"] is None


OWN_WORLD = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    everyone = dist.new_group([0, 1])                      # the world's ranks, its own group
    dist.all_reduce(torch.ones(3))
    dist.all_reduce(torch.ones(3), group=everyone)
    dist.destroy_process_group()
if __name__ == "__main__":
    import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(port,), nprocs=2)
'''


@pytest.mark.parametrize("hook", ["native", "python"])
def test_a_new_group_of_the_whole_world_stays_a_group_of_its_own(tmp_path: Path,
                                                                   hook: str) -> None:
    """Issue 43.9: a new_group whose members are the world was written as the default group;
    a backend may treat it otherwise (its own communicator), so the case keeps it apart."""
    script = tmp_path / "own.py"
    script.write_text(OWN_WORLD)
    res = record(tmp_path, PY, str(script), extra=("--hook", hook))
    assert res.returncode == 0, res.stderr
    trace = next(t for t in (read_trace(p) for p in (tmp_path / "traces").glob("trace-*.jsonl"))
                 if t.rank == 0)
    calls = [c for c in trace.calls if c["op"] == "c10d::allreduce_"]
    assert [(c["group"], c.get("own_group")) for c in calls] == [([0, 1], None),
                                                                 ([0, 1], True)]
    cases = cases_of(tmp_path / "out.yaml")
    assert [c.get("args") for c in cases if c["op"] == "all_reduce"] == [None, {"group": [0, 1]}]
    # --granularity program from the same traces: the step names the group too
    traces = sorted((read_trace(p) for p in (tmp_path / "traces").glob("trace-*.jsonl")),
                    key=lambda t: t.rank)
    translated, _ = translate_traces([t for t in traces if t.rank >= 0], False)
    doc, _ = build_programs(Recording(world_size=2, calls=translated, source="test"))
    steps = [s for c in doc["cases"] for s in c["steps"] if s.get("op") == "all_reduce"]
    assert [s.get("group") for s in steps] == [None, [0, 1]]
