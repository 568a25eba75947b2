"""Numerics (issue 29): FP64-reference error, uncheckable expectations, and the properties
(deterministic, ranks agree, offset_invariant, fusion_invariant), each caught by a fault of
collective-mutate's catalogue that stays within the case's error bound."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.gate import bitdiff, versions
from harness.gate import compare as gate
from harness.gate.baseline import Baseline
from harness.program import fp64, reruns
from harness.program.tensors import generate
from harness.report import errors_table, headline, html, markdown
from harness.verdict import numerics as vnum

from .helpers import case_error, case_instances, load_report, run_pytest, write_case_file
from .test_gate import entry


# -- FP64 error and inexact expectations (rank side) ---------------------------------------
def test_error_metrics_against_fp64() -> None:
    ref = torch.tensor([1.0, 2.0, 4.0, 0.0], dtype=torch.float64)
    got = torch.tensor([1.0, 2.0 + 2**-22, 4.0, 0.0], dtype=torch.float32)
    m = fp64.error_metrics(got, ref)
    assert m["max_abs"] == pytest.approx(2**-22)
    assert m["max_rel"] == pytest.approx(2**-23)
    assert m["rel_l2"] == pytest.approx(2**-22 / float(torch.linalg.vector_norm(ref)))
    assert m["max_ulps"] == pytest.approx(1.0)  # float32 spacing at 2 is 2**-22
    assert fp64.error_metrics(torch.tensor([1, 2]), ref[:2]) == {}  # integers: none


def test_float16_sum_that_can_overflow_is_inexact() -> None:
    ref = torch.tensor([60000.0 * 2], dtype=torch.float64)
    reason = fp64.inexact_reason(torch.float16, "sum", ref, ref)
    assert "can overflow float16" in reason and "65504" in reason.replace("6.55e+04", "65504")
    assert fp64.inexact_reason(torch.float16, "sum", ref / 4, ref / 4) == ""
    assert fp64.inexact_reason(torch.float16, "max", ref, ref) == ""  # order-free


def test_a_sum_past_the_exact_range_over_three_ranks_is_inexact() -> None:
    """Found by collective-fuzz: four `ranks` values exact in float32 (3355443 * (r + 1))
    sum past 2**24, and Gloo's (a0 + a1) + (a2 + a3) rounds to 33554428 where the exact sum is
    33554430: no order is the right one, so the verdict must not compare bits."""
    vals = torch.tensor([3355443.0 * (r + 1) for r in range(4)], dtype=torch.float64)
    mag = vals.sum().reshape(1)
    reason = fp64.inexact_reason(torch.float32, "sum", mag, mag, ranks=4)
    assert "pass float32's exact range" in reason and "2**24" in reason, reason
    pairwise = ((vals[:2].to(torch.float32).sum()) + vals[2:].to(torch.float32).sum()).item()
    assert pairwise != float(mag[0])  # the order matters at this size
    assert fp64.inexact_reason(torch.float32, "sum", mag, mag, ranks=2) == ""  # one rounding
    assert fp64.inexact_reason(torch.float32, "sum", mag / 4, mag / 4, ranks=4) == ""
    assert fp64.inexact_reason(torch.float32, "max", mag, mag, ranks=4) == ""
    assert "bfloat16's exact range" in fp64.inexact_reason(
        torch.bfloat16, "avg", torch.tensor([300.0], dtype=torch.float64),
        torch.tensor([300.0], dtype=torch.float64), ranks=3)


def test_integer_product_beyond_64_bits_is_inexact() -> None:
    big = torch.tensor([2.0**70, 3.0], dtype=torch.float64)
    assert "exceed 64 bits" in fp64.inexact_reason(torch.int64, "product", big, None)
    assert fp64.inexact_reason(torch.int64, "product", big[1:], None) == ""


def test_random_sum_is_uncheckable_only_without_a_bound() -> None:
    base = """
    cases:
      - name: s
        op: all_reduce
        world_size: [2, 3]
        dtype: [float32, int32]
        shape: [8]
        input: {generator: random}
    """
    reasons = {i.id: vnum.static_reason(i) for i in case_instances(base)}
    assert reasons["gloo-ws2-float32-sum-sync"] == ""  # one rounding: unique
    assert "depends on the order" in reasons["gloo-ws3-float32-sum-sync"]
    assert reasons["gloo-ws3-int32-sum-sync"] == ""  # integers wrap exactly
    bounded = base + "    error: {rel_l2: 1.0e-3}\n"
    assert all(vnum.static_reason(i) == "" for i in case_instances(bounded))


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "where", "words"), [
    ("error: {rel_l2: .inf}", "cases/x.yaml:8:21", "must be a finite number"),
    ("error: {max_ulps: .nan}", "cases/x.yaml:8:23", "must be a finite number"),
    ("error: {rel_l2: -1.0}", "cases/x.yaml:8:21", "minimum"),
    ("deterministic: 0", "cases/x.yaml:8:20", "minimum"),
    ("iterations: 0", "cases/x.yaml:8:17", "minimum"),
    ("offset: 64", "cases/x.yaml:8:13", "beyond buffer 'tensor' of 8 element(s)"),
    ("offset_invariant: true", "cases/x.yaml:8:23", "has no non-zero offset"),
    ("fusion_invariant: true", "cases/x.yaml:8:23", "applies to the all_reduce_coalesced"),
    ("{offset: 1, layout: strided}", "cases/x.yaml", "offset applies to contiguous"),
    ("size_invariant: 8", "cases/x.yaml:8:21", "is the buffer's own element count"),
    ("size_invariant: 0", "cases/x.yaml:8:21", "minimum"),
    ("{size_invariant: 9, layout: strided}", "cases/x.yaml", "plain contiguous buffers"),
])
def test_bad_numerics_keys_are_located_errors(extra: str, where: str, words: str) -> None:
    lines = extra.strip("{}").split(", ") if extra.startswith("{") else [extra]
    text = ("cases:\n  - name: s\n    op: all_reduce\n    world_size: 2\n    shape: [8]\n"
            "    dtype: float32\n    input: {generator: random}\n"
            + "".join(f"    {ln}\n" for ln in lines))
    err = case_error(text)
    assert where in err and words in err, err


@pytest.mark.parametrize(("body", "words"), [
    ("op: all_gather_into_tensor\n    input: {generator: random}", "op: form of all_reduce and "
                                                                    "reduce"),
    ("op: all_reduce\n    input: 'rank + 1'", "must come from a generator"),
    ("op: all_reduce\n    input: {generator: nan_inf}", "must come from a generator"),
])
def test_size_invariant_needs_an_elementwise_op_and_a_generator(body: str, words: str) -> None:
    err = case_error("cases:\n  - name: s\n    world_size: 2\n    shape: [8]\n"
                     f"    {body}\n    size_invariant: 100\n")
    assert "size_invariant compares the leading elements" in err and words in err, err


PROGRAM = ("cases:\n  - name: p\n    world_size: 2\n    tensors:\n"
           "      a: {shape: [4], init: rank}\n      b: {shape: [4], init: rank}\n"
           "    steps:\n      - {op: all_reduce, tensor: a}\n      - {op: all_reduce, tensor: b}\n")


@pytest.mark.parametrize(("extra", "where", "words"), [
    ("    same_bits: [[a, c]]\n", "cases/x.yaml:10:21", "names 'c', which is not a tensor"),
    ("    same_bits: [[a, b, a]]\n", "cases/x.yaml:10:24", "names 'a' twice"),
    ("    same_bits: [[a]]\n", "cases/x.yaml:10:17", "is too short"),
    ("    expected: {a: auto, b: 1}\n", "cases/x.yaml:10:19", "'auto' needs the op: form"),
])
def test_bad_program_numerics_are_located_errors(extra: str, where: str, words: str) -> None:
    err = case_error(PROGRAM + extra)
    assert where in err and words in err, err


def test_same_bits_needs_a_program() -> None:
    err = case_error("cases:\n  - name: s\n    op: all_reduce\n    world_size: 2\n"
                     "    shape: [8]\n    same_bits: [[tensor, tensor]]\n")
    assert "cases/x.yaml:6:16" in err and "same_bits compares buffers of a program" in err, err


def test_generators_give_the_same_leading_values_whatever_the_size() -> None:
    """What size_invariant relies on: the first n values of a generator do not depend on how
    many it makes (nan_inf is refused: its NaN bits in bfloat16 depend on the length, the
    vectorized conversion giving another NaN than the scalar one)."""
    for name in ("random", "exact", "ranks", "constant"):
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            short = generate(name, {"seed": 3}, (40,), dtype, 1, 3, "sum")
            long = generate(name, {"seed": 3}, (1000,), dtype, 1, 3, "sum")
            # compared as bytes: NaN equals NaN
            assert torch.equal(short.view(torch.uint8), long[:40].view(torch.uint8)), name


def test_properties_on_an_op_without_output_are_refused() -> None:
    err = case_error("cases:\n  - name: b\n    op: barrier\n    world_size: 2\n"
                     "    deterministic: 3\n")
    assert "cases/x.yaml:5:20" in err and "barrier produces none" in err, err


# -- reports and the gate ------------------------------------------------------------------------
def _record(key: str, ws: int, outcome: str = "passed", rel: float = 1e-3,
            numerics: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"key": key, "op": "all_reduce", "dtype": "bfloat16", "world_size": ws,
            "outcome": outcome, "backend": "gloo",
            "numerics": numerics if numerics is not None else
            {"error": {"tensor": {"rel_l2": rel, "max_ulps": 2.0, "max_abs": 1.0}}}}


def test_errors_table_shows_the_worst_error_per_world_size() -> None:
    recs = [_record("a", 2, rel=1e-3), _record("b", 2, rel=4e-3), _record("c", 8, rel=3e-2),
            _record("d", 4, "uncheckable", numerics={"uncheckable": "sum of random data"}),
            _record("e", 2, numerics={"error": {"t": {"rel_l2": 0.0}},
                                      "properties": {"deterministic": "rank 0: bits differ"}})]
    md = "\n".join(errors_table.markdown(recs))
    assert "| `all_reduce` | bfloat16 | rel L2 0.004 · 2 ulp | rel L2 0.03 · 2 ulp |" in md
    assert "`d`: uncheckable: sum of random data" in md
    assert "`e`: deterministic: rank 0: bits differ" in md
    page = "\n".join(errors_table.html(recs))
    assert page.count("<svg") == 1 and "<polyline" in page and "ws 8: 0.03" in page
    assert "<script" not in page


def test_uncheckable_is_counted_and_never_a_pass() -> None:
    summary = {"total": 2, "passed": 1, "uncheckable": 1}
    assert "1 uncheckable" in headline.counts_text(summary)
    # A baseline pass that is now uncheckable is a regression that fails the gate; one that
    # failed before is "changed", never "fixed"; the gate never counts it as a pass.
    res = gate.compare([entry("a", "uncheckable")], Baseline([entry("a", "passed")]))
    assert [c.category for c in res.changes] == ["regression"] and not res.ok
    res = gate.compare([entry("a", "uncheckable")], Baseline([entry("a", "failed")]))
    assert [c.category for c in res.changes] == ["changed"]


# -- end to end on Gloo, with the faults ------------------------------------------------------
CASES = """
cases:
  - name: det
    op: all_reduce
    world_size: 3
    dtype: bfloat16
    shape: [64]
    input: {generator: random, seed: 3}
    error: {rel_l2: 1.0e-2}
    deterministic: 3
  - name: offs
    op: all_reduce
    world_size: 2
    dtype: float32
    shape: [33]
    offset: 1
    offset_invariant: true
    input: {generator: random, seed: 4}
    error: {max_ulps: 4}
  - name: fused
    op: all_reduce_coalesced
    world_size: 2
    shape: [3, 5]
    fusion_invariant: true
    input: {generator: random, seed: 5}
    error: {max_ulps: 4}
  - name: sized
    op: all_reduce
    world_size: 2
    dtype: float32
    shape: [33]
    size_invariant: 1000
    input: {generator: random, seed: 7}
    error: {max_ulps: 4}
  - name: sb
    world_size: 3
    dtype: float32
    tensors:
      ddp: {shape: [12], init: {generator: random, seed: 8}}
      grad: {shape: [12], init: {generator: random, seed: 8}}
      shard: {shape: [4], init: zeros}
      zero: {shape: [12], init: zeros}
    steps:
      - {op: all_reduce, tensor: ddp}
      - {op: reduce_scatter_tensor, output: shard, input: grad}
      - {op: all_gather_into_tensor, output: zero, input: shard}
    same_bits: [[ddp, zero]]
    unchecked: {shard: "an intermediate: its values reach zero, which same_bits compares"}
  - name: iters
    op: all_reduce
    world_size: 2
    dtype: float32
    shape: [16]
    input: {generator: exact, seed: 6}
    iterations: 3
    isolate: true
