"""One fuzzer with everything it runs on: the known library, the executors and the engine.

Built from the checked options (:mod:`harness.fuzz.options`) by ``collective-fuzz`` itself
with one lane, and by each worker process (:mod:`harness.fuzz.worker`) with several: both
run exactly this, and differ only in where findings, progress and digests go (the
callbacks: case files and the terminal here, messages to the coordinator there).

Takes: the options, the lane's index and the number of lanes. Gives: the fuzzer's findings
and its :class:`~harness.fuzz.summary.Tally`. Must not: leave a rank process behind once
:meth:`Session.close` returns.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from . import space
from .differential import Differ
from .engine import AlsoFails, Budget, Finding, Fuzzer, Stats
from .execute import Executor, Ran
from .known import KnownLibrary, load_library
from .options import BUNDLED, database_path, differ_label, env_var
from .summary import Tally


class Session:
    """The executors (under test, ``--against``, ``--confirm-against``) and the fuzzer."""

    def __init__(self, args: argparse.Namespace, ops: tuple[str, ...],
                 report_digests: dict[str, dict[str, str]] | None = None, *,
                 lane: int = 0, lanes: int = 1,
                 on_finding: Callable[[Finding], None] = lambda f: None,
                 on_also: Callable[[AlsoFails], None] = lambda a: None,
                 on_progress: Callable[[Stats, str], None] = lambda s, n: None,
                 on_ran: Callable[[str, Ran], None] = lambda t, r: None,
                 halt: Callable[[], bool] = lambda: False) -> None:
        paths = ([] if args.no_bundled else [str(BUNDLED)]) + list(args.known)
        library, self.broken = load_library([p for p in paths if os.path.exists(p)])
        self.known = KnownLibrary(library, alias=args.overrides_for)
        modules = tuple(args.backend_module)
        max_pools = len(args.world_size)
        self.executors: list[Executor] = []
        self.executor = self._executor(args.backend, modules, args, self.known, max_pools)
        self.differ: Differ | None = None
        label = differ_label(args) or ""
        if args.against:
            self.differ = Differ(self._executor(args.against, modules, args, KnownLibrary([]),
                                                max_pools), label=label)
        elif report_digests is not None:
            self.differ = Differ(report=report_digests, label=label)
        confirm: Executor | None = None
        if args.confirm_against:
            confirm = self._executor(args.confirm_against, modules, args, self.known,
                                     max_pools,
                                     tuple(sorted(env_var(e) for e in args.confirm_env)))
        self.fuzzer = Fuzzer(
            self.executor, ops, args.world_size, args.seed + lane,
            Budget(args.examples, args.time, args.shrink_time, args.stop_at_first),
            database=database_path(args), on_finding=on_finding,
            on_progress=on_progress, on_ran=on_ran,
            differ=self.differ.check if self.differ else None,
            skip={x.strip() for x in args.skip_signatures.split(",") if x.strip()},
            confirm=confirm.run_text if confirm is not None else None, on_also=on_also,
            seed_stride=lanes, halt=halt)

    def _executor(self, backend: str, modules: tuple[str, ...], args: argparse.Namespace,
                  known: KnownLibrary, max_pools: int,
                  env: tuple[tuple[str, str], ...] = ()) -> Executor:
        # The manifest describes the backend under test, not a reference it is compared with.
        manifest = args.manifest_data if backend == args.backend else None
        ex = Executor(backend, modules, args.deadline, known, max_pools, env=env,
                      probe_every=args.probe_every, manifest=manifest)
        self.executors.append(ex)
        return ex

    def warm(self) -> None:
        """Start the pool of every world size the run draws (a barrier on each), so that a
        measurement of the fuzzing (ci/bench/fuzz_bench.py) leaves the pools' start out."""
        for ws in self.fuzzer.world_sizes:
            self.executor.run_text(space.render_case({"name": "warm", "op": "barrier",
                                                      "world_size": ws}))

    def start_clock(self) -> None:
        """Count the run's time (``--time``, the rate) from now: after a warm-up."""
        self.fuzzer.stats.started = time.monotonic()

    def run(self) -> bool:
        """Fuzz until the budget is spent or the run is halted; True when interrupted
        (Ctrl-C, or SIGTERM where the caller turns it into KeyboardInterrupt)."""
        try:
            self.fuzzer.run()
        except KeyboardInterrupt:
            return True
        return False

    def tally(self) -> Tally:
        """What this fuzzer counted so far."""
        return Tally.of(self.fuzzer, self.known,
                        self.differ.compared if self.differ is not None else 0)

    def close(self) -> None:
        """Stop every executor's pools (no rank process outlives this); one that fails to
        stop does not keep the others running (the first failure is raised after all)."""
        failed: BaseException | None = None
        for ex in self.executors:
            try:
                ex.close()
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
