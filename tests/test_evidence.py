"""Evidence for every PASS: each record says what it compared, and nothing passes on nothing.

Each scenario is a real session (a separate pytest process on Gloo, or on the fault-injecting
``mutant`` backend with one fault), run the way a user runs the harness; the assertions read
the JSON report and the Markdown. The collection rule (a program buffer that an op writes and
nothing checks) is checked on the case-file stage directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.casefile import collect
from harness.errors import CaseFileErrors

from .helpers import HANG_S

REPO = Path(__file__).resolve().parent.parent

CASES = """\
cases:
  - name: plain
    op: all_reduce
    world_size: 2
    dtype: float32
    shape: [3]
    input: "rank + i"
    expected: auto
  - name: bare_barrier
    op: barrier
    world_size: 2
  - name: sub_agree
    op: all_reduce
    world_size: 3
    args: {group: [0, 2]}
    shape: [2]
    input: 1
  - name: gathered
    op: gather_object
    world_size: 2
    args: {dst: 0}
    input: {0: "a", 1: [1, 2]}
  - name: rejects
    op: all_reduce
    world_size: 2
    dtype: float32
    shape: [2]
    input: 1
    reduce_op: bxor
    raises: "(?i)bxor|unsupported|not supported|cannot use"
  - name: partly_checked
    world_size: 2
    tensors:
      t: {shape: [4], dtype: float32, init: "rank"}
      u: {shape: [4], dtype: float32, init: "rank"}
      w: {shape: [4], dtype: float32, init: "rank"}
    steps:
      - {op: all_reduce, tensor: t}
      - {op: all_reduce, tensor: u}
      - {op: all_reduce, tensor: w}
    expected: {t: 1}
    unchecked: {u: "the test states nothing about it"}
  - name: empty_size_invariant
    op: all_reduce
    world_size: 2
    dtype: float32
    shape: [0]
    input: {generator: constant, value: 1}
    error: {rel_l2: 1.0e-3}
    size_invariant: 16
  - name: deterministic_unchecked
    world_size: 2
    dtype: float32
    tensors:
      t: {shape: [64], init: {generator: random, seed: 5}}
    steps:
      - {op: all_reduce, tensor: t}
    unchecked: {t: "only its run-to-run bits are stated"}
    deterministic: 3
  - name: wrong_override
    op: all_reduce
    world_size: 2
    dtype: int64
    shape: [2]
    input: "rank + 1"
    reduce_op: bxor
    expected: auto
    overrides:
      - when: {backend: mutant}
        expected: 3
        reason: the mutant computes BXOR as BOR (a declared divergence)
"""


def _session(tmp_path: Path, backend: str, fault: str = "none", *keys: str
             ) -> tuple[int, str, dict[str, dict[str, Any]], str]:
    """Run the cases above; (exit status, output, records by case name, Markdown)."""
    (tmp_path / "cases").mkdir(exist_ok=True)
    (tmp_path / "cases" / "ev.yaml").write_text(CASES)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLLECTIVE_MUTANT": fault}
    cmd = [sys.executable, "-m", "pytest", "cases", "--rootdir=.", "-p", "no:cacheprovider",
           "-q", "--backend", backend, "--deadline", "60", "-k", " or ".join(keys),
           "--report-json", "r.json", "--report-md", "r.md"]
    if backend == "mutant":
        cmd += ["--backend-module", "harness.mutate.backend"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S, check=False)
    out = proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    records = {r["case"]: {**r, "_dir": str(tmp_path)} for r in report["records"]}
    return proc.returncode, out, records, (tmp_path / "r.md").read_text()


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[int, str, dict[str, dict[str, Any]], str]:
    return _session(tmp_path_factory.mktemp("ev"), "gloo", "none", "plain", "bare_barrier",
                    "sub_agree", "gathered", "rejects", "partly_checked", "empty_size_invariant")


def test_a_pass_lists_what_it_compared(gloo: tuple[int, str, dict[str, Any], str]) -> None:
    _, out, records, _ = gloo
    plain = records["plain"]
    assert plain["outcome"] == "passed", out
    checks = {c["what"]: c for c in plain["evidence"]["checks"]}
    assert checks["tensor"]["how"] == "auto"
    assert checks["tensor"]["ranks"] == [0, 1]
    assert checks["tensor"]["elements"] == 6  # 3 elements on each of 2 ranks
    assert plain["evidence"]["agreement"] == [{"buffer": "tensor", "ranks": [0, 1]}]
    barrier = records["bare_barrier"]
    assert barrier["outcome"] == "passed"
    assert barrier["evidence"]["completed"] == {"ops": ["barrier"], "ranks": [0, 1]}
    sub = records["sub_agree"]  # only the group's members are compared with each other
    assert sub["outcome"] == "passed", out
    assert sub["evidence"]["agreement"] == [{"buffer": "tensor", "ranks": [0, 2]}]
    gathered = records["gathered"]  # the root's gathered list is compared, not only others'
    assert gathered["outcome"] == "passed"
    by_how = {(c["what"], c["how"]): c["ranks"] for c in gathered["evidence"]["checks"]}
    assert by_how[("output", "auto")] == [0]
    rejects = records["rejects"]
    if rejects["outcome"] == "passed":  # Gloo rejects BXOR on floats
        assert rejects["evidence"]["raised"]["ranks"] == [0, 1]
        assert rejects["evidence"]["raised"]["pattern"].startswith("(?i)bxor")


def test_the_gate_refuses_a_pass_without_evidence(
        gloo: tuple[int, str, dict[str, Any], str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A report whose passed record lost its evidence (an older harness, or an edit) is not
    made a baseline and fails the gate."""
    from harness.gate import cli as gate

    _, _, records, _ = gloo
    report = json.loads((Path(records["plain"]["_dir"]) / "r.json").read_text())
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report))
    assert gate.main([str(good), str(tmp_path / "base.json"), "--update"]) == 0
    for rec in report["records"]:
        if rec["case"] == "plain":
            del rec["evidence"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))
    capsys.readouterr()
    assert gate.main([str(bad), str(tmp_path / "base.json")]) != 0
    assert "1 passed record(s) say nothing about what they compared" in capsys.readouterr().out
    assert gate.main([str(bad), str(tmp_path / "other.json"), "--update"]) != 0
    assert not (tmp_path / "other.json").exists()


