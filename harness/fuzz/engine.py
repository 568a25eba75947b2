"""The fuzzing loop: Hypothesis draws case documents, the executor runs them, failures shrink.

One *round* is one Hypothesis run (``@given`` over :func:`harness.fuzz.space.cases`, seeded
from ``--seed`` and the round number, with an example database under the output folder).
The first bad instance of a signature not found before (op, outcome class) raises that
signature's own exception class, so Hypothesis's shrinker keeps to that one bug while it
shrinks; other signatures are ignored for the rest of the round. Shrinking is capped in time:
past the cap, examples not seen before are not run (they count as passing), so the shrinker
settles on the smallest failing example so far. Results are cached by document text in a
round, so Hypothesis's final replay of the minimal example sees the same verdict even for a
flaky hang. With a *confirming* backend (``--confirm-against``: the same build without the
fault, e.g. the faithful wrapper), a bad instance counts only if it passes there: one that
fails there too is reported apart ("also fails without the fault") and treated as passing,
so neither the search nor the shrinker ever settles on it; the signature stays open for
instances that the fault alone breaks. A round that ends with a finding is followed by the
next, until the budget is spent; a hang or a crash is a finding like any other, never the
end of the run.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hyp_seed
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import HypothesisException

from . import space
from .execute import Executor, Ran

BLOB = re.compile(r"@reproduce_failure\([^)]*\)")
CLASSES = {"failed": "wrong-values", "error": "raise", "hang": "hang", "crash": "crash",
           "differs": "differs"}


class FindingError(Exception):
    """Raised inside the property for a new finding; one subclass per signature."""


class Stop(BaseException):
    """Ends a round when the budget is spent (passes through Hypothesis untouched)."""


def outcome_class(ran: Ran) -> str:
    """wrong-values, async-contract, raise, hang or crash."""
    if ran.outcome == "failed" and "async contract" in ran.message:
        return "async-contract"
    return CLASSES.get(ran.outcome, ran.outcome)


render = space.render_case
# Not Phase.explain: it traces every line the property runs (sys.settrace: the loader, the
# checks, the pool protocol) while shrinking, only to print which lines the failing examples
# ran, which a finding does not use; nor Phase.target (no target() is ever called).
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)


@dataclass
class Finding:
    """A minimal failing instance and how to reproduce it."""

    signature: str
    op: str
    outcome: str
    case: dict[str, Any]
    message: str
    seed: int
    blob: str
    found_after_s: float
    found_after_examples: int
    shrink_s: float = 0.0
    path: str = ""
    lane: int | None = None  # which worker process found it (--lanes N > 1)
    again: int = 0  # how many times other lanes found the same signature
    exception: str = ""  # what a rank raised, "Type: message" (a raise finding's cause)


@dataclass
class AlsoFails:
    """Bad instances of one signature that are bad on the confirming backend too."""

    signature: str
    case: dict[str, Any]  # the first one seen (not shrunk)
    message: str  # the verdict under test
    confirm_outcome: str  # the verdict on the confirming backend
    confirm_message: str
    count: int = 1
    path: str = ""


@dataclass
class Stats:
    """Counters shown while running and in the summary."""

    started: float = field(default_factory=time.monotonic)
    tried: int = 0  # instances run (shrinking included)
    shrinking: int = 0  # of which while shrinking
    invalid: int = 0  # documents the case-file checks rejected (a fuzzer bug if not 0)
    by_op: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    repeats: int = 0  # bad instances of an already-found signature
    confirm_runs: int = 0  # instances run again on the confirming backend (not in `tried`)

    def rate(self) -> float:
        return self.tried / max(1e-9, time.monotonic() - self.started)


@dataclass
class Budget:
    """--examples and/or --time; ``None`` is no limit on that side."""

    examples: int | None = None
    seconds: float | None = None
    shrink_s: float = 60.0
    stop_at_first: bool = False


class Fuzzer:
    """Runs rounds until the budget is spent, collecting findings."""

    def __init__(self, executor: Executor, op_names: tuple[str, ...],
                 world_sizes: tuple[int, ...], seed: int, budget: Budget,
                 database: Path | None = None,
                 on_finding: Callable[[Finding], None] = lambda f: None,
                 on_progress: Callable[[Stats, str], None] = lambda s, n: None,
                 on_ran: Callable[[str, Ran], None] = lambda t, r: None,
                 differ: Callable[[str, Ran], str] | None = None,
                 skip: set[str] | None = None,
                 confirm: Callable[[str], Ran] | None = None,
                 on_also: Callable[[AlsoFails], None] = lambda a: None,
                 seed_stride: int = 1, halt: Callable[[], bool] = lambda: False) -> None:
        self.executor = executor
        self.op_names = op_names
        self.world_sizes = world_sizes
        self.seed = seed
        # Round k runs with seed + k x seed_stride: one lane of N (harness.fuzz.lanes) takes
        # seed + index and strides by N, so that no two lanes ever draw with the same seed.
        self.seed_stride = seed_stride
        self.halt = halt  # true: end now, even while shrinking (another lane found a bug)
        self.budget = budget
        self.database = database
        self.on_finding = on_finding
        self.on_progress = on_progress
        self.on_ran = on_ran
        self.differ = differ
        # Replaced, never changed in place: another thread may add a signature a lane found.
        self.skip = frozenset(skip or ())
        self.confirm = confirm
        self.on_also = on_also
        self.also: dict[str, AlsoFails] = {}
        self._confirmed: dict[str, Ran] = {}  # document text -> verdict on the confirming one
        self.stats = Stats()
        self.findings: list[Finding] = []
        self._classes: dict[str, type[FindingError]] = {}
        self._last_progress = 0.0

    def _spent(self) -> bool:
        b = self.budget
        return ((b.examples is not None and self.stats.tried - self.stats.shrinking
                 >= b.examples)
                or (b.seconds is not None
                    and time.monotonic() - self.stats.started >= b.seconds))

    def _error_class(self, sig: str) -> type[FindingError]:
        if sig not in self._classes:
            name = "Finding_" + re.sub(r"\W", "_", sig)
            self._classes[sig] = type(name, (FindingError,), {})
        return self._classes[sig]

    def _tick(self, note: str = "") -> None:
        now = time.monotonic()
        if note or now - self._last_progress >= 1.0:
            self._last_progress = now
            self.on_progress(self.stats, note)

    def run(self) -> list[Finding]:
        """Fuzz until the budget is spent (KeyboardInterrupt passes through; the findings so
        far stay in ``self.findings``)."""
        rnd = 0
        while (not self._spent() and not self.halt()
               and not (self.budget.stop_at_first and self.findings)):
            found = self._round(self.seed + rnd * self.seed_stride)
            rnd += 1
            if found is None and self.budget.seconds is None:
                break  # the examples were spent without a new finding
        return self.findings

    def _round(self, round_seed: int) -> Finding | None:
        known = {f.signature for f in self.findings} | self.skip
        cache: dict[str, Ran] = {}
        state: dict[str, Any] = {"target": None, "t_shrink": 0.0, "last": None}
        remaining = (self.budget.examples - (self.stats.tried - self.stats.shrinking)
                     if self.budget.examples is not None else 10**9)

        def prop(case: dict[str, Any]) -> None:
            text = render(case)
            shrinking = state["target"] is not None
            if self.halt() or (not shrinking and self._spent()):
                raise Stop()
            ran = cache.get(text)
            if ran is None:
                if shrinking and time.monotonic() - state["t_shrink"] > self.budget.shrink_s:
                    return  # past the shrink cap: an example not seen counts as passing
                ran = self.executor.run_text(text)
                for line in self.executor.runner.news():  # a pool that stopped being started
                    self._tick(line)
                if self.differ is not None:
                    why = self.differ(text, ran)
                    if why:
                        ran.outcome, ran.message = "differs", why
                cache[text] = ran
                self._count(case, ran, shrinking)
                self.on_ran(text, ran)
            self._judge(case, text, ran, state, known)

        strategy = space.cases(self.op_names, self.world_sizes)
        test = given(strategy)(prop)
        test = settings(max_examples=max(1, min(remaining, 10**9)), deadline=None,
                        database=(DirectoryBasedExampleDatabase(str(self.database))
                                  if self.database else None),
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                        print_blob=True, derandomize=False, phases=PHASES)(test)
        test = hyp_seed(round_seed)(test)
        try:
            test()
        except Stop:
            return None
        except (FindingError, HypothesisException) as exc:
            if state["last"] is None:
                raise
            return self._record(state, round_seed, exc)
        return None

    def _judge(self, case: dict[str, Any], text: str, ran: Ran, state: dict[str, Any],
               known: set[str]) -> None:
        """Raise the finding's exception if ``ran`` is a bad instance of a signature this
        round may report (the one being shrunk, or any new one before that)."""
        if not ran.bad:
            return
        target = state["target"]
        shrinking = target is not None
        sig = f"{space.program_op(case)}:{outcome_class(ran)}"
        # A signature another lane found meanwhile (self.skip) is skipped, unless it is the
        # one being shrunk: dropped halfway, Hypothesis's final replay would call it flaky.
        if sig in known or (target is not None and sig != target) or (
                target is None and sig in self.skip):
            if not shrinking:
                self.stats.repeats += 1
            return
        if self.confirm is not None and not self._fails_only_here(text, case, sig, ran,
                                                                  shrinking):
            return  # bad without the fault too: not this run's finding
        if target is None:
            state.update(target=sig, t_shrink=time.monotonic(),
                         first=(time.monotonic() - self.stats.started,
                                self.stats.tried - self.stats.shrinking))
            self._tick(f"found {sig}; shrinking")
        state["last"] = (case, ran)
        raise self._error_class(sig)(ran.message[:200])

    def _fails_only_here(self, text: str, case: dict[str, Any], sig: str, ran: Ran,
                         shrinking: bool) -> bool:
        """Whether the bad instance ``text`` passes on the confirming backend (run once per
        document); if not, it is counted under "also fails without the fault"."""
        assert self.confirm is not None
        base = self._confirmed.get(text)
        if base is None:
            base = self.confirm(text)
            self._confirmed[text] = base
            self.stats.confirm_runs += 1
        if base.outcome == "passed":
            return True
        if not shrinking:
            seen = self.also.get(sig)
            if seen is None:
                self.also[sig] = seen = AlsoFails(sig, case, ran.message, base.outcome,
                                                  base.message)
                self.on_also(seen)
                self._tick(f"{sig} also fails without the fault; going on")
            else:
                seen.count += 1
        return False

    def _count(self, case: dict[str, Any], ran: Ran, shrinking: bool) -> None:
        self.stats.tried += 1
        self.stats.shrinking += shrinking
        if ran.outcome == "invalid":
            self.stats.invalid += 1
        self.stats.by_op[space.program_op(case)] += 1
        self.stats.outcomes["absorbed" if ran.absorbed_by else ran.outcome] += 1
        self._tick()

    def _record(self, state: dict[str, Any], round_seed: int, exc: BaseException
                ) -> Finding:
        case, ran = state["last"]
        notes = "\n".join(getattr(exc, "__notes__", []) or [])
        m = BLOB.search(notes)
        first_s, first_n = state["first"]
        f = Finding(state["target"], space.program_op(case), outcome_class(ran), case,
                    ran.message, round_seed, m.group(0) if m else "", round(first_s, 2),
                    first_n, round(time.monotonic() - state["t_shrink"], 2),
                    exception=ran.exception)
        self.findings.append(f)
        self.on_finding(f)
        self._tick(f"finding {f.signature}")
        return f
