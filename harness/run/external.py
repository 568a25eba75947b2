"""External-ranks mode: run the case files under a launcher the cluster already uses.

    torchrun --nnodes 2 --nproc-per-node 8 -m harness.run.external cases/ --backend nccl

Every rank (started by torchrun, srun, mpirun...) joins the default process group from the
launcher's environment, loads and expands the same case files in the same order, and runs the
instances whose world size equals the launched one in lockstep, with the same per-rank code as
the harness's own pools (:func:`harness.program.interpreter.run_instance`). Rank 0 gathers
every rank's result, judges it with the same verdict code, and writes the one report.

Without a pool around the ranks there is nobody to kill and restart them, so cases that must
hang, crash or poison the group (``hangs``, ``crashes``, ``isolate``) are skipped here, and an
unexpected hang ends the run: a watchdog on each rank dumps its Python stack and exits at the
instance's deadline, and the launcher tears the job down. Rank 0 writes the report of what
finished first, plus the hang, so a hang never loses the earlier results.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..casefile import expand, load, overrides, validate
from ..errors import CaseFileError, CaseFileErrors
from ..model import Instance, InstanceResult, PoolRun, RankResult
from ..report import markdown
from ..report.records import build_report, instance_record, skipped_record, write_atomic
from ..report.records import write_json as write_report
from ..verdict import judge
from .capabilities import probe


def _env_int(*names: str, default: int | None = None) -> int:
    """First integer among the launcher variables (torchrun, SLURM, Open MPI, PMI)."""
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    if default is None:
        raise SystemExit(f"external mode needs one of {', '.join(names)} in the environment: "
                         "start it with torchrun, srun or mpirun")
    return default


def case_files(paths: list[str]) -> list[Path]:
    """Case files under ``paths`` in a stable order (the same on every rank)."""
    out: list[Path] = []
    for p in map(Path, paths):
        files = sorted(p.rglob("*.y*ml")) if p.is_dir() else [p]
        out += [f for f in files if f.suffix in (".yaml", ".yml")
                and "\ncases:" in "\n" + f.read_text(encoding="utf-8", errors="replace")]
    return out


def load_instances(paths: list[str], backend: str) -> list[Instance]:
    """Every instance of every case file, or SystemExit with the file's errors."""
    instances: list[Instance] = []
    for f in case_files(paths):
        try:
            doc = load.load_file(str(f), str(f))
            instances += expand.expand_all(validate.load_cases(doc), backend)
        except (CaseFileError, CaseFileErrors) as exc:
            raise SystemExit(str(exc)) from None
    return instances


EXIT_GRACE_S = 3.0


class _Watchdog:
    """Ends this rank if one instance outlives its deadline (no pool to recover it)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.deadline = float("inf")
        self.current = ""
        threading.Thread(target=self._watch, name="external-watchdog", daemon=True).start()

    def arm(self, inst: Instance, seconds: float) -> None:
        self.current = inst.key
        self.deadline = time.monotonic() + seconds

    def disarm(self) -> None:
        self.deadline = float("inf")

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            if time.monotonic() > self.deadline:
                print(f"collective-harness: rank {self.rank}: HANG in {self.current}: "
                      "deadline passed; this rank's stack follows", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                # The first rank to exit makes the launcher kill the rest: give the other
                # ranks stuck in this instance time to reach their deadline and print too.
                time.sleep(EXIT_GRACE_S)
                os._exit(124)


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m harness.run.external`` on every rank."""
    ap = argparse.ArgumentParser(prog="python -m harness.run.external", description=__doc__)
    ap.add_argument("paths", nargs="+", help="case files or folders")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--backend-module", action="append", default=[])
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("-k", dest="keyword", default="", help="only instance keys containing this")
    ap.add_argument("--report-json", default="reports/conformance.json")
    ap.add_argument("--report-md", default="reports/conformance.md")
    args = ap.parse_args(argv)

    import importlib

    import torch
    import torch.distributed as dist

    from ..ordering.probes import run_probes
    from ..program.interpreter import RankEnv, run_instance

    rank = _env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    world = _env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    local = _env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
    for mod in args.backend_module:
        importlib.import_module(mod)
    instances = [i for i in load_instances(args.paths, args.backend)
                 if args.keyword in i.key]
    device = "cuda" if any(i.device == "cuda" for i in instances) else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group(args.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=max(600.0, args.deadline * 4)))
    caps = probe(tuple(args.backend_module))
    renv = RankEnv(rank=rank, world_size=world, device=device)
    watchdog = _Watchdog(rank)
    records: list[dict[str, Any]] = []

    def flush_report() -> None:
        meta = {**caps.metadata(), "options": {"mode": "external", "backend": args.backend,
                                               "launched_world_size": world,
                                               "deadline_s": args.deadline}}
        report = build_report(records, meta)
        write_report(args.report_json, report)
        write_atomic(args.report_md, markdown.render(report))

    for inst in instances:
        inst = overrides.resolve(inst, caps.torch_version)
        nodeid = inst.key
        reason = inst.expectation.skip or caps.skip_reason(inst)
        if not reason and inst.world_size != world:
            reason = f"needs world size {inst.world_size}; launched with {world}"
        if not reason and (inst.isolate or inst.expectation.kind in ("hangs", "crashes")):
            reason = "needs an isolated process group: run it with the pytest plugin"
        if reason:
            if rank == 0:
                records.append(skipped_record(inst, reason, nodeid))
            continue
        deadline = inst.deadline or args.deadline
        if rank == 0:  # if this instance hangs, the report of what came before survives
            flush_report()
        watchdog.arm(inst, deadline)
        t0 = time.monotonic()
        result = run_instance(inst, renv, run_probes)
        gathered: list[RankResult | None] = [None] * world if rank == 0 else []
        dist.gather_object(result, gathered if rank == 0 else None, dst=0)
        watchdog.disarm()
        if rank == 0:
            run = PoolRun(kind="done", results={r.rank: r for r in gathered if r is not None},
                          elapsed=time.monotonic() - t0)
            verdict: InstanceResult = judge(inst, run, deadline)
            verdict.duration = run.elapsed
            records.append(instance_record(inst, verdict, nodeid))
            print(f"{verdict.outcome.upper():8} {inst.key}", flush=True)
    if rank == 0:
        flush_report()
        bad = [r for r in records if r["outcome"] in ("failed", "error", "hang", "crash")]
        print(f"collective-harness (external, {world} ranks): {len(records)} instances, "
              f"{len(bad)} not conforming; report: {args.report_json}", flush=True)
    dist.destroy_process_group()
    return 1 if rank == 0 and any(r["outcome"] in ("failed", "error") for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