"""


def _run(tmp_path: Path, fault: str) -> dict[str, Any]:
    project = write_case_file(tmp_path / fault, CASES)
    args = ["c.yaml", "-q", "-p", "no:randomly", "--report-json", "r.json", "--report-md",
            "r.md", "--report-html", "r.html"]
    if fault != "gloo":
        args += ["--backend", "mutant", "--backend-module", "harness.mutate.backend"]
    done = run_pytest(project, *args, extra_env={"COLLECTIVE_MUTANT": fault}
                      if fault != "gloo" else None)
    assert (project / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return load_report(project / "r.json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory
         ) -> Callable[[str], tuple[Path, dict[str, Any]]]:
    """The session of CASES behind each fault, run once per fault (two faults each break two
    properties, and the test of each reads its own case): the folder holding its reports, and
    the JSON report."""
    where = tmp_path_factory.mktemp("faults")
    done: dict[str, tuple[Path, dict[str, Any]]] = {}

    def get(fault: str) -> tuple[Path, dict[str, Any]]:
        if fault not in done:
            done[fault] = (where / fault, _run(where, fault))
        return done[fault]

    return get


def _by_case(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["case"]: r for r in report["records"]}


def test_properties_hold_on_gloo_and_reach_every_report(tmp_path: Path) -> None:
    report = _run(tmp_path, "gloo")
    recs = _by_case(report)
    assert {c: r["outcome"] for c, r in recs.items()} == {
        "det": "passed", "offs": "passed", "fused": "passed", "sized": "passed",
        "sb": "passed", "iters": "passed"}
    assert recs["sb"]["numerics"]["properties"] == {"same_bits": "held"}
    assert recs["sized"]["numerics"]["properties"]["size_invariant"] == "held"
    assert recs["iters"]["numerics"]["properties"]["iterations"] == "held"
    assert recs["det"]["numerics"]["properties"] == {"deterministic": "held",
                                                     "ranks_agree": "held"}
    assert recs["offs"]["numerics"]["properties"]["offset_invariant"] == "held"
    assert recs["fused"]["numerics"]["properties"]["fusion_invariant"] == "held"
    assert "deterministic held" in recs["det"]["message"]
    md = (tmp_path / "gloo" / "r.md").read_text()
    assert "### Numerics: worst error against FP64" in md and "| `all_reduce` | bfloat16 |" in md
    assert "<svg" in (tmp_path / "gloo" / "r.html").read_text()
    assert markdown and html  # the writers the plugin used


@pytest.mark.parametrize(("fault", "case", "prop", "words"), [
    ("run_dependent_sum", "det", "deterministic", "differ in run 2 from run 1"),
    ("last_rank_ulp", "det", "ranks_agree", "ranks disagree on 'tensor'"),
    ("misaligned_wrong", "offs", "offset_invariant", "differ at offset 0 from the offset 1 run"),
    ("coalesced_ulp", "fused", "fusion_invariant", "issued one by one"),
    ("last_rank_ulp", "sb", "same_bits", "rank 2: 'ddp' "),
    ("size_dependent_sum", "sized", "size_invariant",
     "differ in the first 33 element(s) when the buffer holds 1000 elements"),
    # Intermittent corruption: the first run (call 1 of its private pool) is right, the
    # second iteration's fresh inputs come back one bit off.
    ("run_dependent_sum", "iters", "iterations", "iteration 2 (fresh inputs) failed: buffer "
                                                 "'tensor': 1 of 16 element(s) wrong"),
])
def test_each_property_catches_its_fault(
        runs: Callable[[str], tuple[Path, dict[str, Any]]], fault: str, case: str, prop: str,
        words: str) -> None:
    """Each fault keeps the values within the error bound: only the property sees it."""
    folder, report = runs(fault)
    rec = _by_case(report)[case]
    assert rec["outcome"] == "failed", rec["message"]
    assert words in rec["message"], rec["message"]
    assert rec["numerics"]["properties"][prop] != "held"
    assert not any(c.get("ok") is False for rk in rec["ranks"] for c in rk["checks"]), \
        "the value check itself must pass: the fault is within the bound"
    md = (folder / "r.md").read_text()
    assert f"{prop}: " in md


def test_uncheckable_reaches_the_junit_file_as_not_passed(tmp_path: Path) -> None:
    project = write_case_file(tmp_path, """
        cases:
          - name: r
            op: all_reduce
            world_size: 3
            shape: [16]
            input: {generator: random}
        """)
    done = run_pytest(project, "c.yaml", "-q", "--junitxml", "j.xml", "--report-json",
                      "r.json")
    assert done.returncode == 0, done.stdout[-2000:]
    report = load_report(project / "r.json")
    assert report["summary"]["uncheckable"] == 1 and report["summary"]["passed"] == 0
    assert "1 uncheckable" in report["summary"]["headline"]
    xml = (project / "j.xml").read_text()
    assert "<skipped" in xml and "uncheckable" in xml
    assert json.loads(json.dumps(report))["records"][0]["outcome"] == "uncheckable"


# -- bit-level A/B between reports -------------------------------------------------------------
REFERENCE_QUICK = (Path(__file__).resolve().parents[1] / "reports" / "reference"
                   / "gloo-cpu-quick-torch2.13.0.json.gz")


def _passing(key: str, digest: str, outcome: str = "passed") -> dict[str, Any]:
    return {"key": f"c.yaml::s[{key}]", "file": "c.yaml", "case": "s", "backend": "gloo",
            "axes": {"k": key}, "op": "all_reduce", "dtype": "bfloat16", "outcome": outcome,
            "ranks": [{"rank": 0, "checks": [{"tensor": "t", "digest": "same"}]},
                      {"rank": 1, "checks": [{"tensor": "t", "digest": digest}]}]}


def test_bitdiff_lists_passing_instances_whose_bits_changed() -> None:
    a = {"records": [_passing("x", "aa"), _passing("y", "bb"), _passing("z", "cc", "failed")]}
    b = {"records": [_passing("x", "aa"), _passing("y", "b2"), _passing("z", "c2")]}
    diff = bitdiff.changes(a, b)
    assert (diff.passed_both, diff.compared) == (2, 2)  # z failed in A: not a pass on both sides
    assert [(c.key, c.buffers) for c in diff.changed] == [("c.yaml::s[y]", ["'t' on rank(s) 1"])]
    assert diff.uncompared == []
    assert "all_reduce bfloat16: 1 instance(s)" in bitdiff.render(diff, "A", "B")


def _without(record: dict[str, Any], rank: int | None = None) -> dict[str, Any]:
    """``record`` with no digest on ``rank`` (on any rank when None)."""
    out: dict[str, Any] = json.loads(json.dumps(record))
    for rk in out.get("ranks") or []:
        if rank is None or rk["rank"] == rank:
            rk["checks"] = [{k: v for k, v in c.items() if k != "digest"} for c in rk["checks"]]
    return out


@pytest.mark.parametrize(("b_records", "listed"), [
    ([], "not compared: no record in B: 2 instance(s)"),
    ([_passing("x", "aa"), _passing("y", "bb", "failed")],
     "not compared: did not pass in B: 1 instance(s)\n    c.yaml::s[y]: failed"),
    ([_passing("x", "aa"), _without(_passing("y", "bb"))],
     "not compared: passed in B without digests: 1 instance(s)\n    c.yaml::s[y]"),
    ([_passing("x", "aa"), _without(_passing("y", "bb"), rank=1)],
     "not compared: buffers without a digest in B: 1 instance(s)\n    c.yaml::s[y]: 't' on "
     "rank(s) 1"),
    ([_passing("x", "aa"), {**_passing("y", "bb"), "ranks": [
        {"rank": 0, "checks": [{"tensor": "t", "digest": "same"}]},
        {"rank": 1, "checks": [{"tensor": "u", "digest": "bb"}]}]}],
     "c.yaml::s[y]: 't' on rank(s) 1"),
])
def test_bitdiff_names_what_a_compared_and_b_cannot_and_fails_on_it(
        tmp_path: Path, b_records: list[dict[str, Any]], listed: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Missing records, outcomes, digests, ranks or buffers in B: nothing to compare is no
    "0 changed bits"; --fail-on-change fails, and without it the listing still says so."""
    a = {"records": [_passing("x", "aa"), _passing("y", "bb")]}
    diff = bitdiff.changes(a, {"records": b_records})
    assert diff.changed == [] and diff.uncompared
    text = bitdiff.render(diff, "A", "B")
    assert listed in text, text
    assert "compared in A could not be compared in B" in text.splitlines()[0]
    assert bitdiff.failed(diff)
    old, new = tmp_path / "a.json", tmp_path / "b.json"
    report = versions.load(str(REFERENCE_QUICK))
    first = next(r for r in report["records"] if bitdiff.digests(r))
    old.write_text(json.dumps({**report, "records": [first]}))
    new.write_text(json.dumps({**report, "records": []}))
    assert bitdiff.main([str(old), str(new)]) == 0
    assert "not compared: no record in B: 1 instance(s)" in capsys.readouterr().out
    assert bitdiff.main([str(old), str(new), "--fail-on-change"]) == 1


