"""What a session decides for every instance it runs: one frozen value, built by each front end
from its own options (the plugin from pytest's, the fuzzer and external mode from argparse)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..manifest.load import Manifest
from ..ordering.plan import OrderingSettings
from ..perf.plan import PerfSettings

FRESH_RERUNS = 10
MAX_FRESH_RERUNS = 10_000


@dataclass(frozen=True)
class RunSettings:
    """The session's settings that shape how an instance runs and is judged."""

    backend: str = "gloo"
    backend_modules: tuple[str, ...] = ()
    deadline_s: float = 60.0  # an instance's deadline unless its case sets one
    ordering: OrderingSettings = field(default_factory=OrderingSettings)
    perf: PerfSettings = field(default_factory=PerfSettings)
    check_iters: int = 1  # --check-iters: iterations of each reference-checked instance
    # Set in every rank before init, over each case's own environment (collective-fuzz --env).
    env: tuple[tuple[str, str], ...] = ()
    # --fresh-reruns: failures run again on fresh ranks, at most this many in the session
    # (harness.runner.execute: state a backend carries from one instance to the next).
    fresh_reruns: int = FRESH_RERUNS
    # The backend's capability manifest (--manifest): what it claims and what it wraps.
    manifest: Manifest | None = None
    # "skip": after a hang nobody declared, skip what hung from then on (harness.runner.breaker)
    after_hang: str = "run"

    @property
    def inherits(self) -> str:
        """The backend the tested one wraps, per its manifest ("" without one)."""
        return self.manifest.inherits if self.manifest is not None else ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ValueError(f"deadline {self.deadline_s!r}: must be a positive, finite "
                             "number of seconds")
        if self.after_hang not in ("run", "skip"):
            raise ValueError(f"--after-hang {self.after_hang!r}: must be run or skip")
        if not 1 <= self.check_iters <= 100:
            raise ValueError(f"--check-iters {self.check_iters}: must be from 1 to 100")
        if not 0 <= self.fresh_reruns <= MAX_FRESH_RERUNS:
            raise ValueError(f"--fresh-reruns {self.fresh_reruns}: must be from 0 to "
                             f"{MAX_FRESH_RERUNS}")

    @property
    def pg_timeout_s(self) -> float:
        """The ranks' process-group timeout: far past any deadline, so that the harness's
        own deadline, not the backend's timeout, is what ends a hang (harness.run.stranded
        uses it to end a fail-fast grace early)."""
        return max(600.0, self.deadline_s * 4)

    def metadata(self) -> dict[str, Any]:
        """The settings as report metadata (options)."""
        return {"backend": self.backend, "backend_modules": list(self.backend_modules),
                "deadline_s": self.deadline_s, "check_iters": self.check_iters,
                "after_hang": self.after_hang, "fresh_reruns": self.fresh_reruns,
                **self.ordering.metadata(), **self.perf.metadata(),
                **({"manifest": self.manifest.metadata()} if self.manifest else {})}
