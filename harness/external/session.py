"""One external-ranks run, step by step, on every rank (see :mod:`harness.external`).

Every rank joins the default process group from the launcher's environment and loads and
prepares the same instances in the same order (``world_size: launched`` becomes the launched
world size). Whether each instance can run is decided from every rank's own reasons,
gathered, so all ranks agree. Instances are packed onto disjoint blocks of ranks
(:mod:`harness.external.schedule`): 16 ranks run four world-size-4 instances at once, each on
its own subgroup, with the same per-rank code as the harness's own pools. Rank 0 gathers every
rank's results, judges them with the runner's verdict and writes the one report, with the
global ranks, hosts and devices each instance ran on.

A hang or a crash ends the processes (there is no pool to recover them): each rank's deadline
watchdog dumps its stack and exits, and the launcher restarts the ranks (torchrun
``--max-restarts``). The restarted run resumes after the failed round from the progress rank 0
keeps (:mod:`harness.external.progress`), turns what each rank left behind into the failed
instance's record (blocked with its stack, died, stopped by the launcher), re-runs the
instances that were only collateral, and goes on. Instances that must hang, crash or poison
the group run alone, last, and only while the launcher has restarts left.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import socket
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from ..casefile import collect
from ..errors import CaseFileError, CaseFileErrors
from ..model import Instance, PoolRun, RankState
from ..ordering.probes import run_probes
from ..program.interpreter import RankEnv, prepare_groups
from ..program.perf import time_instance
from ..program.reruns import run as run_instance
from ..report.records import build_report, instance_record, skipped_record
from ..run.capabilities import probe_here
from ..runner.execute import Runner
from ..runner.prepare import Prepared
from ..runner.settings import RunSettings
from . import schedule
from .files import PROG, ReportFiles, case_files
from .launch import StepTrace, Watchdog, env_int, join
from .progress import State, StateError, recovered_run

EXIT_RESTART = 75  # every rank leaves so that the launcher starts a clean process group
ROUND_GRACE_S = 10.0  # a rank waiting for a round's other instances outlives their deadlines
REPORT_EVERY_S = 15.0  # how often rank 0 rewrites the report of a run in progress


def load_instances(paths: list[str], backend: str, launched: int) -> list[Instance]:
    """Every instance of every case file, or SystemExit with the file's errors."""
    instances: list[Instance] = []
    for f in case_files(paths):
        try:
            instances += collect.from_file(str(f), backend, str(f), launched=launched)
        except (CaseFileError, CaseFileErrors) as exc:
            raise SystemExit(str(exc)) from None
    return instances


def skip_reason(prepared: Prepared, world: int) -> str:
    """Why this rank cannot run an instance ("" if it can); gathered from every rank."""
    inst = prepared.instance
    if inst.world_size > world:
        return f"needs {inst.world_size} ranks; launched with {world}"
    return prepared.skip


def agreed_reasons(gathered: list[Any], hosts: list[dict[str, Any]], count: int) -> list[str]:
    """Per instance, why it is skipped: "" if every rank can run it; a rank's reason, named,
    where the ranks disagree."""
    reasons = []
    for n in range(count):
        first = next(((r, rs[n]) for r, (rs, _) in enumerate(gathered) if rs[n]), None)
        reasons.append("" if first is None else
                       first[1] if all(rs[n] == first[1] for rs, _ in gathered)
                       else f"on rank {first[0]} ({hosts[first[0]]['host']}): {first[1]}")
    return reasons


def _placement(slot: schedule.Slot, round_index: int, hosts: list[dict[str, Any]]
               ) -> dict[str, Any]:
    return {"round": round_index,
            "ranks": [{"rank": i, "global_rank": g, **hosts[g]}
                      for i, g in enumerate(slot.members)]}