def test_bitdiff_of_reports_without_digests_compares_nothing_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = versions.load(str(REFERENCE_QUICK))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**report, "records": []}))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**report, "records": [_without(r) for r in report["records"]
                                                      [:20]]}))
    for a, b in ((empty, empty), (bare, bare)):
        assert bitdiff.main([str(a), str(b)]) == 0
        out = capsys.readouterr().out
        assert "0 with digests to compare; nothing compared" in out, out
        assert "changed bits" not in out
        assert bitdiff.main([str(a), str(b), "--fail-on-change"]) == 1
        capsys.readouterr()


def test_bitdiff_between_the_torch_2_4_and_2_13_gloo_references(tmp_path: Path) -> None:
    """The issue's acceptance run: the committed quick references of torch 2.4.1 and 2.13.0."""
    ref = Path(__file__).resolve().parents[1] / "reports" / "reference"
    out = tmp_path / "d.json"
    assert bitdiff.main([str(ref / "gloo-cpu-quick-torch2.4.1.json.gz"),
                         str(ref / "gloo-cpu-quick-torch2.13.0.json.gz"),
                         "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["compared"] > 1000
    # What changed: float16 NaN bits of the nan_inf case (the value check takes any NaN).
    assert doc["changed"] and all("nan_inf" in c["key"] and c["dtype"] == "float16"
                                  for c in doc["changed"])
    assert bitdiff.main([str(tmp_path / "missing.json"), str(out)]) == 2


def test_check_iters_option_checks_every_iteration(tmp_path: Path) -> None:
    """--check-iters N: N iterations on fresh inputs for reference-checked instances; an
    instance with explicit expectations is left alone; a bad N is a usage error."""
    project = write_case_file(tmp_path, """
        cases:
          - name: auto
            op: all_reduce
            world_size: 2
            shape: [8]
            input: {generator: exact}
          - name: explicit
            op: all_reduce
            world_size: 2
            shape: [2]
            input: "rank + i"
            expected: "1 + 2 * i"
        """)
    done = run_pytest(project, "c.yaml", "-q", "--check-iters", "3", "--report-json", "r.json")
    assert done.returncode == 0, done.stdout[-2000:]
    recs = {r["case"]: r for r in load_report(project / "r.json")["records"]}
    assert recs["auto"]["numerics"]["properties"]["iterations"] == "held"
    assert "iterations held" in recs["auto"]["message"]
    assert "numerics" not in recs["explicit"]
    bad = run_pytest(project, "c.yaml", "-q", "--check-iters", "0", "--no-report")
    assert bad.returncode != 0 and "--check-iters: 0 is outside 1..100" in bad.stderr, bad.stderr


def test_fresh_inputs_per_iteration() -> None:
    (inst,) = case_instances("""
    cases:
      - name: s
        op: all_reduce
        world_size: 2
        shape: [8]
        input: {generator: random, seed: 4}
        iterations: 3
    """)
    labels = [label for label, _ in reruns.variants(inst)]
    assert labels == ["iteration 2", "iteration 3"]
    seeds = [dict(v.tensors[0].init.data[1])["seed"] for _, v in reruns.variants(inst)]
    assert seeds == [2004, 3004]  # each iteration its own inputs, the same on every run


def test_a_result_no_summation_order_gives_fails_even_without_a_bound(tmp_path: Path) -> None:
    """Random data over 4 ranks and no bound: uncheckable on Gloo; with a dropped contribution
    (collective-mutate's dropped_contribution) no order explains the result: failed."""
    text = """
        cases:
          - name: rs
            op: reduce_scatter_tensor
            world_size: 4
            shape: [64]
            input: {generator: random, seed: 9}
        """
    faithful = write_case_file(tmp_path / "gloo", text)
    run_pytest(faithful, "c.yaml", "-q", "--report-json", "r.json")
    (rec,) = load_report(faithful / "r.json")["records"]
    assert rec["outcome"] == "uncheckable", rec["message"]
    faulty = write_case_file(tmp_path / "mutant", text)
    run_pytest(faulty, "c.yaml", "-q", "--report-json", "r.json", "--backend", "mutant",
               "--backend-module", "harness.mutate.backend",
               extra_env={"COLLECTIVE_MUTANT": "dropped_contribution"})
    (rec,) = load_report(faulty / "r.json")["records"]
    assert rec["outcome"] == "failed", rec["message"]
    assert "outside what any order of the operations gives" in rec["message"]


TWO_BUFFERS = """
cases:
  - name: hier_vs_flat
    world_size: 4
    dtype: float32
    tensors:
      flat: {shape: [64], init: {generator: random, seed: 3}}
      hier: {shape: [64], init: {generator: random, seed: 3}}
    steps:
      - {op: all_reduce, tensor: flat}
      - {op: all_reduce, tensor: hier, group: [0, 1], ranks: [0, 1]}
      - {op: all_reduce, tensor: hier, group: [2, 3], ranks: [2, 3]}
      - {op: all_reduce, tensor: hier, group: [0, 2], ranks: [0, 2]}
      - {op: all_reduce, tensor: hier, group: [1, 3], ranks: [1, 3]}
    expected:
      hier: {same_values: flat, rtol: 1.0e-5, atol: 1.0e-6}
  - name: max_vs_sum
    world_size: 2
    tensors:
      a: {shape: [4], init: "rank + i"}
      b: {shape: [4], init: "rank + i"}
    steps:
      - {op: all_reduce, tensor: a}
      - {op: all_reduce, tensor: b, reduce_op: max}
    expected:
      b: {same_values: a, atol: 0.5}
  - name: routed
    op: all_to_all_single
    world_size: 3
    tables:
      routes: [[0, 2, 1], [1, 1, 3], [2, 0, 0]]
    args: {splits: "routes[src][dst]"}
    shape: [3]
    input: "rank * 10 + i"
"""


def test_two_buffers_within_a_tolerance_and_splits_from_a_table(tmp_path: Path) -> None:
    """Issue 43.7: a hierarchical all_reduce (pairs, then across) against the flat one on
    random data agrees within a tolerance but not bit for bit, which same_bits cannot say;
    a MAX against a SUM does not, and the failure names both buffers; an all_to_all_single's
    split sizes come from a routing table indexed by src and dst."""
    project = write_case_file(tmp_path, TWO_BUFFERS)
    done = run_pytest(project, "c.yaml", "-q", "--report-json", "r.json")
    rep = load_report(project / "r.json")
    recs = {r["case"]: r for r in rep["records"]}
    assert {c: r["outcome"] for c, r in recs.items()} == {
        "hier_vs_flat": "passed", "max_vs_sum": "failed", "routed": "passed"}, done.stdout
    assert {"what": "hier", "how": "same values as 'flat'", "ranks": [0, 1, 2, 3],
            "elements": 256} in recs["hier_vs_flat"]["evidence"]["checks"]
    assert ("ranks 0-1, buffer 'b' (same values as 'a'): 3 of 4 element(s) wrong"
            in recs["max_vs_sum"]["message"]), recs["max_vs_sum"]["message"]
    assert "atol 0.5" in recs["max_vs_sum"]["message"]
