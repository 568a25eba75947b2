"""The certificate as data, without running a backend: each committed certificate is what its
committed session reports make of it today, the difference from the reference, which
capability each case needs, and the manifest proposed from probes."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from harness.certify import cells, cli, render
from harness.manifest import needs
from harness.run import ranklog
from tests.helpers import case_instances

REPO = Path(__file__).resolve().parent.parent
COMMITTED = sorted((REPO / "reports" / "reference").glob("*-certificate"))


def test_there_are_committed_certificates() -> None:
    assert {p.name for p in COMMITTED} >= {"gloo-cpu-certificate", "torchft-gloo-certificate",
                                           "torchft-babygloo-certificate"}


def test_babygloo_s_certificate_shows_its_group_unusable_after_an_error() -> None:
    """torchft's BabyGloo ends its worker on any error, so the next call fails: the committed
    certificate says so as its largest group of pools not kept, with the evidence (the error
    the health check met) and examples, not only as a count of failures."""
    cert = json.loads((REPO / "reports" / "reference" / "torchft-babygloo-certificate" /
                       "certificate.json").read_text("utf-8"))
    top = cert["pools_replaced"][0]
    assert top["why"].startswith("health check failed: ") and "ConnectionResetError" in top["why"]
    assert top["count"] > 100 and top["examples"]
    assert cert["level"] == "none" and cert["identity"]["ok"] is False  # rank() answers 0


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_a_committed_certificate_is_what_its_reports_make_of_it(folder: Path) -> None:
    """A change to how records become cells, causes or levels shows up here, not later in a
    certificate nobody rebuilt (``collective-certify --rebuild FOLDER`` writes it again)."""
    committed = json.loads((folder / "certificate.json").read_text("utf-8"))
    rebuilt = json.loads(json.dumps(cli.from_folder(str(folder), committed["skip_budget"])))
    stale = sorted(k for k in committed.keys() | rebuilt.keys()
                   if committed.get(k) != rebuilt.get(k))
    assert stale == [], f"{folder.name}/certificate.json is stale in {stale}"
    assert (folder / "certificate.md").read_text("utf-8") == render.markdown(committed)


def test_rebuild_writes_the_certificate_from_the_folders_reports(tmp_path: Path) -> None:
    src = REPO / "reports" / "reference" / "gloo-cpu-certificate"
    for name in ("identity.json.gz", "library.json.gz"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    assert cli.main(["--rebuild", str(tmp_path)]) == 0  # level declared, the default --require
    assert json.loads((tmp_path / "certificate.json").read_text("utf-8")) == json.loads(
        (src / "certificate.json").read_text("utf-8"))
    assert cli.main(["--rebuild", str(tmp_path), "--require", "conforming"]) == 1


def test_rebuild_of_a_folder_without_a_library_report_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--rebuild", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no library.json or library.json.gz" in err
    assert cli.main(["--rebuild", str(tmp_path / "nope\x1b")]) == 2
    err = capsys.readouterr().err
    assert "no such folder" in err and "\x1b" not in err


def gloo_override(line: int, **extra: Any) -> dict[str, Any]:
    return {"line": line, "reason": "what Gloo does", "patched": ["raises"], **extra}


def report(backend: str, records: list[dict[str, Any]], inherits: str = "") -> dict[str, Any]:
    return {"records": records, "session": {"complete": True},
            "metadata": {"options": {"backend": backend,
                                     "manifest": {"backend": backend, "inherits": inherits}}}}


def limitation(key: str, override: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"key": key, "case": "c", "id": "x", "op": "all_gather", "dtype": "float32",
            "outcome": "limitation", "message": "", "overrides_applied": [override], **extra}


IDENTITY = {"records": [{"key": "i", "case": "i", "id": "i", "outcome": "passed"}],
            "session": {"complete": True}}


def test_what_the_candidate_inherits_from_the_reference_is_no_difference() -> None:
    """torchft wraps Gloo: the Gloo behaviour its records inherit is the reference's own
    divergence for the same behaviour, not a difference from it (62 such rows were)."""
    ref = report("gloo", [limitation("a", gloo_override(38)),
                          limitation("b", gloo_override(40), dtype="int32"),
                          limitation("c", gloo_override(41), dtype="int64")])
    cand = report("wrapper", [limitation("a", gloo_override(38, inherited=True)),
                              {**limitation("b", gloo_override(40)), "dtype": "int32",
                               "outcome": "passed"},
                              limitation("c", gloo_override(41, inherited=True), dtype="int64")],
                  inherits="gloo")
    cert = cells.certificate(IDENTITY, cand, ref)
    assert cert["statuses"]["inherited divergence"] == 2
    # Only the cell where the wrapper behaves otherwise than Gloo is a difference.
    assert cert["reference"]["differs"] == [
        {"op": "all_gather", "dtype": "int32", "capability": "-",
         "backend": "conforming", "reference": "own divergence"}]
    assert "inherits gloo: a cell where it shows an inherited divergence" in render.markdown(cert)
    # Inherited from a backend other than the reference's, they are a difference.
    other = cells.certificate(IDENTITY, {**cand, "metadata": {"options": {
        "backend": "wrapper", "manifest": {"inherits": "nccl"}}}}, ref)
    assert {d["dtype"] for d in other["reference"]["differs"]} == {"float32", "int32", "int64"}


@functools.cache
def library(name: str) -> list[Any]:
    return case_instances((REPO / "cases" / name).read_text("utf-8"))


def needs_of(name: str, case: str, key_has: str = "") -> tuple[needs.Need, ...]:
    """The needs of the first instance of a bundled case (whose key contains ``key_has``)."""
    return needs.of(next(i for i in library(name) if i.case == case and key_has in i.key))


def capabilities(found: tuple[needs.Need, ...]) -> set[str]:
    return {item for kind, item in found if kind == "capability"}


def test_a_plain_collective_needs_its_op_dtype_reduce_op_and_device_only() -> None:
    found = needs_of("all_reduce.yaml", "reduce_ops", "float32-sum-sync")
    assert found[0] == ("op", "all_reduce") and found[-1] == ("device", "cpu")
    assert ("dtype", "float32") in found and ("reduce_op", "sum") in found
    assert capabilities(found) == set() and len(set(found)) == len(found)  # each once


@pytest.mark.parametrize("name, case, key_has, caps", [
    ("all_reduce.yaml", "async_x_op", "float32-sum-async", {"async"}),
    ("backend_contract.yaml", "all_reduce_coalesced_returns", "", {"coalescing"}),
    ("backend_contract.yaml", "gather_single_unsupported", "", {"gather_single"}),
    ("backend_contract.yaml", "complex_all_reduce", "", {"complex"}),
    ("dtypes.yaml", "all_reduce", "float8_e4m3fn-sum", {"float8"}),
    ("dtypes.yaml", "all_reduce", "bool-band", {"bitwise_reductions"}),
    ("sparse.yaml", "sum_uncoalesced", "", {"sparse"}),
    ("timeouts.yaml", "set_timeout_then_barrier_times_out", "", {"timeouts"}),
    ("timeouts.yaml", "destroy_then_collective_raises", "", {"lifecycle"}),
    ("backend_contract.yaml", "work_duration_unsupported", "", {"async", "timing"}),
    ("backend_contract.yaml", "sequence_numbers", "", {"sequence_numbers", "subgroups"}),
    ("backend_contract.yaml", "cuda_graph_collectives", "", {"cuda_graphs"}),
    ("groups.yaml", "new_subgroups", "", {"subgroups"}),
    ("groups.yaml", "split_group", "", {"split", "subgroups"}),
    ("group_local.yaml", "broadcast_group_src", "", {"subgroups"}),
])
def test_each_capability_is_needed_by_the_case_that_uses_it(
        name: str, case: str, key_has: str, caps: set[str]) -> None:
    assert capabilities(needs_of(name, case, key_has)) == caps


def test_what_a_program_issues_is_what_it_needs() -> None:
    cuda = needs_of("backend_contract.yaml", "cuda_graph_collectives")
    assert ("device", "cuda") in cuda and ("device", "cpu") not in cuda
    assert [i for k, i in cuda if k == "op"] == [
        "all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single",
        "all_to_all_single"]
    # A program that only makes a group issues no op: it needs no "steps" op.
    bare = needs_of("groups.yaml", "new_subgroups_group_size_exceeds_world_size")
    assert [k for k, _ in bare].count("op") == 0 and capabilities(bare) == {"subgroups"}
    # Objects have no dtype to claim.
    objects = needs_of("objects.yaml", "broadcast_object_list")
    assert objects == (("op", "broadcast_object_list"), ("device", "cpu"))
    # A program's several tensors each need their dtype.
    assert {i for k, i in needs_of("groups.yaml", "new_subgroups") if k == "dtype"} == {
        "float32", "int64"}



def probe(case: str, outcome: str, message: str = "") -> dict[str, Any]:
    return {"key": f"probes.yaml::{case}[x]", "case": case, "id": "x", "outcome": outcome,
            "message": message}


def test_a_proposal_names_what_it_did_not_probe_and_claims_it() -> None:
    """Without a manifest, the probes propose one: a probe that passed claims the ops it
    issued, one that failed declares them unsupported with why, and an op no probe ran is
    claimed and named as not probed (never left unclaimed silently: a backend that has it
    would be failed for not rejecting it)."""
    from harness import ops
    from harness.casefile.load import load_text
    from harness.certify import propose
    from harness.manifest.load import parse

    issued = {"all_reduce": ("all_reduce",), "gather": ("gather",),
              "send": ("send", "recv"), "gather_single": ("gather_single",)}
    probes = {"records": [
        probe("all_reduce", "passed"), probe("send", "passed"),
        probe("gather", "error", "gather [x]\n  ranks 0-1: RuntimeError: no gather here"),
        probe("gather_single", "skipped", "torch has no gather_single"),
        probe("subgroups", "hang", "subgroups [x]\n  no result after the 20 s deadline")]}
    text = propose.manifest_text("mine", ["my.module"], probes, issued)
    m = parse(load_text(text, "manifest.proposed.yaml"))
    assert m.backend == "mine" and m.module == "my.module"
    assert m.ops is not None and "gather" not in m.ops and "all_reduce" in m.ops
    assert {"send", "recv"} <= m.ops
    assert "no gather here" in m.reason("gather") and "probe x: error" in m.reason("gather")
    assert m.unsupported == {"subgroups"} and "hang" in m.reason("subgroups")
    # Every other op, gather_single (skipped: not probed) included, is claimed and named.
    unprobed = sorted(set(ops.ALL_OPS) - {"all_reduce", "gather", "send", "recv"})
    assert m.ops == frozenset(ops.ALL_OPS) - {"gather"}
    said = " ".join(ln[2:] for ln in text.splitlines() if ln.startswith("# "))
    assert "Not probed, claimed unverified (the library will tell): " + ", ".join(
        unprobed) in said


def test_every_op_of_the_table_has_a_probe() -> None:
    from harness import ops
    from harness.certify import propose

    issued = propose.probe_ops(str(REPO / "harness" / "certify" / "data" / "probes.yaml"))
    assert set(ops.ALL_OPS) <= {op for found in issued.values() for op in found}
    assert set(propose.CAPABILITY_PROBES) <= set(issued)


def _hang(stderr: str) -> dict[str, Any]:
    return {"key": "c.yaml::f[x]", "case": "f", "file": "c.yaml", "id": "x", "outcome": "hang",
            "message": "c.yaml:3: f[x]: no result after the 20 s deadline; rank(s) [1] blocked",
            "ranks": [{"rank": 0, "state": "finished"},
                      {"rank": 1, "state": "blocked", "stderr_tail": stderr}]}


def test_a_hangs_cause_names_the_exception_a_blocked_rank_printed_during_it() -> None:
    """The decisive error of a hang is often a backend thread's (torchft's future handler:
    KeyError) printed on the blocked rank: the cause line says it, numbers generalised, so
    that hangs of one root cause read as one cause; what was printed before the instance
    began, or a warning, does not count."""
    printed = ("got unexpected error in future handler: 2\nTraceback (most recent call last):\n"
               "  File \"x.py\", line 1, in _future_handler\nKeyError: 2")
    assert cells.cause(_hang(printed)).endswith("; a blocked rank printed KeyError: N")
    earlier = f"KeyError: 2\n{ranklog.EARLIER}\nUserWarning is not an exception line"
    assert "printed" not in cells.cause(_hang(earlier))
    assert cells.cause(_hang(printed)) == cells.cause(_hang(printed.replace("2", "7")))