def test_buffers_nothing_compares_are_reported_not_counted(
        gloo: tuple[int, str, dict[str, Any], str]) -> None:
    rc, out, records, _ = gloo
    rec = records["partly_checked"]
    assert rec["outcome"] == "passed", out
    assert [c["what"] for c in rec["evidence"]["checks"]] == ["t"]
    assert rec["not_checked"] == [
        {"buffer": "u", "reason": "the test states nothing about it"},
        {"buffer": "w", "reason": "not stated by the case"}]
    assert "not_checked" not in records["plain"]
    assert rc == 1  # empty_size_invariant fails


def test_a_property_over_an_empty_buffer_does_not_hold(
        gloo: tuple[int, str, dict[str, Any], str]) -> None:
    _, out, records, _ = gloo
    rec = records["empty_size_invariant"]
    assert rec["outcome"] == "failed", out
    assert rec["numerics"]["properties"]["size_invariant"].startswith("compared nothing")


def test_deterministic_compares_an_unchecked_buffer(tmp_path: Path) -> None:
    """With no expected value, ``deterministic: 3`` still compares the written buffer's bits
    across the runs: the run_dependent_sum fault (every second all_reduce differs) fails it."""
    rc, out, records, _ = _session(tmp_path, "mutant", "run_dependent_sum",
                                   "deterministic_unchecked")
    rec = records["deterministic_unchecked"]
    assert rec["outcome"] == "failed", out
    assert "deterministic" in rec["message"] and "'t'" in rec["message"]
    assert rc == 1


def test_deterministic_held_names_the_buffers_it_compared(tmp_path: Path) -> None:
    _, out, records, _ = _session(tmp_path, "gloo", "none", "deterministic_unchecked")
    rec = records["deterministic_unchecked"]
    assert rec["outcome"] == "passed", out
    assert rec["evidence"]["properties"] == [
        {"property": "deterministic", "buffers": ["t"], "ranks": [0, 1], "runs": 3}]
    assert "checks" not in rec["evidence"]  # the values themselves were not compared


def test_an_override_with_wrong_values_is_a_declared_divergence(tmp_path: Path) -> None:
    rc, out, records, md = _session(tmp_path, "mutant", "bxor_as_bor", "wrong_override")
    rec = records["wrong_override"]
    assert rec["outcome"] == "limitation", out
    assert rec["reason"].startswith("the mutant computes BXOR as BOR")
    assert rec["overrides_applied"][0]["patched"] == ["expected"]
    assert "not conformant" in rec["message"]
    assert "0 conformant" in out and "1 limitation" in out
    assert "the mutant computes BXOR as BOR" in md
    assert rc == 0  # declared, so not a failure; but never counted as conformant


