"""collective-record --from-trace (issue 28 point 4): Flight Recorder dumps (JSON and pickle)
and execution traces produced by a real Gloo run become case files that replay on Gloo;
what the trace lacked is written down; hostile and foreign files are refused in one line."""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.record import fromtrace, importing, plaindata
from harness.record.fromtrace import recording_from_files
from harness.record.trace import TraceError

from .helpers import HANG_S, REPO, load_report, run_pytest

PY = sys.executable

# Every rank writes its Flight Recorder dump as JSON (fr_json_<rank>) and as the pickle a
# TORCH_FR_DUMP_TEMP_FILE dump writes (fr_pkl_<rank>), and an execution trace (et_<rank>.json).
PRODUCE = r'''
import os, socket, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.profiler import ExecutionTraceObserver
from torch._C import _distributed_c10d as c10d
def run(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    et = ExecutionTraceObserver().register_callback(f"{out}/et_{rank}.json")
    et.start()
    t = torch.ones(4)
    dist.all_reduce(t); dist.broadcast(t, 1); dist.reduce(t, 0)
    dist.all_reduce(torch.ones(3, 5, dtype=torch.bfloat16), op=dist.ReduceOp.MAX)
    w = dist.all_reduce(torch.ones(6), async_op=True); w.wait()
    dist.all_gather_into_tensor(torch.zeros(8), t)
    dist.scatter(t, [torch.ones(4), torch.ones(4)] if rank == 0 else None, 0)
    dist.barrier()
    w = dist.isend(t, 1) if rank == 0 else dist.irecv(t, 0)
    w.wait()
    sub = dist.new_group([0, 1]); dist.all_reduce(t, group=sub)
    et.stop(); et.unregister_callback()
    open(f"{out}/fr_json_{rank}", "wb").write(c10d._dump_fr_trace_json())
    open(f"{out}/fr_pkl_{rank}", "wb").write(c10d._dump_fr_trace())
    dist.destroy_process_group()
if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port, sys.argv[1]), nprocs=2)
'''


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dumps")
    script = out / "produce.py"
    script.write_text(PRODUCE)
    subprocess.run([PY, str(script), str(out)], check=True, timeout=HANG_S, capture_output=True,
                   env={**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"})
    return out


def _small() -> None:
    # A hostile file that gets past a bound fails the test with a MemoryError here, instead
    # of filling the machine (the import itself needs well under 100 MiB).
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _import(tmp: Path, *paths: Path, extra: tuple[str, ...] = (), timeout: float = HANG_S
            ) -> subprocess.CompletedProcess[str]:
    """collective-record --from-trace in a child: a file that blocks it or costs without
    bound fails the test (timeout, memory limit) rather than hanging it."""
    return subprocess.run([PY, "-m", "harness.record", "--from-trace", *map(str, paths),
                           *extra, "-o", str(tmp / "out.yaml")], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)},
                          preexec_fn=_small)


def _cases(path: Path) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in yaml.safe_load(path.read_text())["cases"]}


