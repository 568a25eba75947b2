"""Recovery steps through a failure beyond ``reform``: ``shrink`` where torch has
``shrink_group`` (a clean skip where it does not, and the Gloo override's torch scope), a group
of the survivors made by ``new_group`` or ``split_group``, and ``abort_group`` before
re-forming; what cannot be written is an error at its line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.casefile.overrides import not_applied, override_applies, resolve
from harness.manifest import needs
from harness.model import Instance
from tests.helpers import case_error, case_instances, load_report, run_pytest, write_case_file
from tests.test_fault_tolerance import HEAD as FT_HEAD

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


HEAD = FT_HEAD + """    steps:
      - {kill: true, ranks: [1]}
      - {op: all_reduce, tensor: t, raises: {match: "[Rr]eset|[Cc]losed|[Pp]eer", within: 10}}
"""
TAIL = "    unchecked: {t: a failed all_reduce}\n    expected: {u: 4}\n"


@pytest.mark.parametrize("steps, where, words", [
    ("      - {new_group: g, members: [0, 1]}\n", "x.yaml:12:33",
     "the group names rank 1, dead since step 0 (kill)"),
    ("      - {new_group: g, members: [\"(rank + 1) % 3\"]}\n", "x.yaml:12:33",
     "the group names rank 1, dead since step 0"),
    ("      - {new_group: g, split: [[0, 2], [1]]}\n", "x.yaml:12:31", "names rank 1"),
    ("      - {new_group: g, subgroups: 3}\n", "x.yaml:12:35", "names rank 1"),
    ("      - {op: all_reduce, tensor: u, group: [0, 1]}\n", "x.yaml:12:44",
     "the group names rank 1, dead since step 0"),
    ("      - {abort_group: 1}\n", "x.yaml:12:23", "True was expected"),
    ("      - {abort_group: true, tensor: u}\n", "x.yaml:12:37",
     "does not apply to an abort_group step"),
])
def test_a_recovery_group_that_names_a_dead_rank_is_an_error_at_its_line(
        steps: str, where: str, words: str) -> None:
    err = case_error(HEAD + steps + TAIL)
    assert f"cases/{where}" in err and words in err, err


def test_a_group_of_the_survivors_and_an_abort_are_accepted_as_recovery() -> None:
    (inst,) = case_instances(HEAD + """      - {abort_group: true, group: [0, 2]}
      - {op: all_reduce, tensor: t, group: [0, 1], raises: {match: x, within: 10}}
      - {new_group: g, members: [0, 2], use_local_synchronization: true}
      - {op: all_reduce, tensor: u, group: g}
""" + TAIL)
    assert inst.deaths == ((1, 0, "kill"),) and inst.isolate
    assert ("capability", "lifecycle") in needs.of(inst)
    # A death with only an abort after it is still planned: the survivors are judged.
    (alone,) = case_instances(HEAD.replace(
        "      - {op: all_reduce, tensor: t, raises: {match: \"[Rr]eset|[Cc]losed|[Pp]eer\","
        " within: 10}}\n", "") + "      - {abort_group: true}\n"
        "    expected: {}\n")
    assert alone.deaths == ((1, 0, "kill"),)


def test_abort_group_skips_where_torch_cannot_abort_a_group() -> None:
    import torch.distributed as dist

    from harness.run.capabilities import Capabilities

    (inst,) = case_instances(HEAD + "      - {abort_group: true}\n" + TAIL)
    real = Capabilities.of_modules("x", 0, dist, SimpleNamespace(float32=1))
    assert real.skip_reason(inst) == ""
    assert "aborts the default process group" in real.skip_reason(inst, local_rank=0)
    old = SimpleNamespace(ProcessGroup=object, is_backend_available=lambda b: True,
                          all_reduce=dist.all_reduce)
    caps = Capabilities.of_modules("2.0", 0, old, SimpleNamespace(float32=1))
    assert caps.skip_reason(inst) == ("torch 2.0 has no distributed_c10d._abort_process_group "
                                      "(the abort_group step)")


def test_survivors_abort_regroup_and_compute(tmp_path: Path) -> None:
    write_case_file(tmp_path, """
