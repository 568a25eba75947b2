"""collective-record (issue 28): real workloads recorded, replayed on Gloo, caught on the mutant
backend; the recorder leaves the program's results alone; partial runs and bad traces are said."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.record import native
from harness.record.cases import Recording
from harness.record.cli import translate_traces
from harness.record.programs import build_programs
from harness.record.trace import TraceError, read_trace

from .helpers import HANG_S, REPO, load_report, run_pytest

PY = sys.executable
# example -> a fault of harness/mutate/faults.py that touches the ops it issues
WORKLOADS = {
    "ddp_buckets": "large_all_reduce_wrong",  # its 1.6 MB gradient bucket
    "pipeline_p2p": "recv_unwritten",
    "dtensor_redistribute": "dropped_contribution",  # Partial -> Shard(0) reduce_scatter
    "fsdp2_tiny": "dropped_contribution",  # the gradients' reduce_scatter
}


def _record(tmp: Path, *command: str, extra: tuple[str, ...] = ()
            ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([PY, "-m", "harness.record", *extra, "-o", str(tmp / "out.yaml"),
                           "--trace-dir", str(tmp / "traces"), "--", *command],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)


def _cases(path: Path) -> list[dict[str, object]]:
    return list(yaml.safe_load(path.read_text())["cases"])


@pytest.fixture(scope="module")
def ddp_recorded(tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The DDP example recorded once, its parameters written to rec.bin: two tests read it
    (the recording, and what DDP computed under it)."""
    where = tmp_path_factory.mktemp("ddp")
    return where, _record(where, PY, "examples/ddp_buckets.py", "--out", str(where / "rec.bin"))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_a_workload_recorded_replays_on_gloo_and_the_mutant_fails(
        tmp_path: Path, name: str, request: pytest.FixtureRequest) -> None:
    if name == "ddp_buckets":  # recorded once for this test and the next one
        recorded, res = request.getfixturevalue("ddp_recorded")
        tmp_path = recorded
    else:
        res = _record(tmp_path, PY, f"examples/{name}.py")
    assert res.returncode == 0, res.stderr
    shipped = REPO / "cases" / "recorded" / f"{name}.yaml"
    # the committed file is what the recorder writes today (only the header comment differs)
    assert _cases(tmp_path / "out.yaml") == _cases(shipped)
    ok = run_pytest(REPO, str(shipped), "-q", "--report-json", str(tmp_path / "ok.json"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert load_report(tmp_path / "ok.json")["summary"]["verdict"] == "PASS"
    bad = run_pytest(REPO, str(shipped), "-q", "--backend-module", "harness.mutate.backend",
                     "--backend", "mutant", "--report-json", str(tmp_path / "bad.json"),
                     extra_env={"COLLECTIVE_MUTANT": WORKLOADS[name]})
    assert bad.returncode != 0, bad.stdout
    assert load_report(tmp_path / "bad.json")["summary"]["verdict"] == "FAIL"


def test_the_ddp_workload_has_several_buckets_and_the_initial_broadcast() -> None:
    cases = {c["name"]: c for c in _cases(REPO / "cases" / "recorded" / "ddp_buckets.yaml")}
    grads = cases["all_reduce_float32_sum_async"]
    assert isinstance(grads["shape"], list) and len(grads["shape"]) >= 2
    assert "issued from C++" in str(grads["description"])
    assert "_sync_module_states" in str(cases["broadcast_float32"]["description"])


def test_recording_does_not_change_what_ddp_computes(
        tmp_path: Path, ddp_recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    plain = tmp_path / "plain.bin"
    subprocess.run([PY, "examples/ddp_buckets.py", "--out", str(plain)], cwd=REPO, check=True,
                   timeout=HANG_S, env={**os.environ, "PYTHONPATH": str(REPO)})
    recorded, res = ddp_recorded
    assert res.returncode == 0, res.stderr
    assert "36 call(s)" in res.stdout  # it did record
    assert plain.read_bytes() == (recorded / "rec.bin").read_bytes()
    assert len(plain.read_bytes()) > 1 << 20


FAMILIES = r'''
import os, sys, torch, torch.distributed as dist
import torch.distributed._functional_collectives as fc
rank = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=rank, world_size=2)
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
    launcher.write_text(
        "import socket, subprocess, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = str(s.getsockname()[1]); "
        "s.close()\n"
        f"ps = [subprocess.Popen([sys.executable, {str(script)!r}, str(r), port]) "
        "for r in (0, 1)]\n"
        "sys.exit(max(p.wait() for p in ps))\n")
    res = _record(tmp_path, PY, str(launcher))
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
    res = _record(tmp_path, PY, str(script))
    assert res.returncode == 1, res.stderr
    assert "PARTIAL" in res.stdout
    text = (tmp_path / "out.yaml").read_text()
    assert "# PARTIAL recording" in text
    assert "exited with status" in text
    assert "rank 1 stopped by os._exit(3) after 1 call(s); last: c10d::allreduce_ at " in text
    assert "dies.py:6" in text
    assert any(c["op"] == "all_reduce" for c in _cases(tmp_path / "out.yaml"))


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
def test_a_foreign_trace_names_the_file_and_record(tmp_path: Path, text: str,
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
    res = _record(tmp_path, str(tmp_path / "no-such-program"))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("collective-record: error:")
    res = _record(tmp_path, PY, "-c", "print('no collectives here')")
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


LATE = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    a, b = torch.ones(4), torch.ones(2, 3)
    w = dist.all_reduce(a, op=dist.ReduceOp.MAX, async_op=True)
    dist.all_reduce(b, op=dist.ReduceOp.MIN)
    w.wait()                                  # long before the flusher's first batch
    v = dist.all_reduce(a, op=dist.ReduceOp.PRODUCT, async_op=True)
    dist.barrier()
    v.wait()
    dist.destroy_process_group()
if __name__ == "__main__":
    import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(port,), nprocs=2)
'''


def test_what_the_writer_thread_reads_later_is_what_each_call_had(tmp_path: Path) -> None:
    """The hook keeps the ReduceOp and the returned Work as they are and the flusher thread
    reads them: each call still gets its own reduce op, and a wait() issued right after the
    call (before any batch) is matched to its call, not lost or given to another."""
    script = tmp_path / "late.py"
    script.write_text(LATE)
    res = _record(tmp_path, PY, str(script))
    assert res.returncode == 0, res.stderr
    traces = [read_trace(p) for p in sorted((tmp_path / "traces").glob("trace-*.jsonl"))]
    ranks = [t for t in traces if t.rank >= 0]
    assert sorted(t.rank for t in ranks) == [0, 1]
    for t in ranks:
        calls = [(c["op"], c.get("reduce_op")) for c in t.calls]
        assert calls == [("c10d::allreduce_", "max"), ("c10d::allreduce_", "min"),
                         ("c10d::allreduce_", "product"), ("c10d::barrier", None)]
        seqs = [c["seq"] for c in t.calls]
        # the synchronous calls' own waits (inside torch.distributed) are recorded too
        assert [(w["call"], w["after"]) for w in t.waits] == [
            (seqs[1], 2), (seqs[0], 2), (seqs[3], 4), (seqs[2], 4)]


@pytest.mark.parametrize("program", ["examples/pipeline_p2p.py", "late"])
def test_the_cpp_and_python_kernels_write_the_same_trace(tmp_path: Path, program: str) -> None:
    """--hook native (the C++ kernel for c10d ops) and --hook python record the same calls,
    arguments, sites, waits and case file: only the header's hook and pid differ."""
    if program == "late":
        (tmp_path / "late.py").write_text(LATE)
        program = str(tmp_path / "late.py")
    got = {}
    for hook in ("native", "python"):
        out = tmp_path / hook
        out.mkdir()
        res = _record(out, PY, program, extra=("--hook", hook))
        assert res.returncode == 0, res.stderr
        traces = sorted((read_trace(p) for p in (out / "traces").glob("trace-*.jsonl")),
                        key=lambda t: t.rank)
        assert {json.loads(p.read_text().split("\n", 1)[0])["header"]["hook"]
                for p in (out / "traces").glob("trace-*.jsonl")} == {hook}
        got[hook] = ([(t.rank, t.calls, t.waits, t.ended) for t in traces],
                     (out / "out.yaml").read_text().split("\n", 1)[1])
    assert got["native"] == got["python"]
    assert got["native"][0] and all(calls for _, calls, _, _ in got["native"][0])


LOAD_KERNEL = """
from harness.record import native
print(native.__file__)
print(native.load().__file__)
"""


def test_a_second_checkout_of_the_same_sources_finds_the_kernel_built(tmp_path: Path) -> None:
    """Two checkouts (or an install, as gpu-check's dry run makes) of the same sources load
    the one build: the second does not rebuild it (ninja logs each command it runs)."""
    other = tmp_path / "other"
    shutil.copytree(REPO / "harness", other / "harness",
                    ignore=shutil.ignore_patterns("__pycache__"))

    def load(where: Path) -> list[str]:
        got = subprocess.run([PY, "-c", LOAD_KERNEL], cwd=tmp_path, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": str(where)},
                             timeout=HANG_S, check=False)
        assert got.returncode == 0, got.stderr[-2000:]
        return got.stdout.split()

    source, built = load(REPO)  # builds it if no earlier test has
    assert source.startswith(str(REPO))
    log = Path(built).parent / ".ninja_log"
    before = log.read_text()
    source, again = load(other)
    assert source.startswith(str(other)) and again == built
    assert log.read_text() == before, "the second checkout rebuilt the kernel"


def test_without_a_compiler_the_python_kernel_records_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CXX": str(tmp_path / "no-such-compiler"),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    base = [PY, "-m", "harness.record", "-o", str(tmp_path / "out.yaml"), "--trace-dir",
            str(tmp_path / "traces")]
    res = subprocess.run([*base, "--", PY, "examples/pipeline_p2p.py"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert res.returncode == 0, res.stderr
    # the build is announced before it starts (it takes minutes on a busy machine)
    assert res.stderr.startswith("collective-record: building the C++ recording kernel (once: "
                                 "about 30 s on an idle machine, minutes on a busy one; cached "
                                 f"under {tmp_path / 'ext'} for later runs)..."), res.stderr
    assert "recording with the Python kernel (the C++ one cannot be built here" in res.stderr
    heads = [json.loads(p.read_text().split("\n", 1)[0])["header"]
             for p in (tmp_path / "traces").glob("trace-*.jsonl")]
    assert heads and all(h["hook"] == "python" for h in heads)
    res = subprocess.run([*base, "--hook", "native", "--", PY, "examples/pipeline_p2p.py"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert res.returncode == 2
    announced, error = res.stderr.splitlines()
    assert announced.startswith("collective-record: building the C++ recording kernel")
    assert error.startswith("collective-record: error: --hook native: the C++ kernel "
                            "cannot be built:")


def test_a_kernel_built_before_is_loaded_without_a_word(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """The build line is printed only while the kernel is not in torch's cache."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(native, "load", lambda verbose=False: "module")
    # an earlier test in this process may have loaded the kernel: this one starts from none
    monkeypatch.setattr(native, "_MODULE", [])
    assert not native.is_built()
    assert native.load_announced("collective-record") == "module"
    assert "building the C++ recording kernel" in capsys.readouterr().err
    folder = native.build_folder()
    assert folder is not None and folder.parent == tmp_path
    (folder / f"{native.NAME}.so").write_bytes(b"")
    assert native.is_built()
    assert native.load_announced("collective-record") == "module"
    assert capsys.readouterr().err == ""


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
    res = _record(tmp_path, PY, str(script), extra=("--hook", hook))
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
    res = _record(tmp_path, PY, str(script), extra=("--hook", hook))
    assert res.returncode == 0, res.stderr
    trace = next(t for t in (read_trace(p) for p in (tmp_path / "traces").glob("trace-*.jsonl"))
                 if t.rank == 0)
    calls = [c for c in trace.calls if c["op"] == "c10d::allreduce_"]
    assert [(c["group"], c.get("own_group")) for c in calls] == [([0, 1], None),
                                                                 ([0, 1], True)]
    cases = _cases(tmp_path / "out.yaml")
    assert [c.get("args") for c in cases if c["op"] == "all_reduce"] == [None, {"group": [0, 1]}]
    # --granularity program from the same traces: the step names the group too
    traces = sorted((read_trace(p) for p in (tmp_path / "traces").glob("trace-*.jsonl")),
                    key=lambda t: t.rank)
    translated, _ = translate_traces([t for t in traces if t.rank >= 0], False)
    doc, _ = build_programs(Recording(world_size=2, calls=translated, source="test"))
    steps = [s for c in doc["cases"] for s in c["steps"] if s.get("op") == "all_reduce"]
    assert [s.get("group") for s in steps] == [None, [0, 1]]
