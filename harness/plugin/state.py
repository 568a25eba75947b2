"""Per-process state of a pytest session: options as values, the pool manager, the records.

Shared by the phase modules of the plugin; reached through :func:`harness_session` (from a
config) or :func:`active_session` (from hooks that get no config, e.g. on the xdist controller).
"""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Any

import pytest

from ..errors import CaseFileError, quote
from ..manifest.load import Manifest, error_line, read
from ..run.pool import PoolManager, kill_leftovers
from ..runner.execute import Runner
from ..runner.settings import MAX_FRESH_RERUNS, RunSettings
from .ahead import Ahead
from .options import (
    operator_limits,
    ordering_settings,
    parse_seconds,
    perf_settings,
    whole_number,
)

RECORD_ATTR = "collective_record"


OUTCOME_ATTR = "collective_outcome"


MAX_MISSING_LISTED = 200
# Records between two gc.freeze() calls (see HarnessSession.add_record).
FREEZE_EVERY = 128


class HarnessSession:
    """Per-process state: options, the pool manager, and the records collected."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        opt = config.getoption
        self.backend: str = opt("collective_backend") or str(config.getini("collective_backend"))
        mods = opt("collective_backend_modules") or config.getini("collective_backend_modules")
        self.backend_modules: tuple[str, ...] = tuple(mods)
        self.manifest = read_manifest(opt("collective_manifest"), opt("collective_backend"))
        if self.manifest is not None:
            self.backend = self.manifest.backend
            if self.manifest.module and self.manifest.module not in self.backend_modules:
                self.backend_modules += (self.manifest.module,)
        self.deadline: float = parse_seconds("--deadline", opt("collective_deadline")
                                        or config.getini("collective_deadline"))
        self.limits = operator_limits(config, self.deadline)
        self.collected_count = 0  # instances collected so far (the per-session limit)
        ws = opt("collective_world_sizes")
        self.world_sizes = {int(x) for x in ws.split(",")} if ws else None
        self.full: bool = opt("collective_full")
        # ``is None``, not ``or``: a 0 on the command line is an error, not the default.
        pools, launched = opt("collective_max_pools"), opt("collective_launched_world_size")
        self.max_pools = whole_number(
            "--max-pools", config.getini("collective_max_pools") if pools is None else pools,
            1, 64)
        self.launched = whole_number(
            "--launched-world-size", config.getini("collective_launched_world_size")
            if launched is None else launched, 1, 1_000_000)  # --max-world-size bounds its use
        self.check_iters = whole_number("--check-iters", opt("collective_check_iters"), 1, 100)
        reruns = opt("collective_fresh_reruns")
        fresh_reruns = whole_number(
            "--fresh-reruns", config.getini("collective_fresh_reruns") if reruns is None
            else reruns, 0, MAX_FRESH_RERUNS)
        self.records: list[dict[str, Any]] = []
        # What shapes every instance's run and verdict, as one value (harness.runner); the
        # ordering and perf options are read by read_settings(), where a bad one is reported.
        self.settings = RunSettings(backend=self.backend, backend_modules=self.backend_modules,
                                    deadline_s=self.deadline, check_iters=self.check_iters,
                                    manifest=self.manifest,
                                    after_hang=opt("collective_after_hang"),
                                    fresh_reruns=fresh_reruns)
        self._runner: Runner | None = None
        ahead = opt("collective_ahead")
        self.ahead_workers = whole_number(
            "--ahead", config.getini("collective_ahead") if ahead is None else ahead, 0, 64)
        self.ahead: Ahead | None = None
        self.ahead_started = False
        self.warmed = False  # the forkserver and the probe were started early (plugin.warmup)
        self.is_worker = hasattr(config, "workerinput")
        # Node ids of the case instances selected to run (after -k/-m/--world-size/--full):
        # every one must end with a record, or the report says the session is incomplete.
        self.collected: set[str] = set()
        self.deselected = 0
        self.deselected_full = 0  # of which: marked 'full' and left out without --full
        self.deselected_perf = 0  # marked 'perf' (bandwidth) and left out without --perf
        self.deselected_world_size = 0  # at a world size --world-size does not name
        self.deselected_items = 0  # every item deselected, cases or not (pytest's count)
        self.ended_by = ""  # set when pytest is interrupted or fails internally
        self.close_failure = ""  # what went wrong stopping the ranks at the end (close())
        # The report paths were replaced by an INCOMPLETE report when the first case file was
        # collected: from then on only this session's own report may stand there.
        self.started_report = False
        # A case file was collected (also under --no-report): this is a harness run, so a
        # session in which no instance ran must not exit 0 (harness.plugin.session).
        self.saw_case_file = False
        self.fallback = ""  # where the report went when its own paths failed (the message)
        # YAML files under a directory named on the command line that are not case files.
        self.skipped_yaml: list[Path] = []
        # YAML files under the invocation directory itself (``pytest``, ``pytest .``) that were
        # not case files: listed only when nothing at all was collected (a bounded sample).
        self.here_yaml: list[Path] = []

    def add_record(self, record: dict[str, Any]) -> None:
        """Keep ``record`` for the report.

        The collected items and the records live until the session ends, and every full
        collection of the cyclic garbage collector walked them all again (16 of them took
        2.9 s of the bundled suite's pytest process). Objects that ``gc.freeze()`` moved to
        the permanent generation are left out of those walks, so the survivors are frozen
        after collection and after every ``FREEZE_EVERY`` records; a cycle that became garbage
        just before is then only freed at exit (the process is about to end anyway).
        """
        self.records.append(record)
        if len(self.records) % FREEZE_EVERY == 0:
            gc.freeze()

    def read_settings(self) -> None:
        """Add the ordering and perf options to the settings (pytest.UsageError if one is
        not usable); before the first instance is prepared."""
        self.settings = dataclasses.replace(self.settings,
                                            ordering=ordering_settings(self.config),
                                            perf=perf_settings(self.config))
        self._runner = None

    def start_ahead(self) -> Ahead:
        """The runner of isolated instances ahead of their turn (harness.plugin.ahead)."""
        if self.ahead is None:
            self.ahead = Ahead(self.runner, self.ahead_workers)
        return self.ahead

    @property
    def runner(self) -> Runner:
        """The one path from an instance to its verdict (harness.runner), made on first use."""
        if self._runner is None:
            self._runner = Runner(self.settings, max_pools=self.max_pools)
        return self._runner

    @property
    def has_pools(self) -> bool:
        """Whether this session asked for any rank pool."""
        return self._runner is not None and self._runner.has_pools

    @property
    def manager(self) -> PoolManager:
        """The session's rank pools (the runner's)."""
        return self.runner.manager

    def options(self) -> dict[str, Any]:
        return {**self.settings.metadata(), "full": self.full,
                "world_sizes": sorted(self.world_sizes) if self.world_sizes else None,
                "launched_world_size": self.launched}

    def close(self) -> str:
        """Stop every rank this session started; "" when that went as planned, else what
        failed (the ranks are then killed anyway). Never raises: the session's report must
        still be written, and say that its end was not clean."""
        failures: list[str] = []
        for part in ("ahead", "_runner"):
            obj = getattr(self, part)
            if obj is None:
                continue
            setattr(self, part, None)
            try:
                obj.close()
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {quote(str(exc))}")
        if failures:
            kill_leftovers()
        return "; ".join(failures)


SESSION_KEY = pytest.StashKey[HarnessSession]()


def harness_session(config: pytest.Config) -> HarnessSession:
    return config.stash[SESSION_KEY]


CONFIG: dict[str, pytest.Config] = {}


INFO_KEY = pytest.StashKey[dict[str, Any]]()


BASELINE_KEY = pytest.StashKey[Any]()


GATE_KEY = pytest.StashKey[Any]()


WRITTEN_KEY = pytest.StashKey[str]()


# The session's verdict and headline (set at its end, on the controller).
VERDICT_KEY = pytest.StashKey[tuple[str, str]]()


def read_manifest(path: str | None, backend: str | None) -> Manifest | None:
    """The ``--manifest`` file, checked (pytest.UsageError, one line, on anything wrong,
    and when ``--backend`` names another backend than the manifest's)."""
    if not path:
        return None
    try:
        manifest = read(path)
    except CaseFileError as exc:
        raise pytest.UsageError(f"--manifest: {error_line(exc)}") from None
    if backend and backend != manifest.backend:
        raise pytest.UsageError(f"--manifest {quote(path)} is for backend "
                                f"{quote(manifest.backend)}, not --backend {quote(backend)}: "
                                "leave --backend out, or give that backend's manifest")
    return manifest
