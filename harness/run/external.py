"""External-ranks mode: the case library on whatever ranks a cluster launcher gives.

    torchrun --nnodes 2 --nproc-per-node 8 --max-restarts 20 ... -m harness.run.external cases/
    srun --ntasks 16 python -m harness.run.external cases/ --backend nccl   (no restarts)

Every rank (started by torchrun / torch.distributed.elastic, or SLURM's srun) joins the
default process group from the launcher's environment and loads and expands the same case
files in the same order (``world_size: launched`` becomes the launched world size). Whether
each instance can run is decided from every rank's capabilities, gathered, so all ranks agree.
Instances are packed onto disjoint blocks of ranks (:mod:`harness.run.schedule`): 16 ranks
run four world-size-4 instances at once, each on its own subgroup, with the same per-rank code
as the harness's own pools (:func:`harness.program.interpreter.run_instance`). Rank 0 gathers
every rank's results, judges them with the same verdict code, and writes the one report, with
the global ranks, hosts and devices each instance ran on.

A hang or a crash ends the processes (there is no pool to recover them): each rank's deadline
watchdog dumps its stack and exits, and the launcher restarts the ranks (torchrun
``--max-restarts``). The restarted run resumes after the failed round from the progress rank 0
keeps (:mod:`harness.run.progress`), turns what each rank left behind into the failed
instance's record (blocked with its stack, died, stopped by the launcher), re-runs the
instances that were only collateral, and goes on. Instances that must hang, crash or poison
the group run alone, last, and only while the launcher has restarts left.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import importlib
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..casefile import expand, load, overrides, validate
from ..errors import CaseFileError, CaseFileErrors, float_in, int_in
from ..model import Instance, InstanceResult, PerfPlan, PoolRun, RankState
from ..perf.plan import not_timed
from ..perf.stats import aggregate
from ..report import markdown
from ..report import paths as report_paths
from ..report.jsonfile import unwritable
from ..report.records import build_report, instance_record, json_text, skipped_record, write_all
from ..verdict.outcome import judge
from . import schedule
from .capabilities import Capabilities, probe_here
from .launch import StepTrace, Watchdog, env_int, join
from .progress import State, StateError, recovered_run

EXIT_RESTART = 75  # every rank leaves so that the launcher starts a clean process group
ROUND_GRACE_S = 10.0  # a rank waiting for a round's other instances outlives their deadlines
REPORT_EVERY_S = 15.0  # how often rank 0 rewrites the report of a run in progress


def case_files(paths: list[str]) -> list[Path]:
    """Case files under ``paths`` in a stable order (the same on every rank)."""
    out: list[Path] = []
    for p in map(Path, paths):
        files = sorted(p.rglob("*.y*ml")) if p.is_dir() else [p]
        out += [f for f in files if f.suffix in (".yaml", ".yml")
                and "\ncases:" in "\n" + f.read_text(encoding="utf-8", errors="replace")]
    return out


def load_instances(paths: list[str], backend: str, launched: int) -> list[Instance]:
    """Every instance of every case file, or SystemExit with the file's errors."""
    instances: list[Instance] = []
    for f in case_files(paths):
        try:
            doc = load.load_file(str(f), str(f))
            instances += expand.expand_all(validate.load_cases(doc), backend,
                                           launched=launched)
        except (CaseFileError, CaseFileErrors) as exc:
            raise SystemExit(str(exc)) from None
    return instances