def test_flight_recorder_and_execution_traces_of_a_real_run_replay_on_gloo(
        tmp_path: Path, dumps: Path) -> None:
    fr, et = tmp_path / "fr", tmp_path / "et"
    for folder, files in ((fr, ("fr_json_0", "fr_json_1")), (et, ("et_0.json", "et_1.json"))):
        folder.mkdir()
        res = _import(folder, *(dumps / f for f in files))
        assert res.returncode == 0, res.stderr
    fr_text = (fr / "out.yaml").read_text()
    fr_cases = _cases(fr / "out.yaml")
    # Flight Recorder has no roots: every rank is tried, and the header says what it lacked
    assert fr_cases["broadcast_float32"]["args"] == {"src": [0, 1]}
    assert fr_cases["all_reduce_bfloat16"]["shape"] == [3, 5]
    assert fr_cases["scatter_float32"]["shape"] == [2, 4]
    assert "# the trace lacked: the reduce op of each reduction: replayed with sum" in fr_text
    assert "# the trace lacked: call sites" in fr_text
    # Gloo's dumps do not list a new group's members: its call is named, not replayed
    assert "not replayed: 1 call(s) of rank 0 on process group '1'" in fr_text
    et_cases = _cases(et / "out.yaml")
    # the execution trace has roots, async_op and strides, not reduce ops or groups
    assert et_cases["broadcast_float32"]["args"] == {"src": 1}
    assert et_cases["all_reduce_float32_async"]["shape"] == [6]
    assert "p2p_float32_0to1" in et_cases
    assert "process group of each call (written as <Object>)" in (et / "out.yaml").read_text()
    # the backend's own child node (gloo:all_reduce) is not counted twice
    assert "all_reduce issued 4 time(s)" in et_cases["all_reduce_float32"]["description"]
    ok = run_pytest(REPO, str(fr / "out.yaml"), str(et / "out.yaml"), "-q",
                    "--report-json", str(tmp_path / "ok.json"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = load_report(tmp_path / "ok.json")
    assert report["summary"]["verdict"] == "PASS"
    assert len(report["records"]) >= 15


def test_the_pickle_dump_gives_the_json_cases_and_call_sites(tmp_path: Path,
                                                             dumps: Path) -> None:
    from_json = recording_from_files([dumps / "fr_json_0", dumps / "fr_json_1"])
    from_pickle = recording_from_files([dumps / "fr_pkl_0", dumps / "fr_pkl_1"])
    def key(c: Any) -> tuple[Any, ...]:
        return (c.op, c.rank, c.shape, c.dtype, c.group, c.seq)
    assert sorted(map(key, from_json.calls)) == sorted(map(key, from_pickle.calls))
    assert all(c.site.startswith(str(dumps / "produce.py")) for c in from_pickle.calls)
    assert {c.api for c in from_pickle.calls} >= {"all_reduce", "broadcast", "scatter"}


class Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_pickle_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    dump = tmp_path / "fr_pkl_0"
    dump.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {},
                                   "entries": [Evil(marker)]}, protocol=2))
    res = _import(tmp_path, dump)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1, res.stderr
    assert f"{dump}: not a plain-data pickle, refused without running it" in res.stderr
    assert "refuses the global posix.system" in res.stderr
    assert not marker.exists() and not (tmp_path / "out.yaml").exists()


ENTRY = {"record_id": 0, "profiling_name": "gloo:all_reduce", "process_group": ["0", "default_pg"],
         "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"],
         "output_dtypes": ["Float"], "collective_seq_id": 1, "p2p_seq_id": 0,
         "state": "scheduled"}


def _dump(tmp: Path, *entries: Any, name: str = "fr_0", **top: Any) -> Path:
    doc = {"version": "2.10", "pg_config": {}, "entries": list(entries), **top}
    path = tmp / name
    path.write_text(json.dumps(doc))
    return path


def _init(size: str) -> dict[str, Any]:
    """An execution trace's process_group:init node: the default group of ``size`` ranks (JSON
    text, as torch writes it)."""
    return {"id": 1, "name": "## process_group:init ##", "inputs": {"values": [
        '[{"pg_name": "0", "pg_desc": "default_pg", "group_size": ' + size + "}]"]}}


ET_NODE = {"id": 7, "name": "c10d::allreduce_", "ctrl_deps": 1, "inputs": {
    "values": [[[2, 3, 0, 4, 4, "cpu"]], "<Object>"], "shapes": [[[4]], []],
    "types": ["GenericList[Tensor(float)]", "Object"]},
    "attrs": [{"name": "op_schema", "value": "c10d::allreduce_(Tensor[] tensors, "
               "__torch__.torch.classes.c10d.ProcessGroup process_group) -> Tensor[]"}]}


