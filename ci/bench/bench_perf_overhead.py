"""Benchmark: what the perf mode's loop adds per call, measured where it is not drowned.

    .venv/bin/python ci/bench/bench_perf_overhead.py [--calls 2000] [--rounds 30]

One process, a Gloo group of world size 1 (no peer, so no network wait), an 8-byte message:
the call itself is as cheap as it gets, so the difference between an iteration of the perf
mode (:func:`harness.program.perf.harness_iteration`: the step interpreter's ``call_op``)
and the bare ``torch.distributed`` call (:func:`harness.program.perf.bare_iteration`) is the
harness's own cost per call, in microseconds. Rounds alternate the two loops; the median of
the per-round differences is printed. Divide by a message's time to get the share it can
cost at that size (``collective-bench --busbw`` measures the ratio itself, at world sizes 2
and 4, but on a loaded machine its noise is far larger than this difference).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch.distributed as dist  # noqa: E402

from harness.casefile import collect  # noqa: E402
from harness.program import perf  # noqa: E402
from harness.program.interpreter import RankEnv, build_buffers  # noqa: E402

CASES = ("all_reduce_fp32", "broadcast_fp32", "reduce_fp32")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0,
                                world_size=1)
        path = str(REPO / "cases" / "perf.yaml")
        insts = collect.from_file(path, "gloo", "cases/perf.yaml")
        renv = RankEnv(rank=0, world_size=1, device="cpu")
        for name in CASES:
            inst = next(i for i in insts if i.case == name and dict(i.params)["bytes"] == 8)
            env = dict(inst.params)
            bufs = build_buffers(inst, renv, env)
            mine = perf.harness_iteration(inst, renv, env, bufs)
            bare = perf.bare_iteration(inst, renv, env, bufs)
            assert callable(bare), bare
            added: list[float] = []
            base: list[float] = []
            for r in range(args.rounds):
                times = {}
                for label, fn in (("h", mine), ("b", bare))[:: 1 if r % 2 == 0 else -1]:
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    times[label] = (time.perf_counter() - t0) / args.calls
                added.append((times["h"] - times["b"]) * 1e6)
                base.append(times["b"] * 1e6)
            print(f"{name}: harness adds {statistics.median(added):.1f} us per call "
                  f"(bare call {statistics.median(base):.1f} us)")
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
