"""What every step kind provides (:class:`StepKind`) and the contexts its hooks are given.

``StepKind`` is an abstract base class rather than a :class:`typing.Protocol`: most kinds use
only some of the hooks (a ``sleep`` step has nothing to check; only ``new_group`` and the CUDA
steps have rules that span the program), so the base gives every hook but ``build`` a default
that reports nothing, and a kind states only what it knows. Subclassing also lets the
registry's test check that each entry is a kind.

Runs in the pytest process: no torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ...errors import CaseFileError
from ...expr import Expr
from ...model import Case, Step
from ..evaluate import CaseEval

Path = tuple[Any, ...]
RawStep = dict[str, Any]
Ranks = tuple[int, ...] | Expr | None
# Where a kind's own problems are found among the checks every step gets (see
# harness.casefile.programcheck.COMMON_CHECKS): right after the check of which keys apply to
# which kinds, after the outcome keys (raises, timeouts, returns, warns, work_state keys), or
# last, after repeat and ranks. Problems are listed by file position, and those at one position
# (a YAML alias puts one value under several keys) in the order they were found: each kind
# keeps the place its problems always had there.
Stage = Literal["keys", "outcome", "last"]
STAGES: tuple[Stage, ...] = ("keys", "outcome", "last")


@dataclass(frozen=True)
class CheckContext:
    """What a kind's checks may consult: the case, its declared buffers, the handles of the op
    steps before this one (an op step adds its own), and every action of the format."""

    case: Case
    tensors: dict[str, Any]
    object_tensors: frozenset[str]
    handles: set[str]
    actions: tuple[str, ...]


@dataclass(frozen=True)
class BuildContext:
    """What a kind needs to build one validated step at one point of the case's matrix: the
    case's evaluator, the point and its expression environment, where the step is (``path``,
    its ``line``), the ranks that run it (computed for every kind alike), the names its
    expressions may use, and ``inner``, which builds a nested step (a capture's) through the
    registry."""

    builder: CaseEval
    point: dict[str, Any]
    env: dict[str, Any]
    path: Path
    line: int
    ranks: Ranks
    names: tuple[str, ...]
    inner: Callable[[RawStep, Path], Step]

    @property
    def case(self) -> Case:
        """The case the step belongs to."""
        return self.builder.case


class StepKind(ABC):
    """One kind of program step: the actions it owns, its checks, and how it is built."""

    actions: ClassVar[tuple[str, ...]]
    check_after: ClassVar[Stage] = "last"

    def check_program(self, ctx: CheckContext) -> list[CaseFileError]:
        """Problems of rules that span the program (names made before they are used, say);
        run once per program, before any step's own checks."""
        return []

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """Problems of one step of this kind (``action``: which of the kind's actions)."""
        return []

    @abstractmethod
    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The :class:`~harness.model.Step` of one validated step of this kind."""


def value_step(step: RawStep, action: str, ctx: BuildContext) -> Step:
    """A step whose action's value is all it carries (seconds, a message, an exit code)."""
    return Step(action, ctx.line, ranks=ctx.ranks, value=step[action])