class ExternalRun:
    """The run on this rank: its steps in the order :meth:`run` takes them."""

    def __init__(self, args: argparse.Namespace, settings: RunSettings,
                 report_files: ReportFiles) -> None:
        self.args = args
        self.settings = settings
        self.report_files = report_files
        self.rank = env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
        self.world = env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
        self.local = env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                             default=0)
        # Restart counts are per torchrun agent (an agent whose workers did not fail does not
        # count), so rank 0 decides from the progress file and tells the others.
        self.max_restarts = env_int("TORCHELASTIC_MAX_RESTARTS", default=0)
        self.run_id = (os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")
                       or "")
        self.packed = not (args.no_pack or settings.perf.enabled)
        self.records: list[dict[str, Any]] = []
        self.groups: dict[tuple[int, ...], Any] = {}
        self.hosts: list[dict[str, Any]] = []
        self.attempt = 0
        self.restarts_left = self.max_restarts

    # ---- the steps ----------------------------------------------------------------------

    def run(self) -> int:
        """Every step, in order; 0 when the run reached its end (the report has the verdict)."""
        self.load()
        self.join()
        self.decide_skips()
        resumed = self.resume_point()
        if resumed is False:
            return 2
        self.watch()
        self.run_rounds(resumed)
        self.finish()
        return 0

    def load(self) -> None:
        """Import the backend modules, read and prepare every instance (as pytest would)."""
        for mod in self.args.backend_module:
            importlib.import_module(mod)
        self.caps = probe_here(tuple(self.args.backend_module))
        unknown = self.caps.unknown_backend(self.args.backend, tuple(self.args.backend_module))
        if unknown:  # as pytest's usage error: every rank stops here alike, before joining
            raise SystemExit(f"{PROG}: --backend {unknown}")
        self.runner = Runner(self.settings, caps=self.caps)
        chosen = [i for i in load_instances(self.args.paths, self.args.backend, self.world)
                  if self.args.keyword in i.key and (self.args.full or "full" not in i.marks)]
        self.prepared = [self.runner.prepare(i, local_rank=self.local) for i in chosen]
        problem = next((p for p in self.prepared if p.problem), None)
        if problem is not None:  # the same on every rank: all stop, as for a bad case file
            raise SystemExit(f"{problem.instance.where()}: {problem.problem}")
        self.instances = [p.instance for p in self.prepared]
        self.device = "cuda" if self.caps.cuda_devices else "cpu"

    def join(self) -> None:
        """Join the launcher's process group (on this rank's GPU, if it has one)."""
        if self.caps.cuda_devices:
            torch.cuda.set_device(self.local % self.caps.cuda_devices)
        join(dist, self.args.backend, self.rank, self.world, self.settings.pg_timeout_s)

    def decide_skips(self) -> None:
        """Every rank's own skip reasons, gathered, so that all ranks decide alike; then the
        rounds and the progress file's fingerprint of this run."""
        mine = [skip_reason(p, self.world) for p in self.prepared]
        host = {"host": socket.gethostname(), "local_rank": self.local,
                "device": (f"cuda:{torch.cuda.current_device()}" if self.caps.cuda_devices
                           else "cpu")}
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, (mine, host))
        self.hosts = [h for _, h in gathered]
        self.reasons = agreed_reasons(gathered, self.hosts, len(self.instances))
        self.rounds = schedule.plan(self.instances, self.world, [not r for r in self.reasons],
                                    pack=self.packed)
        self.state = State(self.args.state_dir,
                           schedule.fingerprint(self.instances, self.world, self.rounds),
                           self.run_id, self.rank, self.local, 0)

    def resume_point(self) -> Any:
        """Rank 0 reads the progress of an earlier attempt of the same run and tells everyone:
        the resumed progress (None: a new run), or False when the state directory is not
        usable (every rank stops)."""
        box: list[Any] = [None, 0, self.max_restarts]
        if self.rank == 0:
            try:
                resumed = self.state.load(any_run=self.args.resume)
                if resumed is None:
                    self.state.reset()
                else:  # launch n+1 of the run: files are named by launch, restarts counted
                    box[1] = resumed.last_attempt + 1
                    box[2] = self.max_restarts - resumed.launches
                self.state.attempt = box[1]
                self.state.started()
                box[0] = resumed
            except StateError as exc:
                box[0] = f"{PROG}: {exc}"
        dist.broadcast_object_list(box, src=0)
        if isinstance(box[0], str):
            if self.rank == 0:
                print(box[0], file=sys.stderr, flush=True)
            dist.destroy_process_group()
            return False
        resumed, self.state.attempt, self.restarts_left = box
        self.attempt = self.state.attempt
        self.records = list(resumed.records) if resumed else []
        dist.barrier()  # the state directory exists before any rank writes into it
        return resumed

    def watch(self) -> None:
        """Stack dumps into the state directory on a crash or SIGTERM, and the deadline
        watchdog (rank 0's last words before a deadline ends it: the report so far)."""
        faulthandler.enable(file=self.state.open_for_faulthandler("crash"), all_threads=False)
        faulthandler.register(signal.SIGTERM, file=self.state.open_for_faulthandler("killed"),
                              all_threads=False, chain=True)
        self.watchdog = Watchdog(self.rank, self.state,
                                 self.flush_report if self.rank == 0 else None)

    def run_rounds(self, resumed: Any) -> None:
        """The skips (round -1), the round a restart interrupted, then every round left."""
        if self.rank == 0 and not resumed:
            skipped = [skipped_record(inst, reason, inst.key)
                       for inst, reason in zip(self.instances, self.reasons, strict=True)
                       if reason]
            self.records.extend(skipped)
            self.state.commit(-1, skipped)
        flushed = time.monotonic()
        start = resumed.next_round if resumed else 0
        if resumed and resumed.inflight is not None:
            again = self.recover(resumed.inflight)
            if again:
                self.commit(start, self.run_round(start, again, "", retry=True))
            start += 1
        for index in range(start, len(self.rounds)):
            rnd = self.rounds[index]
            if self.rank == 0 and (rnd.alone or time.monotonic() - flushed > REPORT_EVERY_S):
                # The report of what finished so far, now and then (rewriting it every round
                # made a run quadratic); the progress file has every record at all times.
                self.flush_report()
                flushed = time.monotonic()
            if rnd.alone == schedule.ALONE_RESTART and self.restarts_left <= 0:
                self.commit(index, [skipped_record(
                    self.instances[s.index], "must run alone and needs a restart afterwards: "
                    "launch with torchrun --max-restarts N", self.instances[s.index].key)
                    for s in rnd.slots] if self.rank == 0 else [])
                continue
            try:
                got = self.run_round(index, rnd.slots, rnd.alone, retry=False)
            except BaseException:
                if self.rank == 0:  # a peer died (the launcher may restart us): keep what ran
                    self.flush_report()
                raise
            self.commit(index, got)
            if rnd.alone == schedule.ALONE_RESTART:
                # It may have left the process group unusable: relaunch for a clean one.
                dist.barrier()
                sys.stdout.flush()
                os._exit(EXIT_RESTART)

    def finish(self) -> None:
        """Rank 0 writes the complete report; every rank leaves the group. The run is
        complete: every rank ends well, or a launcher with restarts would start it again.
        Whether the backend conformed is the report's to say (gate it)."""
        if self.rank == 0:
            self.state.finished()
            report = self.flush_report(done=True)
            print(f"collective-harness (external, {self.world} ranks): "
                  f"{report['summary']['headline']}; report: {self.report_files.paths[0]}",
                  flush=True)
        dist.destroy_process_group()

    # ---- the pieces the steps share -----------------------------------------------------

    def commit(self, index: int, got: list[dict[str, Any]]) -> None:
        """Rank 0 keeps a round's records, in memory and in the progress file."""
        if self.rank == 0:
            self.records.extend(got)
            self.state.commit(index, got)

    def block_group(self, members: tuple[int, ...]) -> Any:
        if len(members) == self.world:
            return None
        if members not in self.groups:
            self.groups[members] = dist.new_group(list(members))
        return self.groups[members]

    def flush_report(self, done: bool = False) -> dict[str, Any]:
        """Write the report of what has a record so far (complete when ``done``); return it."""
        meta = {**self.caps.metadata(), "options": {
            **self.settings.metadata(), "mode": "external", "full": self.args.full,
            "launched_world_size": self.world, "packed": self.packed,
            "attempt": self.attempt, "hosts": sorted({h["host"] for h in self.hosts})}}
        # Until the run reaches its end the report says it is incomplete (never PASS): a
        # hang may end this launch, and what is left is resumed by the next one.
        session = {"complete": done, "collected": len(self.instances),
                   "without_result": len(self.instances) - len(self.records),
                   "ended_by": "finished" if done else
                   "in progress (or stopped by a hang or a crash: relaunch with --resume)"}
        report = build_report(self.records, meta, session)
        self.report_files.write(report)
        return report

    def run_round(self, index: int, slots: tuple[schedule.Slot, ...], alone: str,
                  retry: bool) -> list[dict[str, Any]]:
        """Run one round's instances, each on its block of ranks; rank 0 judges them."""
        for s in slots:  # new_group is collective over the world: same order everywhere
            self.block_group(s.members)
        if alone == schedule.ALONE_GROUPS:
            for s in slots:
                prepare_groups(self.instances[s.index], RankEnv(
                    rank=0, world_size=len(s.members), device=self.device, groups=self.groups,
                    members=s.members if len(s.members) < self.world else None))
        if self.rank == 0:
            self.state.begin(index, [(s.index, s.members) for s in slots], retry)
        self.state.trace(index, -1)
        dist.barrier()  # the round is on disk before any rank can fail in it
        start = time.monotonic()
        deadlines = {s.index: self.prepared[s.index].deadline_s for s in slots}
        slot = next((s for s in slots if self.rank in s.members), None)
        payload: Any = None
        if slot is not None:
            inst = self.instances[slot.index]
            self.watchdog.arm(inst.key, start + deadlines[slot.index])
            renv = RankEnv(rank=slot.members.index(self.rank), world_size=len(slot.members),
                           device=self.device, groups=self.groups,
                           seq=index * self.world + slot.members[0],
                           members=slot.members if len(slot.members) < self.world else None,
                           world_group=self.block_group(slot.members),
                           progress=StepTrace(self.state, index))
            result = run_instance(inst, renv, run_probes, time_instance)
            payload = (slot.index, result, time.monotonic() - start)
            self.state.save_pending(index, slot.index, result, payload[2])
        self.watchdog.arm(f"round {index} (waiting for the other instances)",
                          start + max(deadlines.values()) + ROUND_GRACE_S)
        everyone: list[Any] = [None] * self.world if self.rank == 0 else []
        dist.gather_object(payload, everyone if self.rank == 0 else None, dst=0)
        self.watchdog.disarm()
        out: list[dict[str, Any]] = []
        if self.rank == 0:
            for s in slots:
                mine = [p for p in everyone if p is not None and p[0] == s.index]
                run = PoolRun(kind="done", results={p[1].rank: p[1] for p in mine},
                              elapsed=max((p[2] for p in mine), default=0.0))
                out.append(self.record(s, run, index))
        return out

    def record(self, slot: schedule.Slot, run: PoolRun, index: int) -> dict[str, Any]:
        """The record of one instance's gathered run, judged by the runner's verdict."""
        prepared = self.prepared[slot.index]
        inst = prepared.instance
        verdict = self.runner.verdict(inst, run, prepared.deadline_s)
        verdict.duration = run.elapsed
        verdict.overrides_not_applied = list(prepared.not_applied)
        rec = instance_record(inst, verdict, inst.key)
        rec["placement"] = _placement(slot, index, self.hosts)
        print(f"{verdict.outcome.upper():8} {inst.key}", flush=True)
        return rec

    def recover(self, inflight: dict[str, Any]) -> tuple[schedule.Slot, ...]:
        """Records of the round that failed; the slots to run again (collateral only)."""
        index = inflight["round"]
        seen_all: list[Any] = [None] * self.world if self.rank == 0 else []
        dist.gather_object(self.state.previous(index), seen_all if self.rank == 0 else None,
                           dst=0)
        again: list[schedule.Slot] = []
        if self.rank == 0:
            seen = {d["rank"]: d for lst in seen_all for d in lst or []}
            new: list[dict[str, Any]] = []
            for i, members in inflight["slots"]:
                slot = schedule.Slot(i, tuple(members))
                run = recovered_run(self.instances[i], slot.members, seen)
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
                new.append(self.record(slot, run, index))
            self.commit(index, new)
        box = [again]
        dist.broadcast_object_list(box, src=0)
        return tuple(box[0])

