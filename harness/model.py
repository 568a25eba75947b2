"""Records that flow between pipeline stages.

Parent side: :class:`Case` (validated YAML) -> :class:`Instance` (one concrete test).
Rank side: :class:`Instance` in, :class:`RankResult` out. Parent again:
:class:`InstanceResult` (the verdict), then the report record (a plain dict, see
``harness.report``). Everything here pickles cleanly and imports no torch.

Kept whole: these are the records that cross stage boundaries; one module that imports nothing
above it lets every stage use them without importing another stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import CaseFileError
from .expr import Expr

DEFAULT_ORDERING_DELAY_S = 0.02  # delay the ordering probes inject (--ordering-delay)

FillKind = Literal["list", "expr", "generator", "poison", "zeros", "per_rank", "unspecified",
                   "unchanged", "auto", "stale", "final", "same_values"]


# What switching a torch mode on imports the first time: torch.use_deterministic_algorithms
# imports torch._inductor.config, which pulls in dynamo (about 1.5 s of CPU in every rank that
# runs such a case first). A session that collects such a case has the forkserver import it
# once, before any rank is forked (harness.run.forkserver.preload).
TORCH_MODE_IMPORTS: dict[str, tuple[str, ...]] = {
    "deterministic_algorithms": ("torch._inductor.config",),
    "inference_mode": (),
}


@dataclass(frozen=True)
class Fill:
    """How to fill (inputs) or what to expect in (expectations) a tensor on one rank.

    ``list``: nested list in ``data``; ``expr``: an :class:`Expr` over ``i`` in ``data``;
    ``generator``: ``data = (name, params)``; ``per_rank``: ``data`` maps rank (or
    ``"others"``) to a Fill; ``poison``/``zeros``: fixed patterns; ``unspecified``: the
    contract says nothing; ``unchanged``: must equal its pre-op contents; ``auto``: the op's
    reference model; ``stale``/``final`` (expectations of a ``read`` snapshot only): the
    tensor's contents at program start / at program end; ``same_values`` (a program's
    expectations): ``data = (another buffer, Tolerance or None)``, that buffer's final values.
    """

    kind: FillKind
    data: Any = None

    def for_rank(self, rank: int) -> Fill:
        """Resolve a per-rank map down to this rank's fill (``unspecified`` if not given)."""
        if self.kind != "per_rank":
            return self
        table: dict[Any, Fill] = self.data
        if rank in table:
            return table[rank].for_rank(rank)
        if "others" in table:
            return table["others"].for_rank(rank)
        return Fill("unspecified")


@dataclass(frozen=True)
class SparseSpec:
    """How a ``layout: sparse_coo`` buffer is built from its dense fill.

    The fill gives the dense values; the non-zero elements become the stored entries
    (``to_sparse(sparse_dim)``: the first ``sparse_dim`` dims are indexed, the rest are
    dense; None: every dim). ``uncoalesced`` stores each entry twice at the same index (two
    halves of its value), so the backend receives duplicate indices it must sum.
    """

    sparse_dim: int | None = None
    uncoalesced: bool = False


DEFAULT_GUARD = 64  # bytes of guard region on each side of every tensor buffer (``guard:``)
GUARD_ALIGN = 64  # guards are whole multiples of this (the CPU allocator's alignment)


