"""collective-record's two kernels (issue 28): the C++ one and the Python one write the same
trace, what the writer thread reads later is what each call had, one build serves every
checkout of the same sources, and without a compiler the Python kernel records and says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.record import native
from harness.record.trace import read_trace

from .helpers import HANG_S, REPO
from .record_helpers import PY, record

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


HOOKS = ("native", "python")


def _record_with(out: Path, program: str, hook: str) -> Path:
    """``program`` recorded with ``hook`` into ``out`` (made here); returns ``out``."""
    out.mkdir()
    res = record(out, PY, program, extra=("--hook", hook))
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def late_recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """LATE recorded once with each kernel: the writer thread's test reads both recordings,
    and the kernels' comparison compares them."""
    where = tmp_path_factory.mktemp("late")
    (where / "late.py").write_text(LATE)
    return {hook: _record_with(where / hook, str(where / "late.py"), hook) for hook in HOOKS}


@pytest.mark.parametrize("hook", HOOKS)
def test_what_the_writer_thread_reads_later_is_what_each_call_had(
        late_recorded: dict[str, Path], hook: str) -> None:
    """The hook keeps the ReduceOp and the returned Work as they are and the flusher thread
    reads them: each call still gets its own reduce op, and a wait() issued right after the
    call (before any batch) is matched to its call, not lost or given to another."""
    out = late_recorded[hook]
    traces = [read_trace(p) for p in sorted((out / "traces").glob("trace-*.jsonl"))]
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
def test_the_cpp_and_python_kernels_write_the_same_trace(
        tmp_path: Path, program: str, request: pytest.FixtureRequest) -> None:
    """--hook native (the C++ kernel for c10d ops) and --hook python record the same calls,
    arguments, sites, waits and case file: only the header's hook and pid differ."""
    if program == "late":  # recorded once for this test and the writer thread's
        recorded: dict[str, Path] = request.getfixturevalue("late_recorded")
    else:
        recorded = {hook: _record_with(tmp_path / hook, program, hook) for hook in HOOKS}
    got = {}
    for hook, out in recorded.items():
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



def test_another_torch_install_builds_into_a_folder_of_its_own() -> None:
    """Two environments (venvs) on one machine wrote build files naming different torch headers
    and libraries into one build folder and rebuilt it in turn: minutes each on a busy machine,
    with every recorder on the machine waiting on the build's lock. The torch install is part
    of the kernel's name, so each builds and keeps its own."""
    import torch
    here = str(Path(torch.__file__).resolve().parent)
    assert native.torch_dir() == here
    assert native.kernel_name(here) == native.NAME
    assert native.kernel_name("/another/venv/lib/python3.11/site-packages/torch") != native.NAME


def test_a_build_killed_mid_way_does_not_stop_every_later_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's builder waits without end while its lock file exists; a build killed mid-way
    leaves it. Every load of the harness takes its own lock first (released when its holder
    dies), under which a torch lock file is known to be stale and is removed."""
    from torch.utils import cpp_extension
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_MODULE", [])
    folder = native.build_folder()
    assert folder is not None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lock").write_bytes(b"")  # what a killed build leaves

    def builder(name: str, *args: object, **kwargs: object) -> str:
        assert not (folder / "lock").exists(), "torch's builder would wait for it forever"
        return "module"

    monkeypatch.setattr(cpp_extension, "load", builder)
    assert native.load() == "module"