@pytest.mark.parametrize(("program", "where", "words"), [
    ("      - {op: all_reduce, tensor: t}\n    expected: {t: unspecified}\n",
     "nothing.yaml:7:34:", "buffer 't' is written by all_reduce but nothing checks it, and "
     "nothing else in the program is compared"),
    ("      - {op: all_reduce, tensor: t}\n    unchecked: {t: a reason is no comparison}\n",
     "nothing.yaml:7:34:", "buffer 't' is written by all_reduce but nothing checks it"),
    ("      - {op: all_reduce, tensor: t}\n    hangs: false\n",
     "nothing.yaml:7:34:", "nothing else in the program is compared"),
    ("      - {sleep: 0.01}\n      - {op: all_reduce, tensor: t, async: true, handle: h}\n"
     "      - {wait: h}\n    expected: {t: unspecified}\n",
     "nothing.yaml:8:34:", "nothing else in the program is compared"),
])
def test_a_program_that_compares_nothing_is_a_collection_error(
        program: str, where: str, words: str) -> None:
    text = ("cases:\n  - name: nothing\n    world_size: 2\n    tensors:\n"
            "      t: {shape: [4], dtype: float32, init: 1}\n    steps:\n" + program)
    with pytest.raises(CaseFileErrors) as info:
        collect.from_text(text, "nothing.yaml", "gloo")
    message = str(info.value)
    assert where in message and words in message, message


def test_a_program_with_one_comparison_may_leave_other_buffers_unchecked() -> None:
    text = textwrap.dedent("""\
        cases:
          - name: returns_only
            world_size: 2
            tensors:
              t: {shape: [4], dtype: float32, init: 1}
            steps:
              - {op: all_reduce, tensor: t, async: true, handle: h}
              - {work_state: h, is_completed: true}
        """)
    (inst,) = collect.from_text(text, "fine.yaml", "gloo")
    assert inst.unchecked == (("t", ""),)


def test_unchecked_needs_a_declared_tensor_and_the_steps_form() -> None:
    text = textwrap.dedent("""\
        cases:
          - name: typo
            world_size: 2
            tensors:
              t: {shape: [4], dtype: float32, init: 1}
            steps:
              - {op: all_reduce, tensor: t}
            unchecked: {tt: "a typo"}
            expected: {t: 2}
          - name: shorthand
            op: all_reduce
            world_size: 2
            shape: [2]
            input: 1
            unchecked: {output: "not here"}
        """)
    with pytest.raises(CaseFileErrors) as info:
        collect.from_text(text, "typo.yaml", "gloo")
    message = str(info.value)
    assert "typo.yaml:8:" in message and "unchecked: unknown tensor 'tt'" in message
    assert "'unchecked' belongs to the 'steps' form" in message


def test_the_op_forms_output_cannot_be_left_unspecified() -> None:
    text = textwrap.dedent("""\
        cases:
          - name: shrug
            op: reduce
            world_size: 2
            args: {dst: 0}
            shape: [2]
            input: 1
            expected: unspecified
          - name: rejected
            op: all_reduce
            world_size: 2
            shape: [2]
            input: 1
            expected: unspecified
            raises: "."
        """)
    with pytest.raises(CaseFileErrors) as info:
        collect.from_text(text, "shrug.yaml", "gloo")
    message = str(info.value)
    assert "shrug.yaml:8:" in message
    assert "expected: unspecified leaves the op's output unchecked" in message
    assert "1 problem(s)" in message  # the case that must raise may leave it unspecified


def test_an_unspecified_output_that_ranks_must_agree_on_is_compared_across_ranks(
        tmp_path: Path) -> None:
    """all_reduce's output must be identical on every rank: with its values unspecified, that
    is what is compared, and the record says so; at world size 1 nothing is, and it fails."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "agree.yaml").write_text(textwrap.dedent("""\
        cases:
          - name: agree
            op: all_reduce
            world_size: [1, 2]
            shape: [3]
            input: {generator: random, seed: 3}
            dtype: float32
            expected: unspecified
        """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "cases", "--rootdir=.", "-p",
                           "no:cacheprovider", "-q", "--backend", "gloo", "--report-json",
                           "r.json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S, check=False)
    records = {r["world_size"]: r for r in json.loads((tmp_path / "r.json").read_text())[
        "records"]}
    assert records[2]["outcome"] == "passed", proc.stdout
    assert records[2]["evidence"] == {"agreement": [{"buffer": "tensor", "ranks": [0, 1]}]}
    assert records[1]["outcome"] == "failed"
    assert "nothing was compared" in records[1]["message"]
