"""What an instance uses of a backend, in the manifest's vocabulary.

Each need is ``(category, item)``: ``("op", "reduce")``, ``("dtype", "bfloat16")``,
``("reduce_op", "band")``, ``("capability", "subgroups")``, ``("device", "cuda")``. The
certificate files an instance's record under them, and :mod:`.apply` compares them with what
a manifest claims. Read from the instance alone (its steps, buffers and axes), so the same
instance has the same needs wherever it runs.
"""

from __future__ import annotations

from ..model import Instance, Step

Need = tuple[str, str]
BITWISE = ("band", "bor", "bxor")
# Step kinds that use a capability of their own (the op steps are read apart).
STEP_NEEDS: dict[str, str] = {"capture": "cuda_graphs", "replay": "cuda_graphs",
                              "set_timeout": "timeouts", "destroy": "lifecycle",
                              "abort_group": "lifecycle",
                              "seq_number": "sequence_numbers", "enable_timing": "timing"}
# work_state keys that read a capability of the Work.
STATE_NEEDS: dict[str, str] = {"sequence_number": "sequence_numbers", "duration": "timing"}
GATHER_SINGLE = ("gather_single", "gather_into_tensor")


def of(inst: Instance) -> tuple[Need, ...]:
    """Every need of ``inst``, each once, in a stable order."""
    out: dict[Need, None] = {}
    issued = inst.issued or ((inst.op, inst.family),)
    steps = list(_walk(inst.steps))
    for step in steps:
        if step.kind == "op" and step.op is not None:
            issued = (*issued, (step.op, _family(step.op, inst)))
    for op, family in issued:
        if op == "steps":  # a program that issues no op (a new_group alone)
            continue
        out[("op", op)] = None
        if op in GATHER_SINGLE:
            out[("capability", "gather_single")] = None
        if family == "coalesced":
            out[("capability", "coalescing")] = None
    names = {t.dtype for t in inst.tensors} | {inst.dtype}
    for name in sorted(names - {"object", ""}):
        out[("dtype", name)] = None
        if name.startswith("complex"):
            out[("capability", "complex")] = None
        if name.startswith("float8"):
            out[("capability", "float8")] = None
    reduce_ops = {inst.reduce_op} | {str(dict(s.args)["reduce_op"]) for s in steps
                                     if "reduce_op" in dict(s.args)}
    for name in sorted(r for r in reduce_ops if r):
        out[("reduce_op", name)] = None
        if name in BITWISE:
            out[("capability", "bitwise_reductions")] = None
    if inst.async_op or any(s.async_op for s in steps):
        out[("capability", "async")] = None
    if any(t.layout == "sparse_coo" for t in inst.tensors):
        out[("capability", "sparse")] = None
    for step in steps:
        if step.kind == "new_group":
            how = dict(step.args).get("how", "")
            out[("capability", "split" if how == "split" else "subgroups")] = None
        elif step.kind in STEP_NEEDS:
            out[("capability", STEP_NEEDS[step.kind])] = None
        elif step.kind == "work_state":
            for key in dict(step.args):
                if key in STATE_NEEDS:
                    out[("capability", STATE_NEEDS[key])] = None
        if step.kind == "op" and dict(step.args).get("group") is not None:
            out[("capability", "subgroups")] = None
    out[("device", inst.device)] = None
    return tuple(out)


def _walk(steps: tuple[Step, ...]) -> list[Step]:
    """The steps, a capture's own steps included."""
    out: list[Step] = []
    for s in steps:
        out.append(s)
        out.extend(_walk(s.steps))
    return out


def _family(op: str, inst: Instance) -> str:
    from .. import ops  # the op table: no torch, loaded with the package
    return ops.ALL_OPS[op].family if op in ops.ALL_OPS else inst.family