@pytest.mark.parametrize(("doc", "message"), [
    ('{"version": "2.10", "entries": [{"record_id"',
     "not JSON at line 1 column 45 .*a truncated dump"),
    ({"entries": [{**ENTRY, "input_sizes": "abc"}]},
     r"entry 0: field 'input_sizes' is missing or not a list"),
    ({"entries": [ENTRY, {**ENTRY, "input_sizes": [[10 ** 20]]}]},
     r"entry 1 \(gloo:all_reduce\): an input size has a size 1000.* outside 0..2\*\*40"),
    ({"entries": [{**ENTRY, "input_dtypes": ["Float8_e4m3fn"]}]},
     "entry 0 .*dtype 'Float8_e4m3fn' is not one the harness runs"),
    ({"version": "3.0", "entries": []}, "Flight Recorder format version '3.0'"),
    ({"version": "2.10", "rows": []}, "neither a Flight Recorder dump .* nor an execution trace"),
    ({"schema": "9.0.0", "nodes": []}, "execution trace schema '9.0.0'"),
    ({"entries": [{**ENTRY, "profiling_name": "nccl:all_gather_v"},
                  {**ENTRY, "profiling_name": "nccl:split"}]},
     r"entry 0: 'nccl:all_gather_v' is not in the op table \(and 1 more\); rerun with "
     "--skip-unknown"),
    ({"entries": [{**ENTRY, "profiling_name": "mystery:all_reduce"}]},
     "backend 'mystery' .* is not one this import reads"),
    # issue 38: what got past the checks before, each a traceback, a hang or a memory blow-up
    ('{"version": "2.10", "entries": [{"record_id": ' + "9" * 5000 + "}]}",
     r"at entries\[0\]\.record_id: an integer of 5000 digits"),
    ({"pg_config": {"0": {"desc": "default_pg", "ranks": "[" * 100_000}}, "entries": []},
     r"pg_config\['0'\]: ranks \[\[\[.*: JSON nested more than 64 levels deep"),
    ({"pg_config": {"0": {"desc": "default_pg", "ranks": "[" * 80 + "]" * 80}}, "entries": []},
     r"pg_config\['0'\]: ranks .*: at \[0\].*: nested more than 64 levels deep"),
    ({"pg_config": {"0": {"desc": "default_pg", "ranks": json.dumps([0, 1 << 20])}},
      "entries": []}, r"pg_config\['0'\]: ranks is not a list of at most 1048576 ranks"),
    ({"rank": 1 << 20, "entries": [ENTRY]}, "field 'rank' is not a rank below 1048576"),
    ({"entries": [{**ENTRY, "input_dtypes": [], "output_dtypes": float("inf")}]},
     r"entry 0 \(gloo:all_reduce\): no input sizes or dtypes for a all_reduce"),
    ({"schema": "1.1.0", "nodes": [_init("Infinity")]},
     r"entry 0 \(process_group:init\): a group is not \{pg_desc: name, group_size: "
     r"1\.\.1048576\}: pg_desc 'default_pg', group_size inf"),
    ({"schema": "1.1.0", "nodes": [_init(str(10 ** 12)), ET_NODE]},
     r"entry 0 \(process_group:init\): a group is not .*group_size 1000000000000$"),
    ({"schema": "1.1.0", "nodes": [{**ET_NODE, "id": [7]}]},
     r"entry 0: 'id' is not a node id \(an integer\): \[7\]"),
    ({"schema": "1.1.0", "nodes": [ET_NODE, {**ET_NODE, "id": 8, "ctrl_deps": {"a": 1}}]},
     r"entry 1: 'ctrl_deps' is not a node id"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_entry(tmp_path: Path, doc: Any,
                                                          message: str) -> None:
    path = tmp_path / "dump_0"
    path.write_text(doc if isinstance(doc, str) else json.dumps(
        {"version": "2.10", "pg_config": {}, **doc}))
    res = _import(tmp_path, path)
    assert res.returncode == 2, res.stdout
    assert res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"collective-record: error: {path}"), res.stderr
    assert re.search(message, res.stderr), res.stderr
    assert not (tmp_path / "out.yaml").exists()


def test_unknown_ops_are_listed_in_the_file_with_skip_unknown(tmp_path: Path) -> None:
    path = _dump(tmp_path, ENTRY, {**ENTRY, "record_id": 1,
                                   "profiling_name": "nccl:all_gather_v"})
    res = _import(tmp_path, path, extra=("--skip-unknown",))
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out.yaml").read_text()
    assert f"# not translated (op table lacks it): {path}: entry 1: 'nccl:all_gather_v'" in text
    assert list(_cases(tmp_path / "out.yaml")) == ["all_reduce_float32"]


def test_work_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _dump(tmp_path, ENTRY, ENTRY, ENTRY)
    monkeypatch.setattr(importing, "MAX_ENTRIES", 2)
    with pytest.raises(TraceError, match="3 entries, more than the 2 an import reads"):
        recording_from_files([path])
    monkeypatch.setattr(plaindata, "MAX_IMPORT_BYTES", 100)
    with pytest.raises(TraceError, match=f"{path}: .* bytes, larger than"):
        recording_from_files([path])


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_only_a_regular_file_is_read(tmp_path: Path, kind: str) -> None:
    """A FIFO would block the import forever, /dev/zero fill its memory: both are refused
    before a byte is read."""
    path = tmp_path / "fr_0"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    res = _import(tmp_path, path, timeout=HANG_S)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"collective-record: error: {path}: "), res.stderr
    assert ("is a directory" if kind == "directory" else "not a regular file") in res.stderr


def _pickle(entries: Any, **top: Any) -> bytes:
    return pickle.dumps({"version": "2.10", "pg_config": {}, "entries": entries, **top},
                        protocol=2)


def _shared(levels: int) -> list[Any]:
    """A list whose two items are one list, ``levels`` deep: a few hundred bytes pickled,
    2**levels values once expanded."""
    part: list[Any] = [ENTRY]
    for _ in range(levels):
        part = [part, part]
    return part


def _tuple_bomb() -> bytes:
    """A dump whose pg_config has a key made of 60 levels of shared pairs: written opcode by
    opcode, since building it here would hash it (2**61 leaves) as the unpickler would."""
    def text(s: str) -> bytes:
        return b"X" + len(s).to_bytes(4, "little") + s.encode()
    pairs = b"K\x00K\x00\x86q\x00" + b"".join(
        b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1]) for i in range(60))
    data = (b"\x80\x02}(" + text("version") + text("2.10") + text("entries") + b"]"
            + text("pg_config") + b"}" + pairs + b"K\x01su.")
    pickletools.dis(data, out=io.StringIO())  # well formed, read without running it
    return data


