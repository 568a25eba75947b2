"""What is already known: the overrides of a case library, applied to generated instances.

Every override of the bundled library (``cases/``) and of the files given with ``--known``
is kept with the op of its case. A generated instance that comes out bad (wrong values, an
unexpected raise, a hang, a crash) is judged again, on the same run, under each override of
its op whose ``when:`` conditions all hold for the instance (and whose backend / torch scope
applies here); if one turns the verdict into a declared outcome (``limitation``, ``xfail``)
or a pass, the instance is *absorbed* by that override: a known behaviour, not a finding.

An override that names no axis but the backend (a case-specific patch) absorbs only a
pattern-checked outcome (``raises``, ``hangs``, ``crashes``), never a wrong value, so a
backend-wide ``xfail`` of one case cannot hide a new bug of the whole op.

A library case may name an argument by an expression of the world size (``dst:
world_size - 1``) where a generated instance has the number: the shared override matcher
(:func:`harness.casefile.overrides.override_applies`) evaluates such ``when:`` values at the
instance's world size.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from ..casefile import collect, overrides
from ..errors import CaseFileError, CaseFileErrors
from ..model import Instance, Override, PoolRun
from ..run.capabilities import Capabilities
from ..runner.execute import Runner

SCOPE_KEYS = ("backend", "device")
CHECKED_PATCHES = ("raises", "hangs", "crashes")
ABSORBING = ("limitation", "xfail", "passed")


@dataclass(frozen=True)
class KnownOverride:
    """One override of a library case, with where it is written."""

    op: str
    where: str  # file:line
    override: Override


def library_files(paths: list[str]) -> list[Path]:
    """The case files under ``paths`` (files or folders), sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.yaml")) if p.is_dir() else [p]
    return out


def load_library(paths: list[str]) -> tuple[list[KnownOverride], list[str]]:
    """Every override of the case files under ``paths``, and the files that did not load."""
    known: list[KnownOverride] = []
    broken: list[str] = []
    for path in library_files(paths):
        try:
            cases = collect.cases_of_file(str(path))
        except (CaseFileError, CaseFileErrors, OSError, ValueError) as exc:
            broken.append(f"{path}: {str(exc).splitlines()[0][:200]}")
            continue
        for case in cases:
            op = str(case.raw.get("op", ""))
            if not op and case.raw.get("steps"):
                first = next((s for s in case.raw["steps"] if isinstance(s, dict) and "op" in s),
                             None)
                op = str(first["op"]) if first else ""
            try:
                built = overrides.build(case)
            except (CaseFileError, ValueError):
                continue
            known += [KnownOverride(op, f"{path}:{o.line}", o) for o in built]
    return known, broken


class KnownLibrary:
    """The overrides by op, and how many generated instances each one absorbed."""

    def __init__(self, known: list[KnownOverride], alias: str | None = None) -> None:
        self.alias = alias  # overrides written for this backend apply too (a wrapper of it)
        self.by_op: dict[str, list[KnownOverride]] = {}
        for k in known:
            self.by_op.setdefault(k.op, []).append(k)
        self.absorbed: Counter[str] = Counter()
        self.reasons: dict[str, str] = {}

    def __len__(self) -> int:
        return sum(map(len, self.by_op.values()))

    def candidates(self, inst: Instance, caps: Capabilities) -> list[KnownOverride]:
        """The overrides of ``inst``'s op that apply to it here."""
        axes = {k for k, _ in inst.axes} | set(SCOPE_KEYS)
        if self.alias:
            inst = replace(inst, backend=self.alias)
        out = []
        for k in self.by_op.get(inst.op, []):
            o = k.override
            keys = {key for key, _ in o.when}
            if not keys <= axes:
                continue  # about an axis this instance does not have
            patch = {key for key, _ in o.patch}
            if not (keys - set(SCOPE_KEYS)) and not patch & set(CHECKED_PATCHES):
                continue
            if overrides.override_applies(o, inst, caps.torch_version, caps.nccl_version):
                out.append(k)
        return out

    def absorbs(self, inst: Instance, run: PoolRun, deadline: float, runner: Runner) -> str:
        """The override (file:line) that explains this bad run, or "" (judged again on the
        same run by the runner's verdict, under each candidate override)."""
        caps = runner.caps
        for k in self.candidates(inst, caps):
            patched = replace(inst, overrides=(k.override,),
                              backend=self.alias or inst.backend)
            patched = overrides.resolve(patched, caps.torch_version, caps.nccl_version)
            if runner.verdict(patched, run, deadline).outcome in ABSORBING:
                self.absorbed[k.where] += 1
                self.reasons[k.where] = k.override.reason
                return k.where
        return ""
