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

from ..casefile import expand, load, overrides, validate
from ..errors import CaseFileError, CaseFileErrors
from ..model import Instance, InstanceResult, PoolRun
from ..run.capabilities import Capabilities, probe
from ..run.pool import ForeignAnswerError, PoolKey, PoolManager, PoolStartError
from ..verdict.outcome import judge
from .known import KnownLibrary

BAD = ("failed", "error", "hang", "crash")
PROBE_DELAY_S = 0.02  # the ordering probes' injected delay (the plugin's default)
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

    @property
    def bad(self) -> bool:
        return (self.outcome in BAD and not self.absorbed_by) or self.outcome == "differs"


class Executor:
    """Keeps the pools warm across generated instances and runs one document at a time."""

    def __init__(self, backend: str, backend_modules: tuple[str, ...] = (),
                 deadline_s: float = 5.0, known: KnownLibrary | None = None,
                 max_pools: int = 4, env: tuple[tuple[str, str], ...] = (),
                 probe_every: int = PROBE_EVERY) -> None:
        self.backend = backend
        self.env = env  # set in every rank before init, over the case's own env
        self.probe_every = probe_every
        self.backend_modules = backend_modules
        self.deadline_s = deadline_s
        self.known = known or KnownLibrary([])
        # The plugin's process-group timeout (harness.plugin.state): an instance runs here as
        # under pytest, and a timeout this long lets the pool end a fail-fast grace early
        # when the other ranks are provably stranded (harness.run.stranded): Gloo's root-side
        # rejection of uneven gather/scatter lists cost the whole 2 s grace each with 30 s.
        self.manager = PoolManager(max_pools=max_pools, pg_timeout_s=max(600.0, deadline_s * 4))
        self.caps: Capabilities = probe(backend_modules)
        self.hangs = 0

    def instances(self, text: str, file: str = "fuzz.yaml") -> list[Instance]:
        """The instances of a document the fuzzer generated (CaseFileError if it is not a
        valid case). Composed by libyaml (:func:`~harness.casefile.load.load_generated_text`:
        the same values and positions as the case-file loader, a tenth of its time), then the
        same schema and semantic checks and expander; never give it a file someone wrote."""
        doc = load.load_generated_text(text, file)
        return [i for c in validate.load_cases(doc) for i in expand.expand(c, self.backend)]

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

    def _prepare(self, inst: Instance, probes: bool = True) -> Instance:
        inst = overrides.resolve(inst, self.caps.torch_version, self.caps.nccl_version)
        plan = inst.ordering
        if plan is not None:  # what harness.ordering.plan.configure does with --ordering all
            probes = probes and plan.shorthand_async and inst.expectation.kind == "pass"
            inst = dataclasses.replace(inst, ordering=dataclasses.replace(
                plan, probes=probes, delay_s=PROBE_DELAY_S))
        return inst

    def run_instance(self, inst: Instance, probes: bool = True) -> Ran:
        """Run ``inst`` on its pool and judge it; a bad outcome a known override explains is
        marked absorbed (judged again under that override, on the same run)."""
        inst = self._prepare(inst, probes)
        skip = inst.expectation.skip or self.caps.skip_reason(inst)
        if skip:
            return Ran("skipped", skip, inst.op, inst.world_size)
        deadline = min(inst.deadline or self.deadline_s, self.deadline_s)
        result, run = self._run(inst, deadline)
        ran = Ran(result.outcome, result.message, inst.op, inst.world_size)
        if run is not None:
            ran.digests = {f"{r}/{c.tensor}": c.digest for r, res in sorted(run.results.items())
                           for c in res.checks if c.digest}
            ran.inexact = inst.tolerance is not None or any(
                c.inexact for res in run.results.values() for c in res.checks)
        if result.outcome in BAD and run is not None:
            ran.absorbed_by = self.known.absorbs(inst, run, deadline, self.caps)
        if result.outcome == "hang":
            self.hangs += 1
        return ran

    def _run(self, inst: Instance, deadline: float) -> tuple[InstanceResult, PoolRun | None]:
        env = tuple(sorted({**dict(inst.env), **dict(self.env)}.items()))
        key = PoolKey(inst.backend, inst.device, inst.world_size, self.backend_modules,
                      env=env, pg_timeout_s=inst.pg_timeout)
        for _attempt in range(2):
            try:
                pool = self.manager.get(key)
                run = pool.run(inst, deadline)
            except PoolStartError as exc:
                return InstanceResult("error", f"the rank pool did not start: {exc}"), None
            except ForeignAnswerError:
                continue  # the pool is gone; once more on a fresh one
            result = judge(inst, run, deadline)
            self.manager.settle(pool, inst, run)
            return result, run
        return InstanceResult("error", "harness error: two pools in a row answered for "
                              "another instance"), None

    def close(self) -> None:
        """Stop every rank pool (no rank process outlives this)."""
        self.manager.close()