@dataclass(frozen=True)
class TensorSpec:
    """A named buffer of the program, created on every rank before the first step."""

    name: str
    shape: tuple[int | Expr, ...] | None  # None: taken from the explicit values
    dtype: str  # a torch dtype name, or "object" (a Python object/list: object collectives)
    init: Fill
    layout: str = "contiguous"
    # Per-rank shapes where they differ (uneven all_to_all_single, shapes over ``rank``).
    rank_shapes: tuple[tuple[int, ...], ...] | None = None
    # A list buffer whose entries differ in shape (all_gather_v...): per rank, the shape of
    # each entry (None on a rank where the buffer is one plain tensor). Such a buffer is one
    # flat tensor of all entries' elements (``rank_shapes`` gives its length); an op gets
    # views of its consecutive pieces, reshaped.
    entry_shapes: tuple[tuple[tuple[int, ...], ...] | None, ...] | None = None
    sparse: SparseSpec | None = None  # set exactly when layout is "sparse_coo"
    offset: int = 0  # elements before its start in a larger allocation (nccl-tests -u)
    guard: int = DEFAULT_GUARD  # guard bytes asked for on each side (harness.program.guards)

    def guard_bytes(self) -> int:
        """The guard laid on each side: ``guard`` rounded up to :data:`GUARD_ALIGN`, so the
        buffer's start keeps its alignment (an ``offset:`` misalignment stays exact)."""
        return -(-self.guard // GUARD_ALIGN) * GUARD_ALIGN if self.guard > 0 else 0

    def shape_for(self, rank: int) -> tuple[int | Expr, ...] | None:
        """This rank's shape."""
        return self.rank_shapes[rank] if self.rank_shapes is not None else self.shape

    def entries_for(self, rank: int) -> tuple[tuple[int, ...], ...] | None:
        """This rank's entry shapes, or None where the buffer is one plain tensor."""
        return self.entry_shapes[rank] if self.entry_shapes is not None else None


# A list role given as several tensors (``input: [a, b, c]``: one list entry per tensor, of
# any shape and dtype) is stored in Step.bufs as this prefix and the comma-joined names; an
# entry that is itself a list of names (the nested lists of the process-group methods,
# ``output: [[a, b], [c, d]]``) is written ``[a b]``. Tensor names never hold ``,[] ``.
TENSOR_LIST = "list:"

def pack_tensor_list(items: list[str | list[str]]) -> str:
    """The Step.bufs form of a list of tensor names (entries may be lists of names)."""
    return TENSOR_LIST + ",".join(
        "[" + " ".join(item) + "]" if isinstance(item, list) else item for item in items)


def tensor_list(tname: str) -> list[str | list[str]]:
    """The (possibly nested) list of names a packed Step.bufs entry stands for."""
    rest = tname[len(TENSOR_LIST):]
    return [item[1:-1].split() if item.startswith("[") else item
            for item in (rest.split(",") if rest else [])]


def tensor_names(tname: str) -> list[str]:
    """The tensor names a Step.bufs entry stands for (one, or a packed list), flattened."""
    if tname.startswith(TENSOR_LIST):
        return [n for item in tensor_list(tname)
                for n in (item if isinstance(item, list) else [item])]
    return [tname]


@dataclass(frozen=True)
class Step:
    """One step of a rank program.

    ``kind`` is the step's action; each kind's module under :mod:`harness.casefile.stepkinds`
    says how it fills the fields. ``op`` calls ``op`` with ``bufs`` role->tensor name and
    ``args``; ``wait`` waits on ``waits`` handles; ``sleep`` (``value`` seconds on the host),
    ``sync`` (device synchronize); an ordering step (``delay_stream``, ``write``, ``read``,
    ``future``, ``wait_tensor``); a CUDA step (``capture``: ``steps`` recorded into the CUDA
    graph ``handle``; ``replay``: the graph ``waits[0]`` replayed ``value`` times;
    ``wait_stream``: the current stream waits for the side stream; ``block_current_stream``:
    of the work ``waits[0]``); ``new_group``, ``work_state``, ``set_timeout``, ``destroy``;
    the API-contract steps (``drop``: let go of the Works ``waits`` unwaited; ``seq_number``,
    ``work_registry``, ``enable_timing``; the CUDA ``set_device``, ``current_device``,
    ``stream_idle``: ``value``, the number or flag stated, and ``args`` its group);
    or a deliberate fault used to test the harness and to document failure modes: ``raise``
    (message), ``abort``, ``exit`` (code), ``segfault``.
    """

    kind: str
    line: int
    op: str | None = None
    bufs: tuple[tuple[str, str], ...] = ()
    args: tuple[tuple[str, Any], ...] = ()  # values: int/float/str/list or Expr
    ranks: tuple[int, ...] | Expr | None = None  # None: every rank
    async_op: bool = False
    handle: str | None = None
    waits: tuple[str, ...] = ()
    value: Any = None
    stream: str = "current"  # op steps: "side" issues the op on the rank's side CUDA stream
    # op steps: the value the op must return (see Op.returns), per rank: an int, an Expr
    # over rank/world_size/params, or None (not checked); a tuple indexed by rank.
    returns: tuple[Any, ...] | None = None
    # op steps: issue the op this many times in a row (``rep`` = 0..repeat-1 in its src/dst
    # expressions); with ``slices`` repetition ``rep`` works on slice ``rep`` (dim 0) of
    # each of its buffers. Async repetitions stay in flight until the step's handle is waited.
    repeat: int = 1
    slices: bool = False
    # op steps with ``slices``: (name the op step uses, the tensor of each repetition) for a
    # buffer given as a list of names, one per repetition
    per_repetition: tuple[tuple[str, tuple[str, ...]], ...] = ()
    warns: str | None = None  # op steps: a regex a warning of the call must match
    # op/wait/destroy steps: the step must raise an error matching this regex (searched in
    # "ExcType: message"), and the program goes on; ``raises_not_before``: and no earlier
    # than this many seconds after the step was entered (a timeout must not fire early).
    raises: str | None = None
    raises_not_before: float | None = None
    # ``raises: {within: S}``: the error must come no later than S seconds after the step was
    # entered (a survivor must notice a dead peer in bounded time; the record says how long).
    raises_within: float | None = None
    # barrier steps: every rank that runs the step must see it complete (the call's return,
    # or its wait's) no earlier than the last rank entered it (judged across ranks).
    blocks_until_all: bool = False
    steps: tuple[Step, ...] = ()  # capture steps: the steps recorded into the graph
    # op steps: issue the call inside allow_inflight_collective_as_graph_input_ctx(), which
    # registers its Work under its tensors (what a ``wait_tensor`` step looks up); wait
    # steps: wait inside it, where the wait also unregisters the Work
    register_work: bool = False
    # op steps: what the call itself must return: "none" (a synchronous call returns None)
    # or "work" (an async call returns a torch.distributed.Work); None: not checked
    call_returns: str | None = None
    # steps with ``raises``: the error's class, or one of its base classes, has one of these
    # names (empty: any type); the message must still match ``raises``
    raises_types: tuple[str, ...] = ()

    def runs_on(self, rank: int, world_size: int, env: dict[str, Any]) -> bool:
        """Whether the step runs on ``rank`` (its ``ranks:`` list or expression; every rank
        without one). The parent (a program's planned deaths) and the ranks ask alike."""
        if self.ranks is None:
            return True
        if isinstance(self.ranks, Expr):
            return bool(self.ranks({**env, "rank": rank, "world_size": world_size}))
        return rank in self.ranks

    def describe(self) -> str:
        if self.kind == "op":
            return f"{self.op}(" + ", ".join(f"{k}={v}" for k, v in self.bufs) + ")"
        if self.kind in ("wait", "work_state", "drop"):
            return f"{self.kind}(" + ", ".join(self.waits) + ")"
        if self.kind == "capture":
            return f"capture({self.handle}: {len(self.steps)} step(s))"
        if self.kind == "replay":
            return f"replay({self.waits[0]} x{self.value})"
        if self.kind == "block_current_stream":
            return f"block_current_stream({self.waits[0]})"
        if self.kind in ("write", "read", "future"):
            what = ", ".join((*self.waits, *(t for _, t in self.bufs)))
            return f"{self.kind}({what})"
        return f"{self.kind}({self.value!r})" if self.value is not None else self.kind


def flat_steps(steps: tuple[Step, ...]) -> list[Step]:
    """Every step of a program, each ``capture`` step followed by the steps it records."""
    return [s for top in steps for s in (top, *top.steps)]


# What a rank's progress slot holds besides a step index (harness.run.pool reads it): the
# rank is building the instance's buffers, checking its results, or making the case's
# ``group:`` subgroup number ``GROUP_PHASE - value`` of :func:`case_groups` (new_group is
# collective: a backend that never forms the group leaves every rank there).
BUILDING_BUFFERS = -1
CHECKING_RESULTS = -2
GROUP_PHASE = -3


def case_groups(steps: tuple[Step, ...]) -> list[tuple[tuple[int, ...], Any]]:
    """The subgroups a program's ``group:`` lists ask for, in the order every rank makes them:
    (the ranks, the ``group_timeout`` or None). Named groups are made by ``new_group`` steps."""
    out: list[tuple[tuple[int, ...], Any]] = []
    for step in flat_steps(steps):  # a captured op's group must exist before capture
        args = dict(step.args)
        group = args.get("group")
        if group is not None and not isinstance(group, str):
            out.append((tuple(group), args.get("group_timeout")))
    return out


def phase(steps: tuple[Step, ...], value: int) -> str:
    """What a rank whose progress slot holds ``value`` is doing, for a person."""
    if 0 <= value < len(steps):
        return steps[value].describe()
    if value <= GROUP_PHASE:
        groups = case_groups(steps)
        index = GROUP_PHASE - value
        if index < len(groups):
            ranks, timeout = groups[index]
            # new_group orders the members by rank, whatever order the case gives.
            extra = f", group_timeout {timeout}" if timeout is not None else ""
            return f"building group {sorted(ranks)} (new_group{extra})"
        return "building a group"
    return "building buffers" if value == BUILDING_BUFFERS else "checking results"


@dataclass(frozen=True)
class Tolerance:
    """How far a float result may be from its expectation: ``|got - exp| <= atol + rtol *
    |exp|`` or within ``ulp`` units in the last place of ``exp`` (either suffices). ``auto``:
    derived per element from the dtype and the group size (docs/reference/case-format.md)."""

    atol: float = 0.0
    rtol: float = 0.0
    ulp: float = 0.0
    auto: bool = False

    @classmethod
    def parse(cls, raw: Any) -> Tolerance | None:
        """From a case's ``tolerance:`` value (schema-valid): ``auto`` or a mapping."""
        if raw == "auto":
            return cls(auto=True)
        return cls(**raw) if raw else None

    def describe(self) -> str:
        if self.auto:
            return "tolerance auto"
        parts = [f"{k} {v:g}" for k, v in (("atol", self.atol), ("rtol", self.rtol),
                                           ("ulp", self.ulp)) if v]
        return "tolerance " + (", ".join(parts) or "exact")


@dataclass(frozen=True)
class Expectation:
    """What the instance must do: ``pass`` (values match), or fail in a declared way."""

    kind: Literal["pass", "raises", "hangs", "crashes"] = "pass"
    match: str = ""  # regex for ``raises``, searched in "ExcType: message"
    ranks: tuple[int, ...] | None = None  # ranks that must raise (None: every rank)
    # What the ranks not in ``ranks`` may do: finished / raised (a matching error) / blocked.
    others: tuple[str, ...] = ("finished", "raised")
    xfail: str = ""  # non-empty: a known divergence; failing is expected (reason)
    skip: str = ""  # non-empty: skipped with this reason
    reason: str = ""  # why the expectation differs from the contract (from an override)
    # Non-empty: an override changed the expected values or their tolerance (its reason). A
    # pass against them is a declared divergence (a limitation), never "conformant".
    diverges: str = ""
    # The overrides that applied: (line, reason, the keys each patched), for the record.
    applied: tuple[tuple[int, str, tuple[str, ...]], ...] = ()
    # Non-empty: what the instance needs that the backend's manifest declares unsupported
    # ("op reduce", "capability subgroups"): it must be rejected (harness.manifest.apply).
    unsupported: tuple[str, ...] = ()
    # Of ``applied``, the lines of the overrides that apply only through the manifest's
    # ``inherits:`` (the wrapped backend's known behaviours, reported apart from its own).
    inherited: tuple[int, ...] = ()
    # Of ``applied``, the lines of overrides with no backend in their ``when:``: what torch does
    # on every backend (a certificate counts them as shared, not as the backend's own).
    every_backend: tuple[int, ...] = ()


@dataclass(frozen=True)
class Override:
    """A per-backend / per-torch-version change of the expectation, with a reason."""

    when: tuple[tuple[str, tuple[Any, ...]], ...]
    torch: str  # a version specifier, "" for any
    patch: tuple[tuple[str, Any], ...]
    reason: str
    issue: str
    line: int
    nccl: str = ""  # a version specifier of the NCCL torch was built with, "" for any


@dataclass(frozen=True)
class Case:
    """A validated case, before matrix expansion.

    ``raw`` is the schema-valid mapping with file defaults merged in; ``origin`` maps each of
    its top-level keys to the document path it came from (the case itself or ``defaults``),
    so later stages can point errors at the right line.
    """

    file: str  # path as shown to the user (relative to rootdir)
    line: int
    name: str
    description: str
    raw: dict[str, Any]
    origin: dict[str, tuple[str | int, ...]]
    doc: Any  # the harness.casefile.load.Document, for positions

    def error(self, path: tuple[str | int, ...], message: str, hint: str = "") -> CaseFileError:
        """A CaseFileError pointing at ``path`` (a path inside this case's mapping)."""
        base = self.origin.get(str(path[0]), ()) if path else ()
        full = (*base, *path[1:]) if path else base
        err: CaseFileError = self.doc.error(full, message, hint)
        return err


@dataclass(frozen=True)
class OrderingPlan:
    """What the ranks do and the parent judges for one instance's async contract."""

    mode: str  # the case's probe mode: sample / all / none
    sampled: bool  # the representative of its case at this world size and device
    shorthand_async: bool  # an async instance of the ``op:`` form (probes possible)
    async_steps: bool  # the program issues async ops (completion from the timeline)
    declared: bool  # the program has read/future snapshots with expectations
    members: tuple[int, ...]  # ranks that take part in the op
    delayed_rank: int  # the rank made slow in the post-wait and host-blocking probes
    probes: bool = False  # decided at setup from the mode, the option and the expectation
    delay_s: float = DEFAULT_ORDERING_DELAY_S
    known: tuple[tuple[str, str], ...] = ()  # (check, reason): documented divergences


@dataclass(frozen=True)
class PerfPlan:
    """How to time an instance after its correctness check (``--perf``, harness.perf.plan).

    Each rank runs ``warmup`` iterations, then ``repeats`` timed blocks of the same number of
    iterations: at least ``iters`` and enough for ``min_time_s`` per block, estimated from the
    warm-up and agreed between ranks (the maximum), so every rank issues the same collectives.
    ``paired_bare``: also time a plain ``torch.distributed`` loop of the same op on the same
    buffers, its calls alternating with the harness's in each block (the reference of
    ``collective-bench --busbw``; see :func:`harness.program.perf.timed_pair`).
    ``budget_s``: the most the timing may take on top of the correctness run; a loop predicted
    (from the warm-up) to take longer is not run, and the record says ``not_timed`` with why,
    so a timing setting can never turn a passing instance into a hang.
    """

    warmup: int = 5
    iters: int = 20
    min_time_s: float = 0.02
    repeats: int = 5
    max_iters: int = 100_000
    paired_bare: bool = False
    budget_s: float = 20.0
    # --perf-check: checked runs after the timing loop (harness.casefile.numerics.perf_check)
    check: int = 0


@dataclass(frozen=True)
class NumericsPlan:
    """FP64 error bounds, runs and invariances a case requires (docs/howto/numerics.md)."""

    error: tuple[tuple[str, float], ...] = ()
    error_line: int = 0  # where ``error:`` is written (0: not known), for a bound exceeded
    deterministic: int = 1
    iterations: int = 1  # runs in all, each on fresh inputs and fully checked (nccl-tests -c)
    offset_invariant: bool = False
    fusion_invariant: bool = False
    unfused: tuple[Step, ...] = ()  # fusion_invariant: the op's entries issued one by one
    size: int = 0  # size_invariant: the element count of the extra run (0: not asked)
    prefix: int = 0  # size_invariant: the leading elements both runs must agree on
    same_bits: tuple[tuple[str, ...], ...] = ()  # buffers of a program that must match
    # --perf-check N: N runs after the timing loop on its allocations, fresh poison each,
    # fully checked; on fresh inputs where the reference computes the expected values.
    perf_check: int = 0
    perf_fresh: bool = False
    # An extra run of a property (harness.program.reruns): digest every buffer, as run 1 does.
    rerun: bool = False

    def compares_runs(self) -> bool:
        """Whether the bits of this run are compared with another run's, so every buffer
        (expected or not) needs a digest."""
        return (self.deterministic > 1 or self.iterations > 1 or self.offset_invariant
                or self.fusion_invariant or self.prefix > 0 or self.rerun
                or self.perf_check > 0)


@dataclass(frozen=True)
class Instance:
    """One concrete test: a case at one point of its matrix."""

    file: str
    line: int
    case: str
    id: str  # the bracket part of the test id: gloo-ws2-float32-sum-sync
    description: str
    backend: str
    device: str  # "cpu" or "cuda"
    world_size: int
    dtype: str
    op: str  # the main op (first op step), for reports
    family: str
    reduce_op: str | None
    async_op: bool
    params: tuple[tuple[str, Any], ...]
    axes: tuple[tuple[str, Any], ...]  # every axis value, for reports and baselines
    tensors: tuple[TensorSpec, ...]
    steps: tuple[Step, ...]
    expected: tuple[tuple[str, Fill], ...]
    shorthand: tuple[str, str] | None  # (in tensor, out tensor) when ``expected: auto`` applies
    tolerance: Tolerance | None
    expectation: Expectation
    overrides: tuple[Override, ...]
    deadline: float | None
    isolate: bool
    marks: tuple[str, ...]
    premul_factor: float = 2.0
    premul_tensor: bool = False  # pass the PREMUL_SUM factor as a 1-element tensor
    # Set in every rank before its process group starts (part of the pool key).
    env: tuple[tuple[str, str], ...] = ()
    pg_timeout: float | None = None  # seconds; None: the session's --pg-timeout default
    # Global torch modes the rank program runs under: "inference_mode" (torch.inference_mode)
    # and "deterministic_algorithms" (torch.use_deterministic_algorithms(True)).
    torch_modes: tuple[str, ...] = ()
    # Start its pool with the default group bound to each rank's GPU
    # (init_process_group(device_id=...)): split_group refuses an unbound default group.
    bind_device: bool = False
    ordering: OrderingPlan | None = None  # async-contract checks (harness.ordering.plan)
    perf: PerfPlan | None = None  # time it after the checks (--perf; harness.perf.plan)
    numerics: NumericsPlan | None = None  # properties and error bounds (harness.verdict.numerics)
    # Program buffers an op writes that nothing compares: (name, the case's reason from
    # ``unchecked:``, "" where it gives none). The record reports them (harness.casefile.coverage).
    unchecked: tuple[tuple[str, str], ...] = ()
    # Per buffer, the YAML line a value failure points at: its ``expected:`` entry, else the
    # ``input:`` it is derived from (``expected: auto``), else its declaration.
    value_lines: tuple[tuple[str, int], ...] = ()
    # (op, family) of every distinct op a program issues, in first-issue order, when there are
    # several: the reports file the instance under each of them, not its first op only.
    issued: tuple[tuple[str, str], ...] = ()
    # What it uses of the backend ("op reduce", "capability subgroups"), set where a capability
    # manifest is applied (harness.manifest): the certificate files the record by them.
    needs: tuple[str, ...] = ()
    # Planned deaths of a program through a failure (harness.casefile.deaths): (rank, step,
    # how); the survivors' program goes on and is judged, the dead are accounted as planned.
    deaths: tuple[tuple[int, int, str], ...] = ()

    @property
    def case_id(self) -> str:
        return f"{self.file}::{self.case}"

    @property
    def key(self) -> str:
        """Stable identity for baselines: case id plus axes, independent of pytest."""
        return f"{self.case_id}[{self.id}]"

    def where(self, line: int | None = None) -> str:
        """``file:line: case[id]``, the label every message about this instance starts with
        (``line``: a step's or a buffer's line instead of the case's)."""
        return f"{self.file}:{line or self.line}: {self.case}[{self.id}]"

    def group_size(self, world_size: int | None = None) -> int:
        """How many ranks the first step's collective spans: its ``group`` if it names one,
        else the world (``world_size``, by default the instance's)."""
        group = dict(self.steps[0].args).get("group") if self.steps else None
        return len(group) if group else (self.world_size if world_size is None else world_size)


# ``limitation``: the instance raised, crashed or hung exactly as the case or an override
# declares for this backend. It is not ``passed``: "passed" means the backend did what the
# contract says.
Outcome = Literal["passed", "failed", "error", "hang", "crash", "skipped", "xfail", "xpass",
                  "limitation", "uncheckable"]  # uncheckable: verdict.numerics
# Reductions whose result in floats depends on the order of the operations (rounding).
ORDER_SENSITIVE = ("sum", "avg", "premul_sum", "product")
# Every outcome, in the order reports list them.
OUTCOMES: tuple[str, ...] = ("passed", "failed", "error", "hang", "crash", "skipped", "xfail",
                             "xpass", "limitation", "uncheckable")
# The backend did not do what the case says: each one fails a session, a gate and a mutant.
BAD_OUTCOMES: tuple[str, ...] = ("failed", "error", "hang", "crash")
# What nobody declared: the bad outcomes, and a known divergence that went away.
UNEXPECTED_OUTCOMES: tuple[str, ...] = (*BAD_OUTCOMES, "xpass")


@dataclass
class StepEvent:
    """Timeline of one step on one rank (seconds since the instance started on that rank).

    For an async op: when the call was entered and returned, ``is_completed()`` at return,
    when ``wait()`` returned (and from which thread), ``is_completed()`` after it, and on CUDA
    when the final device synchronize returned and ``is_completed()`` after that, plus the
    device and stream the op was issued on. For a point-to-point op whose ``is_completed()``
    was True at return, ``at_return_in_place`` says whether the buffers it receives into
    already held what they held when ``wait()`` returned (None: not observed, e.g. another
    step wrote the buffer in between).
    """

    index: int
    what: str
    t_enter: float
    t_return: float
    completed_at_return: bool | None = None
    t_wait_return: float | None = None
    completed_after_wait: bool | None = None
    waited_in_thread: bool | None = None
    t_sync_return: float | None = None
    completed_after_sync: bool | None = None
    device: str | None = None
    stream: str | None = None
    at_return_in_place: bool | None = None


@dataclass
class TensorCheck:
    """Comparison of one tensor on one rank with its expectation."""

    tensor: str
    ok: bool
    expectation: str  # "explicit", "auto", "unchanged", ...
    wrong: int = 0
    total: int = 0
    first_wrong: list[tuple[int, str, str]] = field(default_factory=list)  # (index, exp, got)
    digest: str = ""  # sha256 of the bytes, for cross-rank agreement
    note: str = ""
    error: dict[str, float] = field(default_factory=dict)  # vs FP64 (harness.program.fp64)
    inexact: str = ""  # why the expected value itself is inexact
    beyond_order: int = 0  # elements outside what any summation order gives (program.fp64)
    # An inexact sum judged by the case's error: bound (program.fp64.order_range): the metrics
    # of the exact result rounded once (the least any result has) and of the worst order.
    rounded_error: dict[str, float] = field(default_factory=dict)
    order_error: dict[str, float] = field(default_factory=dict)
    prefix_digest: str = ""  # size_invariant: digest of the leading elements (NumericsPlan.prefix)


@dataclass
class RankResult:
    """What one rank reports back for one instance."""

    rank: int
    status: Literal["ok", "raised", "not_run"]
    checks: list[TensorCheck] = field(default_factory=list)
    events: list[StepEvent] = field(default_factory=list)
    exc_type: str = ""
    exc_message: str = ""
    traceback: str = ""
    step: int = -1  # index of the step that raised
    duration: float = 0.0
    ordering: dict[str, Any] = field(default_factory=dict)  # probe observations, reads
    perf: dict[str, Any] = field(default_factory=dict)  # raw timings (harness.program.perf)
    in_flight: int = 0  # async work handles left unwaited when the rank raised
    # Cross-rank timing observations (``blocks_until_all``): the host's identity and, per
    # step index, CLOCK_MONOTONIC seconds at entry and at completion (harness.program.lifecycle).
    timing: dict[str, Any] = field(default_factory=dict)
    # Steps that declare ``raises:``: what each raised (or that it did not), for the parent.
    step_errors: list[dict[str, Any]] = field(default_factory=list)
    reruns: list[dict[str, Any]] = field(default_factory=list)  # program.reruns
    # Where this rank's time went besides the program itself (seconds): ``probes`` (ordering
    # probes), ``perf`` (the timing loop), ``sleep`` (the case's own sleep steps).
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class RankState:
    """The parent's view of a rank that did not report (hang, crash, fail-fast)."""

    rank: int
    state: Literal["finished", "raised", "blocked", "died", "killed"]
    step: int = -1
    step_desc: str = ""
    stack: str = ""
    exitcode: int | None = None
    signal: str = ""
    stderr_tail: str = ""
    flight_recorder: list[str] = field(default_factory=list)


@dataclass
class InstanceResult:
    """The verdict for one instance: outcome, a human message and per-rank detail."""

    outcome: Outcome
    message: str
    ranks: list[RankResult] = field(default_factory=list)
    states: list[RankState] = field(default_factory=list)
    duration: float = 0.0
    pool_replaced: bool = False
    # Why the pool was not kept for the next instance (harness.run.pool's settle: a failed
    # health check names what failed), or "".
    pool_replaced_why: str = ""
    # Run on its own pool ahead of its turn (isolated instances: harness.plugin.ahead).
    ran_ahead: bool = False
    # A failure run again on fresh ranks because an earlier instance failed or raised on the
    # same ones (harness.runner.execute): ``after`` (that instance's key), ``fresh`` (the
    # outcome on fresh ranks) and ``state_carried`` (it passed there).
    fresh_rerun: dict[str, Any] = field(default_factory=dict)
    expected_kind: str = "pass"
    reason: str = ""
    ordering: dict[str, Any] = field(default_factory=dict)  # async-contract verdicts
    perf: dict[str, Any] = field(default_factory=dict)  # bandwidth of a passed instance
    # Set when the harness itself failed on this instance (type, message, traceback): the
    # record is an ``error`` that says so, never a verdict on the backend.
    harness_error: dict[str, str] = field(default_factory=dict)
    # Overrides of the case that matched this instance except for their torch-version or
    # backend scope (line, scope, reason): the report header lists them.
    overrides_not_applied: list[dict[str, Any]] = field(default_factory=list)
    # Where the parent's time for this instance went (seconds; see harness.report.costs).
    phases: dict[str, float] = field(default_factory=dict)
    numerics: dict[str, Any] = field(default_factory=dict)  # harness.verdict.numerics
    # What the verdict compared (harness.verdict.evidence): empty, it can never be "passed".
    evidence: dict[str, Any] = field(default_factory=dict)
    # A program through a failure: its planned deaths as observed, and each survivor's
    # expected errors with how soon they came (harness.verdict.deaths).
    deaths: dict[str, Any] = field(default_factory=dict)


@dataclass
class PoolRun:
    """Raw outcome of running one instance on a pool (the verdict stage interprets it)."""

    kind: Literal["done", "hang", "crash", "failfast"]
    results: dict[int, RankResult] = field(default_factory=dict)
    states: list[RankState] = field(default_factory=list)
    elapsed: float = 0.0
    # failfast: the wait ended before the grace because every rank still running was proven
    # stranded (harness.run.stranded), not because the grace ran out.
    stranded: bool = False
    # Ranks that stayed in a step past its ``raises: {within: S}`` bound (harness.run.overdue):
    # (rank, step, seconds seen in it); the wait ended there.
    overdue: list[tuple[int, int, float]] = field(default_factory=list)
