"""A manifest applied to one instance: claimed, or unsupported as declared.

An instance whose needs (:mod:`.needs`) are all claimed runs against its case's contract,
unchanged. One that needs anything the manifest declares unsupported must be *rejected*: torch
documents an error for an op a backend does not implement (``RuntimeError``/``ValueError``/
``NotImplementedError`` from the call or its ``wait()``), never a hang or a silent value. Its
expectation becomes "every rank raises" (any exception: the manifest states that the backend
lacks it, not how it says so; every rank that calls the backend: a rank outside an op's
``group:`` list never does), with the declaration as its reason, so the verdict is a
``limitation`` whose record says ``unsupported`` (never a pass, never a failure); a backend that
hangs on it, crashes, or computes something instead of refusing fails, and the message says a
declared-unsupported call was not rejected. A ``skip`` the case or an override decided stays.
"""

from __future__ import annotations

from dataclasses import replace

from ..model import Expectation, Instance
from . import needs
from .load import Manifest

ALIASES = {"op": "ops", "dtype": "dtypes", "reduce_op": "reduce_ops"}


def unsupported(inst: Instance, manifest: Manifest) -> list[str]:
    """The needs of ``inst`` the manifest declares unsupported, as "op reduce" etc."""
    from .. import ops  # the op table (no torch)
    out: list[str] = []
    for category, item in needs.of(inst):
        if category == "device":
            if item not in manifest.devices:
                out.append(f"device {item}")
        elif category == "capability":
            if item in manifest.unsupported:
                out.append(f"capability {item}")
        else:
            claimed = getattr(manifest, ALIASES[category])
            if claimed is None or item in claimed:
                continue
            family = ops.ALL_OPS[item].family if item in ops.ALL_OPS else ""
            # A family claims its ops, unless its name is an op's too ("all_gather" is the
            # list op, not all_gather_into_tensor): then the name means that op only.
            if category == "op" and family in claimed and family not in ops.ALL_OPS:
                continue
            out.append(f"{category} {item}")
    return out


def apply(inst: Instance, manifest: Manifest) -> Instance:
    """``inst`` as the manifest makes it: unchanged when every need is claimed; otherwise
    required to be rejected on every rank, its expectation saying which declaration why."""
    inst = replace(inst, needs=tuple(f"{c} {i}" for c, i in needs.of(inst)))
    missing = unsupported(inst, manifest)
    if not missing or inst.expectation.skip:
        return inst
    why = "; ".join(_said(m, manifest) for m in missing)
    callers = _callers(inst)
    exp = Expectation(kind="raises", match="",
                      ranks=None if len(callers) == inst.world_size else callers,
                      others=("finished", "raised"),
                      reason=f"declared unsupported by the manifest: {why}",
                      unsupported=tuple(missing))
    return replace(inst, expectation=exp)


def _callers(inst: Instance) -> tuple[int, ...]:
    """The ranks that call the backend: torch returns at once on a rank outside an op's
    ``group:`` list (it never reaches the backend, so it cannot reject anything), and a step
    limited by ``ranks:`` runs on those only. Every rank where that cannot be told here."""
    out: set[int] = set()
    for step in inst.steps:
        if step.kind != "op":
            continue
        runs = set(step.ranks) if isinstance(step.ranks, tuple) else set(
            range(inst.world_size))
        group = dict(step.args).get("group")
        if isinstance(group, tuple | list):
            runs &= {int(r) for r in group}
        out |= runs
    return tuple(sorted(out)) or tuple(range(inst.world_size))


def _said(item: str, manifest: Manifest) -> str:
    reason = manifest.reason(item.split(" ", 1)[1])
    return f"{item} ({reason})" if reason else item