def _self_list() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(("data", "message"), [
    (_pickle(_shared(40)), r"at entries\[0\]\[0\].*: more than 67108864 values \(a part "
                           r"shared in the file counts each time it is used\)"),
    (_pickle([ENTRY], frames=_self_list()), r"at frames\[0\]: the document contains itself"),
    (_tuple_bomb(),
     r"refused without running it \(a dict key that is not a string at byte \d+\)"),
    (_pickle([ENTRY], pg_config={1 << 61: 1}), "a dict key that is not a string"),
    (_pickle([{**ENTRY, "record_id": 10 ** 5000}]),
     r"at entries\[0\]\.record_id: an integer of more than 4000 digits"),
    (pickle.dumps({"version": "2.10", "entries": {1, 2}}, protocol=4),
     r"refuses the opcode EMPTY_SET at byte \d+"),
    (b"\x80\x02]r\xf0\xff\xff\xff.", r"a memo entry 4294967280 at byte 3 that does not "
                                       "follow what was read"),
], ids=["shared-list", "contains-itself", "tuple-key", "int-key", "huge-int", "set",
        "memo-index"])
def test_a_pickle_costs_at_most_its_size(tmp_path: Path, data: bytes, message: str) -> None:
    """Sharing, cycles, hashing, integers and memo indices: each under 3 KB, and each ran
    without bound, grew memory or gave a traceback before it was refused."""
    assert len(data) < 3000
    path = tmp_path / "fr_pkl_0"
    path.write_bytes(data)
    res = _import(tmp_path, path, timeout=HANG_S)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"collective-record: error: {path}: "), res.stderr
    assert re.search(message, res.stderr), res.stderr


