"""collective-record --world-size (issue 28 point 3) and a crashing recorded script (point 7):
cases that generalize run at the sizes asked (and pass there on Gloo), the others say why;
a script that raises leaves a partial file that says where each rank stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from harness.record.cases import Recording, render
from harness.record.optable import Call

from .helpers import HANG_S, REPO, case_instances, load_report, run_pytest

PY = sys.executable


def _call(op: str, shape: tuple[int, ...], rank: int, **kw: object) -> Call:
    base: dict[str, object] = {"group": (0, 1), "dtype": "float32", "device": "cpu",
                               "layout": "contiguous", "site": "/w/train.py:7",
                               "api": "x", "seq": 0}
    return Call(op=op, shape=shape, rank=rank, **{**base, **kw})  # type: ignore[arg-type]


def _recording() -> Recording:
    calls = []
    for r in (0, 1):
        calls += [_call("all_reduce", (5,), r, reduce_op="sum"),
                  _call("broadcast", (3,), r, root=1),
                  _call("reduce_scatter_tensor", (6,), r, reduce_op="sum", form="concat"),
                  _call("reduce_scatter", (2, 3), r, reduce_op="sum"),
                  _call("all_reduce", (4,), r, group=(0,), reduce_op="sum"),
                  _call("send" if r == 0 else "recv", (4,), r, peer=1 - r)]
    return Recording(world_size=2, calls=calls, source="test", world_sizes=[4])


def test_cases_that_generalize_take_the_sizes_asked_the_others_say_why() -> None:
    text = render(_recording())
    assert "# world sizes asked: 2, 4; 4 of 6 case(s) generalize" in text
    cases = {c["name"]: c for c in yaml.safe_load(text)["cases"]}
    assert cases["all_reduce_float32_sum"]["world_size"] == [2, 4]
    assert cases["all_reduce_float32_sum"]["shape"] == [5]
    assert cases["reduce_scatter_tensor_float32_sum"]["shape"] == ["world_size * 3"]
    assert cases["reduce_scatter_float32_sum"]["shape"] == ["world_size", 3]
    sub = cases["all_reduce_float32_sum_g0"]
    assert sub["world_size"] == 2 and "recorded on the subgroup [0]" in sub["description"]
    p2p = cases["p2p_float32_0to1"]
    assert p2p["world_size"] == 2 and "point-to-point program" in p2p["description"]
    assert {i.world_size for i in case_instances(text)} == {2, 4}


def test_a_root_missing_at_a_smaller_size_keeps_the_case_at_the_recorded_one() -> None:
    rec = Recording(world_size=4, calls=[_call("broadcast", (3,), r, root=3, group=(0, 1, 2, 3))
                                         for r in range(4)], source="t", world_sizes=[2])
    case = yaml.safe_load(render(rec))["cases"][0]
    assert case["world_size"] == 4
    assert "its src 3 does not exist at world size 2" in case["description"]


def test_the_widened_file_passes_on_gloo_at_every_size(tmp_path: Path) -> None:
    rec = _recording()
    rec.calls = [c for c in rec.calls if c.op in {"reduce_scatter_tensor", "reduce_scatter",
                                                  "broadcast"}]
    path = tmp_path / "ws.yaml"
    path.write_text(render(rec))
    res = run_pytest(REPO, str(path), "-q", "--report-json", str(tmp_path / "r.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    report = load_report(tmp_path / "r.json")
    assert report["summary"]["verdict"] == "PASS"
    assert {r["axes"]["world_size"] for r in report["records"]} == {2, 4}


CRASH = r'''
import os, socket, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.ones(2), 0)
    if rank == 1:
        raise RuntimeError("the script's own bug")
if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port,), nprocs=2)
'''


def test_a_script_that_raises_leaves_a_partial_file_saying_where(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    res = subprocess.run([PY, "-m", "harness.record", "-o", str(tmp_path / "out.yaml"), "--",
                          PY, str(script)], cwd=REPO, capture_output=True, text=True,
                         timeout=HANG_S, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 1, res.stderr
    text = (tmp_path / "out.yaml").read_text()
    assert "# PARTIAL recording" in text
    assert "the launch command exited with status 1" in text
    # rank 1 raised (its trace ended normally): where it was is still said
    assert "rank 1 made 2 call(s) before the run failed; last: c10d::broadcast_ at " \
           f"{script}:7" in text
    assert {c["op"] for c in yaml.safe_load(text)["cases"]} == {"all_reduce", "broadcast"}
