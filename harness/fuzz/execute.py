"""Run one generated case document exactly as the plugin runs a case instance, in process.

The document (YAML text) goes through the case-file loader (its values and positions composed
by libyaml, as the fuzzer wrote the text itself), the JSON Schema and semantic
checks and the expander (:mod:`harness.casefile`), then onto a warm rank pool
(:mod:`harness.run.pool`) and through the verdict (:mod:`harness.verdict.outcome`), so a case
file written from it is, by construction, what ran. No pytest per example: the pools stay
warm between examples, which is what makes tens of instances per second possible.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field

from ..casefile import collect
from ..errors import CaseFileError, CaseFileErrors
from ..manifest.load import Manifest
from ..model import BAD_OUTCOMES, Instance, PoolRun
from ..ordering.plan import OrderingSettings
from ..report.jsonfile import printable
from ..run.capabilities import Capabilities
from ..run.pool import PoolManager
from ..runner.execute import Runner
from ..runner.settings import RunSettings
from .known import KnownLibrary

EXCEPTION_CHARS = 200
PROBE_EVERY = 4  # the ordering probes run on one async shorthand document in this many


@dataclass
class Ran:
    """One generated instance, run and judged."""

    outcome: str  # the verdict's outcome, or "invalid" (the document did not expand)
    message: str
    op: str
    world_size: int
    absorbed_by: str = ""  # the known-override (file:line) that explains a bad outcome
    digests: dict[str, str] = field(default_factory=dict)  # "rank/tensor" -> sha256 prefix
    inexact: bool = False  # the reference accepts more than one answer (a tolerance)
    seconds: float = 0.0
    # What the first rank that raised raised, "Type: message" (short, escaped); "" if none.
    exception: str = ""

    @property
    def bad(self) -> bool:
        return (self.outcome in BAD_OUTCOMES and not self.absorbed_by) or self.outcome == "differs"


def first_exception(run: PoolRun) -> str:
    """``Type: message`` of the lowest rank that raised (the message's first line, escaped,
    cut to :data:`EXCEPTION_CHARS`), or ""."""
    raised = [r for _, r in sorted(run.results.items()) if r.status == "raised"]
    if not raised:
        return ""
    lines = raised[0].exc_message.strip().splitlines()
    return printable(f"{raised[0].exc_type}: {lines[0] if lines else ''}".rstrip(": "),
                     EXCEPTION_CHARS)


class Executor:
    """Keeps the pools warm across generated instances and runs one document at a time,
    through the same runner as the plugin (:mod:`harness.runner`): the probes of a probed
    document are the plugin's ``--ordering all``, the others' its ``--ordering none``."""

    def __init__(self, backend: str, backend_modules: tuple[str, ...] = (),
                 deadline_s: float = 5.0, known: KnownLibrary | None = None,
                 max_pools: int = 4, env: tuple[tuple[str, str], ...] = (),
                 probe_every: int = PROBE_EVERY, manifest: Manifest | None = None) -> None:
        self.backend = backend
        self.probe_every = probe_every
        self.deadline_s = deadline_s
        self.known = known or KnownLibrary([])
        settings = RunSettings(backend=backend, backend_modules=backend_modules,
                               deadline_s=deadline_s, env=env,
                               ordering=OrderingSettings(mode="all"), manifest=manifest)
        self.runner = Runner(settings, max_pools=max_pools)
        self.unprobed = dataclasses.replace(settings, ordering=OrderingSettings(mode="none"))
        self.hangs = 0

    @property
    def caps(self) -> Capabilities:
        return self.runner.caps

    @property
    def manager(self) -> PoolManager:
        return self.runner.manager

    def instances(self, text: str, file: str = "fuzz.yaml") -> list[Instance]:
        """The instances of a document the fuzzer generated (CaseFileError if it is not a
        valid case). Composed by libyaml (:func:`~harness.casefile.load.load_generated_text`:
        the same values and positions as the case-file loader, a tenth of its time), then the
        same schema and semantic checks and expander; never give it a file someone wrote."""
        return collect.from_text(text, file, self.backend, generated=True)

    def run_text(self, text: str) -> Ran:
        """Load, expand, run and judge a one-instance document."""
        t0 = time.monotonic()
        try:
            (inst,) = self.instances(text)
        except (CaseFileError, CaseFileErrors, ValueError) as exc:
            return Ran("invalid", str(exc)[:500], "?", 0, seconds=time.monotonic() - t0)
        ran = self.run_instance(inst, probes=self.probed(text))
        ran.seconds = time.monotonic() - t0
        return ran

    def probed(self, text: str) -> bool:
        """Whether the ordering probes run for this document (if it is async shorthand).

        The probes run the instance three more times with a delayed rank (most of an async
        instance's time), so they run on a sample: one document in ``probe_every``, chosen
        by the document's SHA-256, so that a document always gets the same treatment (a
        replay, a shrink and the cache agree). Every async instance still has its values
        and its own timeline (``is_completed()`` after ``wait()``) checked; the case file
        of a finding runs with the probes under pytest."""
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
        return self.probe_every <= 1 or digest % self.probe_every == 0

    def run_instance(self, inst: Instance, probes: bool = True) -> Ran:
        """Run ``inst`` on its pool and judge it; a bad outcome a known override explains is
        marked absorbed (judged again under that override, on the same run)."""
        runner = self.runner
        # The fuzzer's deadline is a ceiling: a generated case cannot ask for more.
        inst = dataclasses.replace(inst, deadline=min(inst.deadline or self.deadline_s,
                                                      self.deadline_s))
        prepared = runner.prepare(inst, settings=None if probes else self.unprobed)
        inst = prepared.instance
        if prepared.skip:
            return Ran("skipped", prepared.skip, inst.op, inst.world_size)
        judged = runner.execute(prepared)
        result, run = judged.result, judged.run
        ran = Ran(result.outcome, result.message, inst.op, inst.world_size)
        if run is not None:
            ran.digests = {f"{r}/{c.tensor}": c.digest for r, res in sorted(run.results.items())
                           for c in res.checks if c.digest}
            ran.inexact = inst.tolerance is not None or any(
                c.inexact for res in run.results.values() for c in res.checks)
            ran.exception = first_exception(run)
        if result.outcome in BAD_OUTCOMES and run is not None:
            ran.absorbed_by = self.known.absorbs(inst, run, prepared.deadline_s, runner)
        if result.outcome == "hang":
            self.hangs += 1
        return ran

    def close(self) -> None:
        """Stop every rank pool (no rank process outlives this)."""
        self.runner.close()
