"""A small two-rank Gloo job for tests/test_guard.py: all_reduce, broadcast, all_gather.

``--out FILE`` writes rank 0's final tensor as raw bytes (compared bit for bit with and without
the guard); ``--break-channel`` makes the guard's side channel fail in every rank after init.
``--probe python`` instead prints, per rank, how many Python calls into harness/guard five
all_reduces made on the calling thread after the first (unsampled, or sampled and digested by
the C++ kernel); ``--probe describe`` prints how often a clean run's checked calls had their
case JSON or call site made (only a finding needs them); ``--probe step`` reports a made-up
finding for the third all_reduce, issued after two optimizer steps;
``--probe overlap`` has rank 0 return from an async all_reduce before rank 1 issues its own
(a kernel that waited for it would block until rank 1's store wait times out); ``--probe
raise`` makes every check report rank 0 and prints what rank 0's next all_reduce raised.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class _Broken:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("side channel unreachable (test)")


def probe_python(rank: int) -> None:
    x = torch.ones(1000)
    dist.all_reduce(x)  # seq 0: sampled at any rate
    seen: list[str] = []
    guard_dir = os.path.join("harness", "guard")

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and guard_dir in frame.f_code.co_filename:
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    for _ in range(5):
        dist.all_reduce(x)
    sys.setprofile(None)
    print(f"rank {rank}: python calls into the guard: {len(seen)} {sorted(set(seen))}",
          flush=True)


def probe_overlap(rank: int) -> None:
    store = dist.distributed_c10d._get_default_store()
    x = torch.full((100_000,), float(rank + 1))
    if rank == 0:
        work = dist.all_reduce(x, async_op=True)
        store.set("probe/issued", "1")  # only reached if the call returned before rank 1's
        work.wait()
    else:
        store.wait(["probe/issued"], timedelta(seconds=20))
        dist.all_reduce(x)
    print(f"rank {rank}: overlap result {x[0].item()} {x[-1].item()}", flush=True)


def probe_raise(rank: int) -> None:
    from harness.guard import check, checker
    from harness.guard import rank as guard_rank
    g = guard_rank.guard()
    assert g is not None
    honest = check.decide

    def decide(spec: dict[str, Any], digs: list[Any]) -> check.Verdict:
        verdict = honest(spec, digs)
        verdict.mismatches.append(check.Mismatch(spec["group"][0], 0, "made up by the test"))
        return verdict

    check.decide = decide
    check.honest = lambda *_: False  # every call reaches decide
    x = torch.ones(10)
    dist.all_reduce(x)
    # Until the checker decided the call: rank 0 is told to raise, rank 1 that it is right (it
    # waited a fixed 60 s for a raise that is not its own). The test's limit bounds the wait.
    while not g.off and not (g.raise_next if rank == 0 else g.checked):
        time.sleep(0.01)
    try:
        dist.all_reduce(x)
        print(f"rank {rank}: no raise", flush=True)
    except checker.GuardMismatch as exc:
        print(f"rank {rank}: raised GuardMismatch: {exc}", flush=True)
    except RuntimeError as exc:
        print(f"rank {rank}: raised {type(exc).__name__}: {exc}", flush=True)


def probe_describe(rank: int) -> None:
    from harness.guard import calls
    made = {"call_json": 0, "site_json": 0}
    for name in made:
        orig = getattr(calls, name)

        def counted(*args: Any, _orig: Any = orig, _name: str = name) -> Any:
            made[_name] += 1
            return _orig(*args)

        setattr(calls, name, counted)
    x = torch.ones(1000)
    for _ in range(10):
        dist.all_reduce(x)
    dist.destroy_process_group()  # the guard decides every queued call first
    from harness.guard import rank as guard_rank
    g = guard_rank.guard()
    assert g is not None
    print(f"rank {rank}: {g.checked} checked, made {made}", flush=True)


def probe_step(rank: int) -> None:
    from harness.guard import check
    honest = check.decide
    decided = [0]

    def decide(spec: dict[str, Any], digs: list[Any]) -> check.Verdict:
        verdict = honest(spec, digs)
        decided[0] += 1
        if decided[0] == 3:  # calls are decided in issue order here: the third all_reduce
            verdict.mismatches.append(check.Mismatch(spec["group"][0], 0, "made up"))
        return verdict

    check.decide = decide
    check.honest = lambda *_: False  # every call reaches decide
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(4):
        dist.all_reduce(torch.full((1000,), float(i + 1)))
        opt.step()


def run(rank: int, port: int, out: str, broken: bool, probe: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if probe:
        {"python": probe_python, "overlap": probe_overlap, "raise": probe_raise,
         "describe": probe_describe, "step": probe_step}[probe](rank)
        if dist.is_initialized():
            dist.destroy_process_group()
        return
    if broken:
        from harness.guard import rank as guard_rank
        g = guard_rank.guard()
        assert g is not None
        g.store = _Broken()
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(3000, generator=gen)
    for _ in range(6):
        dist.all_reduce(x)
        x = x / 2
        dist.broadcast(x, src=1)
        parts = [torch.empty_like(x) for _ in range(2)]
        dist.all_gather(parts, x)
        x = x + parts[0] * 1e-3
    if rank == 0 and out:
        with open(out, "wb") as f:
            f.write(x.numpy().tobytes())
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--break-channel", action="store_true")
    p.add_argument("--probe", choices=["python", "overlap", "raise", "describe", "step"],
                   default="")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, a.out, a.break_channel, a.probe), nprocs=2)  # type: ignore[attr-defined,no-untyped-call]


if __name__ == "__main__":
    main()