def test_a_torch_pickle_that_shares_its_frames_is_read(tmp_path: Path) -> None:
    """torch's own dumps share stack frames between entries: sharing is counted, not refused,
    and every entry still gets its call site."""
    frames = [{"name": "main", "filename": "/w/train.py", "line": 7}]
    path = tmp_path / "fr_pkl_0"
    path.write_bytes(_pickle([{**ENTRY, "record_id": i, "frames": frames} for i in range(3)]))
    rec = recording_from_files([path])
    assert [c.site for c in rec.calls] == ["/w/train.py:7"] * 3
    # The loader is the restricted one: it refuses any global, even a harmless one.
    with pytest.raises(pickle.UnpicklingError, match=r"refuses the global __builtin__\.set"):
        plaindata.PlainUnpickler(io.BytesIO(pickle.dumps({1}, protocol=2))).load()


def test_a_rank_in_a_name_is_bounded(tmp_path: Path) -> None:
    """The digits ending a name are a rank too: bounded before a group of that size is built."""
    path = _dump(tmp_path, ENTRY, name="fr_99999999999999")
    res = _import(tmp_path, path, timeout=HANG_S)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert "the digits ending its name, 99999999999999, are not a rank below 1048576" in \
        res.stderr


def test_calls_share_their_group_and_their_total_size_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _dump(tmp_path, ENTRY, ENTRY, ENTRY, rank=3)
    rec = recording_from_files([path])
    assert len(rec.calls) == 3 and len({id(c.group) for c in rec.calls}) == 1
    monkeypatch.setattr(fromtrace, "MAX_CALL_RANKS", 11)  # 3 calls x 4 ranks = 12
    with pytest.raises(TraceError, match=f"{path}: the calls imported so far, each counted by "
                       "the ranks of its group, exceed the 11 an import handles"):
        recording_from_files([path])


def test_a_file_whose_rank_cannot_be_told_is_refused(tmp_path: Path) -> None:
    path = _dump(tmp_path, ENTRY, name="dump")
    with pytest.raises(TraceError, match="cannot tell which rank wrote it"):
        recording_from_files([path])
    assert recording_from_files([_dump(tmp_path, ENTRY, name="dump", rank=3)]).world_size == 4


def _nccl(rank: int, *entries: dict[str, Any], first: int = 0) -> dict[str, Any]:
    """An NCCL-style dump at world size 4 (pg_config lists the ranks, p2p names say peers):
    the format of a real Gloo dump of torch 2.13 with NCCL's names and group listing."""
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
           "1": {"name": "1", "desc": "pairs", "ranks": "[0, 2]" if rank % 2 == 0
                 else "[1, 3]"}}
    return {"version": "2.10", "pg_config": cfg, "rank": rank,
            "entries": [{**ENTRY, **e, "record_id": first + i} for i, e in enumerate(entries)]}


