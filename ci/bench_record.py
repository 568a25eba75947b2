"""The cost of collective-record (issue 28 point 6), measured.

    python ci/bench_record.py [--pairs 6] [--steps 30] [--calls 100000] [--json PATH]

* overhead: a DDP training step (the model of ``examples/ddp_buckets.py``, Gloo, 2 ranks,
  ``bucket_cap_mb=1``) with and without the recorder. Each run starts 2 fresh ranks, warms
  up, then times ``--steps`` steps (rank 0's median step time). Runs come in pairs whose
  order alternates (plain first, then recorded first, ...) so that drift in the machine's
  load hits both sides; the figure is the median of the per-pair ratios. Budget: 5 %.
* collapse: ``--calls`` recorded calls (DDP-like all_reduces over a handful of bucket
  shapes, broadcasts, p2p pairs; 2 ranks) written as per-rank trace files, then read,
  translated and written as a case file by the same functions the command uses. Budget 10 s.

Prints one table with the load average; exits 1 when a budget is missed (a benchmark, not a
test: CI does not run it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.record.cases import Recording, render  # noqa: E402
from harness.record.cli import ENV, SITE, translate_traces  # noqa: E402
from harness.record.trace import FORMAT, VERSION, read_folder  # noqa: E402

WORKER = r'''
import os, socket, statistics, sys, time, torch, torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

def run(rank, port, steps, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    ddp = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(rank))
    times = []
    for i in range(steps + 5):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        open(out, "w").write(str(statistics.median(times)))
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port, int(sys.argv[1]), sys.argv[2]), nprocs=2)
'''


def _step_time(folder: Path, steps: int, record: bool) -> float:
    script = folder / "worker.py"
    script.write_text(WORKER)
    out = folder / "median.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT)])}
    env.pop(ENV, None)
    if record:
        traces = folder / "traces"
        traces.mkdir(exist_ok=True)
        env[ENV] = str(traces)
    subprocess.run([sys.executable, str(script), str(steps), str(out)], env=env, check=True,
                   timeout=600, capture_output=True)
    return float(out.read_text())


def overhead(pairs: int, steps: int) -> dict[str, float]:
    """Median over alternating pairs of recorded/plain step time, minus one."""
    ratios, plain, recorded = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {rec: _step_time(Path(tmp), steps, rec) for rec in order}
            plain.append(got[False])
            recorded.append(got[True])
            ratios.append(got[True] / got[False])
    return {"plain_step_ms": statistics.median(plain) * 1e3,
            "recorded_step_ms": statistics.median(recorded) * 1e3,
            "overhead_pct": (statistics.median(ratios) - 1) * 100,
            "ratio_min": min(ratios), "ratio_max": max(ratios)}


def _write_traces(folder: Path, calls: int) -> None:
    shapes = [[65792], [394752], [262144], [131072], [1024]]
    for rank in (0, 1):
        lines = [json.dumps({"header": {"format": FORMAT, "version": VERSION, "torch": "x",
                                        "rank": rank, "world_size": 2}})]
        for seq in range(calls // 2):
            k = seq % 10
            if k < 8:
                call = {"op": "c10d::allreduce_", "group": [0, 1], "reduce_op": "sum",
                        "args": {"tensors": [{"shape": shapes[seq % 5], "stride": [1],
                                              "contiguous": True, "dtype": "float32",
                                              "device": "cpu", "layout": "strided"}],
                                 "async_op": True},
                        "api": None, "site": f"/work/train.py:{40 + seq % 3}"}
            elif k == 8:
                call = {"op": "c10d::broadcast_", "group": [0, 1],
                        "args": {"tensors": [{"shape": [13], "dtype": "int32",
                                              "device": "cpu"}], "root_rank": 0,
                                 "async_op": False}, "api": "broadcast",
                        "site": "/work/train.py:30"}
            else:
                op = "c10d::send" if rank == 0 else "c10d::recv_"
                peer = {"dst": 1} if rank == 0 else {"src": 0}
                call = {"op": op, "group": [0, 1], "args": {
                    "tensors": [{"shape": [16, 256], "dtype": "float32", "device": "cpu"}],
                    "tag": 0, **peer}, "api": "isend" if rank == 0 else "irecv",
                    "site": "/work/pipe.py:12"}
            lines.append(json.dumps({"call": {**call, "seq": seq}}))
            if k == 8:
                lines.append(json.dumps({"wait": {"call": seq, "what": "work", "after": seq + 1,
                                                  "site": "/work/train.py:31"}}))
        lines.append(json.dumps({"end": {"calls": calls // 2}}))
        (folder / f"trace-{rank}.jsonl").write_text("\n".join(lines) + "\n")


def collapse(calls: int) -> dict[str, float]:
    """Seconds from per-rank trace files to the case file's text."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write_traces(folder, calls)
        t0 = time.perf_counter()
        traces = read_folder(folder)
        t1 = time.perf_counter()
        got, _ = translate_traces(traces, skip_unknown=False)
        t2 = time.perf_counter()
        text = render(Recording(world_size=2, calls=got, source="bench"))
        t3 = time.perf_counter()
    return {"calls": float(len(got)), "read_s": t1 - t0, "translate_s": t2 - t1,
            "render_s": t3 - t2, "total_s": t3 - t0, "case_file_bytes": float(len(text))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--skip", default="", help="comma list of: overhead, collapse")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    load = os.getloadavg()
    out: dict[str, object] = {"loadavg_before": list(load), "cpus": os.cpu_count()}
    ok = True
    if "collapse" not in skip:
        c = collapse(a.calls)
        out["collapse"] = c
        ok &= c["total_s"] < 10
        print(f"collapse: {int(c['calls'])} calls -> case file in {c['total_s']:.2f} s "
              f"(read {c['read_s']:.2f}, translate {c['translate_s']:.2f}, render "
              f"{c['render_s']:.2f}; {int(c['case_file_bytes'])} bytes)  budget < 10 s")
    if "overhead" not in skip:
        o = overhead(a.pairs, a.steps)
        out["overhead"] = o
        ok &= o["overhead_pct"] <= 5
        print(f"overhead: DDP step at 1 MiB buckets, 2 ranks Gloo: plain "
              f"{o['plain_step_ms']:.2f} ms, recorded {o['recorded_step_ms']:.2f} ms, "
              f"median pair ratio {o['overhead_pct']:+.1f} % (pairs {a.pairs}, ratio range "
              f"{o['ratio_min']:.3f}-{o['ratio_max']:.3f})  budget <= 5 %")
    out["loadavg_after"] = list(os.getloadavg())
    print(f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after "
          f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
