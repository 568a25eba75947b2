"""Recovery steps through a failure beyond ``reform``: ``shrink`` where torch has
``shrink_group`` (a clean skip where it does not, and the Gloo override's torch scope), a group
of the survivors made by ``new_group`` or ``split_group``, and ``abort_group`` before
re-forming; what cannot be written is an error at its line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.casefile.overrides import not_applied, override_applies, resolve
from harness.model import Instance

LIBRARY = Path(__file__).resolve().parent.parent / "cases" / "fault_tolerance.yaml"


def library(name: str, backend: str = "gloo") -> list[Instance]:
    """The instances of the bundled fault-tolerance case ``name`` on ``backend``."""
    doc = yamlload.load_text(LIBRARY.read_text(), "cases/fault_tolerance.yaml")
    return [i for c in validate.load_cases(doc) if c.name == name
            for i in expand.expand(c, backend)]


def test_shrink_skips_cleanly_where_torch_has_no_shrink_group() -> None:
    import torch.distributed as dist

    from harness.run.capabilities import Capabilities

    (inst,) = library("shrink_after_death")
    real = Capabilities.of_modules("x", 0, dist, SimpleNamespace(float32=1))
    assert real.skip_reason(inst) == ("" if hasattr(dist, "shrink_group") else
                                      "torch x has no shrink_group (the shrink step)")
    old = SimpleNamespace(ProcessGroup=object, is_backend_available=lambda b: True,
                          all_reduce=dist.all_reduce)
    caps = Capabilities.of_modules("2.4.1", 0, old, SimpleNamespace(float32=1))
    assert caps.skip_reason(inst) == "torch 2.4.1 has no shrink_group (the shrink step)"


def test_the_gloo_shrink_override_is_scoped_to_the_torch_it_was_seen_on() -> None:
    (inst,) = library("shrink_after_death")
    (o,) = inst.overrides
    assert o.torch == ">=2.13"
    assert resolve(inst, "2.13.0+cpu").expectation.kind == "raises"
    older = resolve(inst, "2.12.0")
    assert older.expectation.kind != "raises"
    (miss,) = not_applied(inst, "2.12.0")
    assert miss["scope"] == "torch" and miss["when"] == "torch >=2.13"


def test_the_gloo_shrink_override_reaches_a_wrapper_only_through_inherits() -> None:
    # The faithful mutant is Gloo behind a Python ProcessGroup: Gloo's overrides reach it when
    # a manifest says it inherits gloo, as for torchft-gloo; collective-mutate passes none.
    (inst,) = library("shrink_after_death", backend="mutant")
    (o,) = inst.overrides
    assert not override_applies(o, inst, "2.13.0")
    assert override_applies(o, inst, "2.13.0", inherits="gloo")
    assert not override_applies(o, inst, "2.12.0", inherits="gloo")