def test_nccl_style_dump_groups_peers_coalescing_and_a_wrapped_ring(tmp_path: Path) -> None:
    paths = []
    for rank in range(4):
        pair = rank + 2 if rank < 2 else rank - 2
        p2p = ({"profiling_name": "nccl:send 0->1"} if rank < 2 else
               {"profiling_name": "nccl:recv 1<-0", "input_sizes": [[4]]})
        doc = _nccl(rank,
                    {"profiling_name": "nccl:all_reduce", "process_group": ["1", "pairs"]},
                    {"profiling_name": "nccl:_allgather_base", "output_sizes": [[16]]},
                    {**p2p, "process_group": ["1", "pairs"]},
                    {"profiling_name": "nccl:coalesced", "input_sizes": [],
                     "input_dtypes": []},
                    first=5 if rank == 3 else 0)
        assert pair in json.loads(doc["pg_config"]["1"]["ranks"])
        path = tmp_path / f"nccl_trace_rank_{rank}"
        path.write_text(json.dumps(doc))
        paths.append(path)
    res = _import(tmp_path, *paths)
    assert res.returncode == 1, res.stderr  # rank 3's ring buffer had wrapped: partial
    text = (tmp_path / "out.yaml").read_text()
    assert "# PARTIAL recording" in text
    assert "rank 3: the Flight Recorder ring buffer had wrapped; records 0-4 are gone" in text
    assert "which calls were coalesced" in text
    cases = _cases(tmp_path / "out.yaml")
    assert cases["all_reduce_float32_g0_2"]["args"] == {"group": [0, 2]}
    assert cases["all_reduce_float32_g1_3"]["args"] == {"group": [1, 3]}
    assert cases["all_reduce_float32_g0_2"]["device"] == "cuda"
    assert cases["all_gather_into_tensor_float32"]["world_size"] == 4
    # group-local "send 0->1" of group [1, 3] is global rank 1 -> rank 3
    assert {"p2p_float32_0to2", "p2p_float32_1to3"} <= set(cases)
    assert "world size: taken" not in text  # pg_config said it


def test_execution_trace_with_groups_smaller_than_the_world_says_why(tmp_path: Path,
                                                                      dumps: Path) -> None:
    doc = json.loads((dumps / "et_0.json").read_text())
    for node in doc["nodes"]:
        if node["name"] == "## process_group:init ##":
            groups = json.loads(node["inputs"]["values"][0])
            groups.append({**groups[0], "pg_name": "1", "pg_desc": "half", "group_size": 1})
            node["inputs"]["values"][0] = json.dumps(groups)
    path = tmp_path / "et_0.json"
    path.write_text(json.dumps(doc))
    rec = recording_from_files([path])
    assert rec.calls == []
    assert any("lists groups smaller than the world (half)" in n for n in rec.notes)
    assert rec.partial == ["ranks [1] have no file: only the calls of the ranks given are in "
                           "the cases"]


NCCL_DUMPS = REPO / "tests" / "data" / "flight_recorder"


def test_a_real_nccl_dump_from_an_h100_imports(tmp_path: Path) -> None:
    """tests/data/flight_recorder/: written by ci/gpu/nccl_fr_dump.py on an H100 (torch
    2.11.0+cu130, NCCL 2.28.9, world size 1) through torch's _dump_nccl_trace_json and
    _dump_nccl_trace: NCCL's own naming ("nccl:all_reduce"), its format version and fields."""
    res = _import(tmp_path, NCCL_DUMPS / "nccl_trace_json_0")
    assert res.returncode == 0, res.stderr
    assert "10 call(s)" in res.stderr + res.stdout
    cases = _cases(tmp_path / "out.yaml")
    assert {(c["op"], c["dtype"]) for c in cases.values()} == {
        ("all_reduce", "float32"), ("broadcast", "float32"),
        ("all_gather_into_tensor", "float32"), ("reduce_scatter_tensor", "float32"),
        ("all_reduce", "float16")}
    assert all(c["device"] == "cuda" and c["shape"] == [1024] for c in cases.values())
    text = (tmp_path / "out.yaml").read_text()
    assert "the trace lacked: the reduce op of each reduction" in text
    # The pickle form of the same run gives the same calls, with the script's call sites.
    from_json = recording_from_files([NCCL_DUMPS / "nccl_trace_json_0"])
    from_pickle = recording_from_files([NCCL_DUMPS / "nccl_trace_pickle_0"])
    assert sorted((c.op, c.shape, c.dtype) for c in from_json.calls) == sorted(
        (c.op, c.shape, c.dtype) for c in from_pickle.calls)
    assert {c.site.rsplit("/", 1)[-1] for c in from_pickle.calls} >= {"nccl_fr_dump.py:32"}