class ReportFiles:
    """Where rank 0 writes the report pair. If a path stops working during the run (the folder
    removed, the disk full), the pair goes to a new private folder instead, named once on
    stderr, and stays there for the rest of the run: the records are never lost."""

    def __init__(self, report_json: str, report_md: str) -> None:
        self.paths = [report_json, report_md]
        self.moved_to = ""

    def write(self, report: dict[str, Any]) -> None:
        """Replace both files together (JSON and Markdown never disagree)."""
        texts = (json_text(report), markdown.render(report))
        if self.moved_to:  # moved once: it stays there (a failure now is a real error)
            write_all(list(zip(self.paths, texts, strict=True)))
            return
        moved = report_paths.write_set(self.paths, texts)
        if moved is not None:
            print(f"python -m harness.run.external: could not write the report to "
                  f"{self.paths[0]} ({moved.why}); it is written to {moved.folder} instead",
                  file=sys.stderr, flush=True)
            self.moved_to, self.paths = moved.folder, moved.paths


def write_started(files: ReportFiles, backend: str) -> None:
    """Replace the report files by an INCOMPLETE report of this run before it loads anything,
    so that no earlier report can be taken for its result if it stops early (a bad case file,
    an unusable state directory, a crash before the first round)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    session = {"complete": False, "collected": 0, "without_result": 0,
               "ended_by": f"started at {started} (pid {os.getpid()}) and not finished: still "
                           "loading or running, or stopped before writing its report"}
    report = build_report([], {"torch": "", "hostname": socket.gethostname(),
                               "options": {"mode": "external", "backend": backend}}, session)
    files.write(report)


def skip_reasons(inst: Instance, caps: Capabilities, local_rank: int, world: int) -> str:
    """Why this rank cannot run ``inst`` ("" if it can); gathered from every rank."""
    if inst.world_size > world:
        return f"needs {inst.world_size} ranks; launched with {world}"
    reason = inst.expectation.skip or caps.skip_reason(inst, local_rank=local_rank)
    return reason


def _where(rank: int, local_rank: int) -> str:
    return f"rank {rank} ({socket.gethostname()}, local rank {local_rank})"


def _placement(slot: schedule.Slot, round_index: int, hosts: list[dict[str, Any]]
               ) -> dict[str, Any]:
    return {"round": round_index,
            "ranks": [{"rank": i, "global_rank": g, **hosts[g]}
                      for i, g in enumerate(slot.members)]}


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m harness.run.external`` on every rank."""
    ap = argparse.ArgumentParser(prog="python -m harness.run.external", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="case files or folders")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--backend-module", action="append", default=[])
    ap.add_argument("--deadline", type=float_in(0, 86400, open_low=True), default=120.0)
    ap.add_argument("-k", dest="keyword", default="", help="only instance keys containing this")
    ap.add_argument("--full", action="store_true",
                    help="also run instances marked 'full' (the long matrix), as pytest --full")
    ap.add_argument("--report-json", default="reports/conformance.json")
    ap.add_argument("--report-md", default="reports/conformance.md")
    ap.add_argument("--state-dir", default="reports/.external-state",
                    help="progress kept for resuming after a hang or crash (shared by all "
                         "nodes for multi-node resumes)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run recorded in --state-dir (a relaunch by hand; "
                         "torchrun's restarts resume by themselves)")
    ap.add_argument("--no-pack", action="store_true",
                    help="one instance at a time (to measure what packing gains)")
    ap.add_argument("--perf", action="store_true",
                    help="time every passing instance like nccl-tests (docs/howto/bandwidth.md); "
                         "instances then run one at a time, so that timings do not compete")
    ap.add_argument("--perf-warmup", type=int_in(0, 1_000_000), default=PerfPlan.warmup)
    ap.add_argument("--perf-iters", type=int_in(1, 1_000_000_000), default=PerfPlan.iters)
    ap.add_argument("--perf-min-time", type=float_in(0, 3600), default=PerfPlan.min_time_s)
    ap.add_argument("--perf-repeats", type=int_in(1, 1000), default=PerfPlan.repeats)
    args = ap.parse_args(argv)
    for flag, path in (("--report-json", args.report_json), ("--report-md", args.report_md)):
        why = unwritable(path, "report")
        if why:  # every rank stops here alike (the path is the same for all of them)
            print(f"python -m harness.run.external: {flag} {why}; give another path",
                  file=sys.stderr)
            return 2
    report_files = ReportFiles(args.report_json, args.report_md)
    if env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK") == 0:
        # Before anything can fail (a case file, the state directory, the process group):
        # whatever report stood at these paths is no longer this run's result.
        write_started(report_files, args.backend)
    plan = PerfPlan(warmup=max(0, args.perf_warmup), iters=max(1, args.perf_iters),
                    min_time_s=max(0.0, args.perf_min_time),
                    repeats=max(1, args.perf_repeats)) if args.perf else None

    import torch
    import torch.distributed as dist

    from ..ordering.probes import run_probes
    from ..program.interpreter import RankEnv, prepare_groups
    from ..program.perf import time_instance
    from ..program.reruns import run as run_instance

    rank = env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    world = env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    local = env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
    # Restart counts are per torchrun agent (an agent whose workers did not fail does not
    # count), so rank 0 decides from the progress file and tells the others.
    max_restarts = env_int("TORCHELASTIC_MAX_RESTARTS", default=0)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or ""
    for mod in args.backend_module:
        importlib.import_module(mod)
    instances = [i for i in load_instances(args.paths, args.backend, world)
                 if args.keyword in i.key and (args.full or "full" not in i.marks)]
    caps = probe_here(tuple(args.backend_module))
    instances = [overrides.resolve(i, caps.torch_version, caps.nccl_version) for i in instances]
    if plan is not None:
        instances = [dataclasses.replace(i, perf=plan) if not not_timed(i) else i
                     for i in instances]
    if caps.cuda_devices:
        torch.cuda.set_device(local % caps.cuda_devices)
    join(dist, args.backend, rank, world, max(600.0, args.deadline * 4))

    # Skips: every rank's own reasons, gathered, so that all ranks decide the same way.
    mine = [skip_reasons(i, caps, local, world) for i in instances]
    host = {"host": socket.gethostname(), "local_rank": local,
            "device": f"cuda:{torch.cuda.current_device()}" if caps.cuda_devices else "cpu"}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (mine, host))
    hosts = [h for _, h in gathered]
    reasons = []
    for n in range(len(instances)):
        first = next(((r, rs[n]) for r, (rs, _) in enumerate(gathered) if rs[n]), None)
        reasons.append("" if first is None else
                       first[1] if all(rs[n] == first[1] for rs, _ in gathered)
                       else f"on rank {first[0]} ({hosts[first[0]]['host']}): {first[1]}")
    rounds = schedule.plan(instances, world, [not r for r in reasons],
                           pack=not (args.no_pack or plan))
    state = State(args.state_dir, schedule.fingerprint(instances, world, rounds), run_id, rank,
                  local, 0)

    # Where to start: rank 0 reads the progress of an earlier attempt of the same run.
    box: list[Any] = [None, 0, max_restarts]
    if rank == 0:
        try:
            resumed = state.load(any_run=args.resume)
            if resumed is None:
                state.reset()
            else:  # launch n+1 of the run: files are named by launch, restarts counted
                box[1] = resumed.last_attempt + 1
                box[2] = max_restarts - resumed.launches
            state.attempt = box[1]
            state.started()
            box[0] = resumed
        except StateError as exc:
            box[0] = f"python -m harness.run.external: {exc}"
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):  # the state directory is not usable: every rank stops
        if rank == 0:
            print(box[0], file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return 2
    resumed, state.attempt, restarts_left = box
    attempt = state.attempt
    dist.barrier()  # the state directory exists before any rank writes into it
    crash_file = state.open_for_faulthandler("crash")
    faulthandler.enable(file=crash_file, all_threads=False)
    killed_file = state.open_for_faulthandler("killed")
    faulthandler.register(signal.SIGTERM, file=killed_file, all_threads=False, chain=True)
    records: list[dict[str, Any]] = list(resumed.records) if resumed else []
    groups: dict[tuple[int, ...], Any] = {}
    device = "cuda" if caps.cuda_devices else "cpu"

    def block_group(members: tuple[int, ...]) -> Any:
        if len(members) == world:
            return None
        if members not in groups:
            groups[members] = dist.new_group(list(members))
        return groups[members]

    def flush_report(done: bool = False) -> None:
        meta = {**caps.metadata(), "options": {
            "mode": "external", "backend": args.backend, "launched_world_size": world,
            "deadline_s": args.deadline, "packed": not (args.no_pack or plan),
            "attempt": attempt, "hosts": sorted({h["host"] for h in hosts}),
            "perf": dataclasses.asdict(plan) if plan else None}}
        # Until the run reaches its end the report says it is incomplete (never PASS): a
        # hang may end this launch, and what is left is resumed by the next one.
        session = {"complete": done, "collected": len(instances),
                   "without_result": len(instances) - len(records),
                   "ended_by": "finished" if done else
                   "in progress (or stopped by a hang or a crash: relaunch with --resume)"}
        report = build_report(records, meta, session)
        report_files.write(report)

    # Rank 0's last words before a deadline ends it: the report of what finished so far.
    watchdog = Watchdog(rank, state, flush_report if rank == 0 else None)

    def run_round(index: int, slots: tuple[schedule.Slot, ...], alone: str,
                  retry: bool) -> list[dict[str, Any]]:
        for s in slots:  # new_group is collective over the world: same order everywhere
            block_group(s.members)
        if alone == schedule.ALONE_GROUPS:
            for s in slots:
                prepare_groups(instances[s.index], RankEnv(
                    rank=0, world_size=len(s.members), device=device, groups=groups,
                    members=s.members if len(s.members) < world else None))
        if rank == 0:
            state.begin(index, [(s.index, s.members) for s in slots], retry)
        state.trace(index, -1)
        dist.barrier()  # the round is on disk before any rank can fail in it
        start = time.monotonic()
        deadlines = {s.index: instances[s.index].deadline or args.deadline for s in slots}
        slot = next((s for s in slots if rank in s.members), None)
        payload: Any = None
        if slot is not None:
            inst = instances[slot.index]
            watchdog.arm(inst.key, start + deadlines[slot.index])
            renv = RankEnv(rank=slot.members.index(rank), world_size=len(slot.members),
                           device=device, groups=groups, seq=index * world + slot.members[0],
                           members=slot.members if len(slot.members) < world else None,
                           world_group=block_group(slot.members),
                           progress=StepTrace(state, index))
            result = run_instance(inst, renv, run_probes, time_instance)
            payload = (slot.index, result, time.monotonic() - start)
            state.save_pending(index, slot.index, result, payload[2])
        watchdog.arm(f"round {index} (waiting for the other instances)",
                     start + max(deadlines.values()) + ROUND_GRACE_S)
        everyone: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(payload, everyone if rank == 0 else None, dst=0)
        watchdog.disarm()
        out: list[dict[str, Any]] = []
        if rank == 0:
            for s in slots:
                inst = instances[s.index]
                mine = [p for p in everyone if p is not None and p[0] == s.index]
                run = PoolRun(kind="done", results={p[1].rank: p[1] for p in mine},
                              elapsed=max((p[2] for p in mine), default=0.0))
                out.append(_record(inst, run, deadlines[s.index], s, index))
        return out

    def _record(inst: Instance, run: PoolRun, deadline: float, slot: schedule.Slot,
                index: int) -> dict[str, Any]:
        verdict: InstanceResult = judge(inst, run, deadline)
        verdict.duration = run.elapsed
        if plan is not None and verdict.outcome == "passed":
            verdict.perf = (aggregate(inst, run.results) if inst.perf
                            else {"not_timed": not_timed(inst)})
        rec = instance_record(inst, verdict, inst.key)
        rec["placement"] = _placement(slot, index, hosts)
        print(f"{verdict.outcome.upper():8} {inst.key}", flush=True)
        return rec

    def recover(inflight: dict[str, Any]) -> tuple[schedule.Slot, ...]:
        """Records of the round that failed; the slots to run again (collateral only)."""
        index = inflight["round"]
        seen_all: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(state.previous(index), seen_all if rank == 0 else None, dst=0)
        again: list[schedule.Slot] = []
        if rank == 0:
            seen = {d["rank"]: d for lst in seen_all for d in lst or []}
            new: list[dict[str, Any]] = []
            for i, members in inflight["slots"]:
                slot = schedule.Slot(i, tuple(members))
                inst = instances[i]
                deadline = inst.deadline or args.deadline
                run = recovered_run(inst, slot.members, seen)
                if run is None and inflight.get("retry"):
                    # Stopped twice without a failure of its own: report, do not loop.
                    run = PoolRun(kind="hang", states=[
                        RankState(n, "killed", stderr_tail="stopped by the launcher twice "
                                  "while other instances failed") for n in range(len(members))])
                if run is None:
                    pending = [seen[g]["pending"] for g in members
                               if "pending" in seen.get(g, {})]
                    if len(pending) == len(members):
                        run = PoolRun(kind="done", results={p[1].rank: p[1] for p in pending},
                                      elapsed=max(p[2] for p in pending))
                if run is None:
                    again.append(slot)
                    continue
                new.append(_record(inst, run, deadline, slot, index))
            records.extend(new)
            state.commit(index, new)
        box = [again]
        dist.broadcast_object_list(box, src=0)
        return tuple(box[0])

    if rank == 0 and not resumed:  # the skips are part of the progress (round -1)
        skipped = [skipped_record(inst, reason, inst.key)
                   for inst, reason in zip(instances, reasons, strict=True) if reason]
        records.extend(skipped)
        state.commit(-1, skipped)
    flushed = [time.monotonic()]
    start_round = resumed.next_round if resumed else 0
    if resumed and resumed.inflight is not None:
        again = recover(resumed.inflight)
        if again:
            got = run_round(start_round, again, "", retry=True)
            if rank == 0:
                records.extend(got)
                state.commit(start_round, got)
        start_round += 1
    for index in range(start_round, len(rounds)):
        rnd = rounds[index]
        if rank == 0 and (rnd.alone or time.monotonic() - flushed[0] > REPORT_EVERY_S):
            # The report of what finished so far, now and then (rewriting it every round
            # made a run quadratic); the progress file has every record at all times.
            flush_report()
            flushed[0] = time.monotonic()
        if rnd.alone == schedule.ALONE_RESTART and restarts_left <= 0:
            if rank == 0:
                got = [skipped_record(instances[s.index], "must run alone and needs a restart "
                                      "afterwards: launch with torchrun --max-restarts N",
                                      instances[s.index].key) for s in rnd.slots]
                records.extend(got)
                state.commit(index, got)
            continue
        try:
            got = run_round(index, rnd.slots, rnd.alone, retry=False)
        except BaseException:
            if rank == 0:  # a peer died (the launcher may restart us): keep what finished
                flush_report()
            raise
        if rank == 0:
            records.extend(got)
            state.commit(index, got)
        if rnd.alone == schedule.ALONE_RESTART:
            # It may have left the process group unusable: relaunch for a clean one.
            dist.barrier()
            sys.stdout.flush()
            os._exit(EXIT_RESTART)
    if rank == 0:
        state.finished()
        flush_report(done=True)
        bad = [r for r in records if r["outcome"] in ("failed", "error", "hang", "crash")]
        print(f"collective-harness (external, {world} ranks): {len(records)} instances, "
              f"{len(bad)} not conforming; report: {report_files.paths[0]}", flush=True)
    dist.destroy_process_group()
    # The run is complete: every rank ends well, or a launcher with restarts would start it
    # again. Whether the backend conformed is the report's to say (gate it).
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