defaults:
  deadline: 40
  world_size: 3
  # Rank 0 only sends to rank 1 in Gloo's ring: now and then it learns of the death only at
  # the group's timeout (docs/reference/programs.md), which must come within the bound.
  pg_timeout: 5
  tensors:
    t: {shape: [4], init: "rank + 1"}
    u: {shape: [4], init: "rank * 10 + i"}
    g: {shape: [8], init: poison}
  unchecked: {t: a failed all_reduce}
cases:
  - name: abort_then_reform
    steps:
      - {exit: 3, ranks: [1]}
      - {op: all_reduce, tensor: t,
         raises: {match: "[Rr]eset|[Cc]losed|[Pp]eer|[Tt]imed out", within: 10}}
      - {abort_group: true}
      - {op: all_reduce, tensor: t, raises: "not been initialized"}
      - {reform: survivors}
      - {op: all_reduce, tensor: u}
    expected: {u: "20 + 2 * i", g: unchanged}
  - name: new_group_of_survivors
    steps:
      - {kill: true, ranks: [1]}
      - {op: all_reduce, tensor: t,
         raises: {match: "[Rr]eset|[Cc]losed|[Pp]eer|[Tt]imed out", within: 10}}
      - {new_group: alive, members: [0, 2]}
      - {op: all_gather_into_tensor, input: u, output: g, group: alive}
      - {abort_group: true, group: alive}
    expected: {g: "(i // 4) * 20 + i % 4", u: unchanged}
""")
    proc = run_pytest(tmp_path, "c.yaml", "-q")
    recs = {r["case"]: r for r in load_report(tmp_path / "reports" /
                                                "conformance.json")["records"]}
    assert recs["abort_then_reform"]["outcome"] == "passed", proc.stdout
    assert recs["new_group_of_survivors"]["outcome"] == "passed", proc.stdout
    for rec in recs.values():
        assert [s["rank"] for s in rec["survivors"]] == [0, 2]
    # The abort ended the world: the next call there raised; reform made a new one.
    assert {"what": "error of step 3 (all_reduce(tensor=t))", "how": "raises",
            "ranks": [0, 2], "elements": 2} in recs["abort_then_reform"]["evidence"]["checks"]
    checks = recs["new_group_of_survivors"]["evidence"]["checks"]
    assert {"what": "g", "how": "expr", "ranks": [0, 2], "elements": 16} in checks
    assert {"what": "group 'alive' (step 2)", "how": "explicit", "ranks": [0, 2],
            "elements": 2} in checks


RING = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor")


def test_each_bundled_bound_on_a_ring_survivor_holds_at_gloo_s_group_timeout() -> None:
    # Gloo's ring: a survivor that only sends to the dead rank may learn of the death only at
    # the group's timeout (docs/reference/programs.md, measured). A bundled case that bounds
    # such an error must set a group timeout within its bound, or it fails now and then.
    doc = yamlload.load_text(LIBRARY.read_text(), "cases/fault_tolerance.yaml")
    bounded = 0
    for case in validate.load_cases(doc):
        for inst in expand.expand(case, "gloo"):
            # A stalled rank closes nothing: its survivors learn only by a timeout anyway.
            if inst.world_size < 3 or all(how == "stall" for _, _, how in inst.deaths):
                continue
            first = min(i for _, i, how in inst.deaths if how != "stall")
            # The survivors' first bounded call after the death is the one that meets it.
            step = next((s for s in inst.steps[first:]
                         if s.kind == "op" and s.raises_within is not None), None)
            if step is not None and step.raises_within is not None and step.op in RING:
                bounded += 1
                assert inst.pg_timeout is not None, f"{case.name}: no pg_timeout"
                assert inst.pg_timeout < step.raises_within, case.name
    assert bounded >= 10
