"""Certify a backend: the manifest's rules, the identity step, the hang breaker, the
certificate's cells and level, and ``collective-certify`` end to end on a flawed backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.casefile.load import load_text
from harness.certify import cells
from harness.errors import CaseFileError
from harness.manifest.load import error_line, parse
from tests.helpers import HANG_S

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "tests" / "data" / "certify" / "library.yaml"


def manifest(text: str) -> Any:
    return parse(load_text(text, "m.yaml"))


@pytest.mark.parametrize("text, where, words", [
    ("backend: x\ninherit: gloo\n", "m.yaml:2:1", "did you mean 'inherits'"),
    ("backend: x\nops: [p2p]\n", "m.yaml:2:1", "'ops' belongs under 'supports:'"),
    ("backend: x\nsupports: {ops: [all_reduse]}\n", "m.yaml:2:18", "did you mean 'all_reduce'"),
    ("backend: x\nsupports: {subgroups: maybe}\n", "m.yaml:2:23", "is not true or false"),
    ("backend: x\ninherits: x\n", "m.yaml:2:11", "cannot inherit from itself"),
    ("- backend\n", "m.yaml:1:1", "a manifest is a mapping"),
    ("supports: {}\n", "m.yaml:1:1", "'backend' is required"),
    ("backend: \"a\\x07b\"\n", "m.yaml:1:10", "holds the character U+0007"),
    ("backend: \"a b\"\n", "m.yaml:1:10", "is not a name"),
    ("backend: x\nsupports: {dtypes: [float33]}\n", "m.yaml:2:21", "did you mean 'float32'"),
])
def test_a_bad_manifest_is_one_line_at_its_place(text: str, where: str, words: str) -> None:
    with pytest.raises(CaseFileError) as err:
        manifest(text)
    line = error_line(err.value)
    assert line.startswith(where) and words in line and "\n" not in line


def test_a_manifest_claims_what_it_leaves_unsaid() -> None:
    m = manifest("backend: x\ninherits: gloo\nsupports: {ops: [p2p, all_reduce], "
                 "subgroups: false, dtypes: [fp32]}\n")
    assert m.ops == {"p2p", "all_reduce"} and m.dtypes == {"float32"}
    assert m.reduce_ops is None and m.unsupported == {"subgroups"} and m.inherits == "gloo"


def run(*args: str, fault: str = "none", cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CERT_FAULT": fault}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=HANG_S, check=False)


def session(tmp_path: Path, *args: str, fault: str = "none") -> dict[str, Any]:
    report = tmp_path / f"r-{fault}.json"
    proc = run("-m", "pytest", str(LIBRARY), "-q", "-p", "no:cacheprovider",
               "--rootdir", str(tmp_path), f"--report-json={report}",
               f"--report-md={tmp_path / 'r.md'}", f"--report-html={tmp_path / 'r.html'}",
               "--backend-module", "tests.certify_backend", *args, fault=fault)
    assert report.exists(), proc.stdout + proc.stderr
    return dict(json.loads(report.read_text()))


def by_case(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["case"]: r for r in report["records"]}


GAP = ("backend: certfake\ninherits: gloo\nsupports: {ops: [all_reduce, broadcast]}\n"
       "reasons: {gather: not implemented yet}\n")


@pytest.fixture(scope="module")
def faithful(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The library on the faithful certfake under the GAP manifest, run once: the folder
    (its report is r-none.json) and the report; two tests read it."""
    where = tmp_path_factory.mktemp("faithful")
    (where / "m.yaml").write_text(GAP)
    return where, session(where, f"--manifest={where / 'm.yaml'}")


def test_a_declared_gap_must_be_rejected_and_is_neither_pass_nor_failure(
        tmp_path: Path, faithful: tuple[Path, dict[str, Any]]) -> None:
    (tmp_path / "m.yaml").write_text(GAP)
    rejected = by_case(session(tmp_path, f"--manifest={tmp_path / 'm.yaml'}",
                               fault="no_gather"))
    assert rejected["gather"]["outcome"] == "limitation"
    assert rejected["gather"]["unsupported"] == ["op gather"]
    assert cells.status(rejected["gather"]) == "unsupported as declared"
    assert "not implemented yet" in rejected["gather"]["reason"]
    # A backend that computes what it declares unsupported did not reject it: a failure.
    computed = by_case(faithful[1])
    assert computed["gather"]["outcome"] == "failed"
    assert "not rejected" in computed["gather"]["message"]
    assert cells.status(computed["gather"]) == "not rejected"
    # The wrapped backend's override applies, reported as inherited.
    known = computed["gloo_known"]
    assert known["outcome"] == "limitation" and cells.status(known) == "inherited divergence"
    assert known["overrides_applied"][0]["inherited"] is True
    assert "op all_reduce" in known["needs"] and "reduce_op product" in known["needs"]


def test_a_claim_the_backend_breaks_is_a_broken_promise(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("backend: certfake\ninherits: gloo\n")
    rep = session(tmp_path, f"--manifest={tmp_path / 'm.yaml'}", fault="wrong_broadcast")
    assert cells.status(by_case(rep)["broadcast"]) == "broken promise"
    cert = cells.certificate(None, rep, None)
    assert cert["level"] == "none"
    bad = [c for c in cert["cells"] if c["status"] == "broken promise"]
    assert [c["op"] for c in bad] == ["broadcast"]
    assert cert["causes"][0]["count"] == 1 and "broadcast" in cert["causes"][0]["cause"]


def test_without_inherits_gloo_known_behaviour_is_the_backends_own(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("backend: certfake\n")
    rec = by_case(session(tmp_path, f"--manifest={tmp_path / 'm.yaml'}"))["gloo_known"]
    assert rec["outcome"] == "failed" and "overrides_applied" not in rec


def test_the_breaker_skips_what_hung_and_names_the_instance(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("backend: certfake\n")
    lib = tmp_path / "two_gathers.yaml"
    lib.write_text("cases:\n"
                   "  - {name: a, op: gather, world_size: 2, input: 'rank', shape: [2],"
                   " args: {dst: 0}}\n"
                   "  - {name: b, op: gather, world_size: 2, input: 'rank', shape: [3],"
                   " args: {dst: 1}}\n"
                   "  - {name: d, op: gather, world_size: 2, input: 'rank', shape: [5],"
                   " args: {dst: 1}}\n"
                   "  - {name: c, op: all_reduce, world_size: 2, input: 'rank', shape: [2]}\n")
    report = tmp_path / "r.json"
    proc = run("-m", "pytest", str(lib), "-q", "-p", "no:cacheprovider", "--rootdir",
               str(tmp_path),
        f"--report-json={report}", f"--report-md={tmp_path / 'r.md'}",
        f"--report-html={tmp_path / 'r.html'}", "--backend-module", "tests.certify_backend",
        f"--manifest={tmp_path / 'm.yaml'}", "--after-hang=skip", "--deadline=3",
        fault="hang_gather")
    recs = by_case(json.loads(report.read_text()))
    # One hang may be the case's own doing; hangs in two cases trip the breaker.
    assert recs["a"]["outcome"] == "hang" and recs["b"]["outcome"] == "hang"
    assert recs["d"]["outcome"] == "skipped"
    assert recs["d"]["reason"].startswith("blocked: op gather hung in ")
    assert recs["a"]["key"] in recs["d"]["reason"] and recs["b"]["key"] in recs["d"]["reason"]
    assert recs["c"]["outcome"] == "passed"  # what did not hang still runs
    assert cells.status(recs["d"]) == "blocked"
    # The session says once, in one line, that it stops sending gather to the backend.
    said = [ln for ln in proc.stdout.splitlines() if "--after-hang skip:" in ln]
    assert len(said) == 1, proc.stdout
    assert said[0].startswith("collective-harness: --after-hang skip: the ranks hung in 2 cases")
    assert "op gather is sent to this backend no more" in said[0]
    assert recs["a"]["key"] in said[0] and recs["b"]["key"] in said[0]
    # collective-certify repeats it before the verdict it shows of each session.
    from harness.certify.cli import worth_repeating
    shown = worth_repeating(proc.stdout)
    assert shown[0] == said[0] and shown[1].startswith("collective-harness: FAIL: ")


@pytest.fixture(scope="module")
def lying(tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """collective-certify on the certfake whose ranks all answer rank() 0, run once: its
    folder and result. The end-to-end test reads the certificate; the identity test reads the
    identity session's report in the folder (it ran that session on its own before)."""
    where = tmp_path_factory.mktemp("lying")
    (where / "m.yaml").write_text("backend: certfake\nmodule: tests.certify_backend\n"
                                  "inherits: gloo\n")
    out = where / "cert"
    proc = run("-m", "harness.certify", "--manifest", str(where / "m.yaml"),
               "--cases", str(LIBRARY), "--out", str(out), "--no-reference",
               fault="rank_zero")
    return out, proc


def test_identity_finds_a_rank_that_lies(
        lying: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    rep = json.loads((lying[0] / "identity.json").read_text())
    world = {**rep, "records": [r for r in rep["records"] if r["case"] == "world_identity"]}
    assert len(world["records"]) == 2  # world sizes 2 and 3
    problems = cells.identity_problems(world)
    assert problems and "expected dist.get_rank(group) = 1 got 0" in problems[0]
    assert all(r["outcome"] == "failed" for r in world["records"])


def record(outcome: str, **extra: Any) -> dict[str, Any]:
    return {"key": f"f::c[{outcome}{len(extra)}]", "case": "c", "id": "x", "op": "all_reduce",
            "dtype": "float32", "outcome": outcome, "message": "", **extra}


def test_too_many_skips_is_no_certificate_whatever_passed() -> None:
    recs = [record("passed") for _ in range(18)] + [
        record("skipped", reason="no CUDA device on this machine") for _ in range(2)]
    lib = {"records": recs, "session": {"complete": True}, "metadata": {}}
    ok_identity = {"records": [record("passed")], "session": {"complete": True}}
    assert cells.certificate(ok_identity, lib, None, budget=0.10)["level"] == "conforming"
    refused = cells.certificate(ok_identity, lib, None, budget=0.05)
    assert refused["level"] == "none" and "over the skip budget" in refused["why"][0]
    # An incomplete library session, or identity probes that did not run, are no certificate.
    assert cells.certificate(None, lib, None, budget=0.1)["level"] == "none"
    partial = {**lib, "session": {"complete": False}}
    assert cells.certificate(ok_identity, partial, None, budget=0.1)["level"] == "none"


def test_own_divergences_make_the_level_declared() -> None:
    recs = [record("passed"), record("limitation", overrides_applied=[
        {"line": 3, "reason": "r", "patched": ["raises"]}])]
    lib = {"records": recs, "session": {"complete": True}, "metadata": {}}
    ident = {"records": [record("passed")], "session": {"complete": True}}
    cert = cells.certificate(ident, lib, None)
    assert cert["level"] == "declared" and cells.meets(cert, "declared")
    assert not cells.meets(cert, "conforming")


def test_certify_end_to_end_leads_with_identity(
        lying: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = lying
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["level"] == "none" and cert["why"][0].startswith("identity: world_identity")
    page = (out / "certificate.md").read_text()
    assert page.index("## Identity") < page.index("## Cells")
    assert "The backend's identity is wrong" in page


def test_without_a_manifest_the_proposal_is_right_for_a_backend_lacking_gather(
        tmp_path: Path) -> None:
    """One probe per op of the table: the three ops that reach the backend's gather are
    declared unsupported with its own error, every other op is claimed, and what was not
    probed here (a probe this torch skips) is named as such in the proposal."""
    from harness import ops
    from harness.manifest.load import read

    out = tmp_path / "cert"
    proc = run("-m", "harness.certify", "--backend", "certfake", "--backend-module",
               "tests.certify_backend", "--cases", str(LIBRARY), "--out", str(out),
               "--no-reference", fault="no_gather")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a proposal certifies nothing
    m = read(str(out / "manifest.proposed.yaml"))
    lacking = {"gather", "gather_object", "pg.gather"}
    assert m.ops == frozenset(ops.ALL_OPS) - lacking
    for op in lacking:
        assert "RuntimeError: certfake does not implement gather" in m.reason(op), op
    skipped = sorted(r["case"] for r in json.loads((out / "probes.json").read_text())["records"]
                     if r["outcome"] == "skipped")
    text = (out / "manifest.proposed.yaml").read_text()
    said = " ".join(ln[2:] for ln in text.splitlines() if ln.startswith("# "))
    assert ("Not probed, claimed unverified (the library will tell): " + ", ".join(skipped)
            if skipped else "Every op of the op table was probed.") in said
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["manifest_proposed"] and cert["level"] == "none"
    gather = [c for c in cert["cells"] if c["op"] == "gather"]
    assert [c["status"] for c in gather] == ["unsupported as declared"]


@pytest.mark.parametrize("args, words", [
    (["--manifest", "nope.yaml"], "--manifest: nope.yaml:1:1: cannot read the file"),
    (["--backend", "gloo", "--cases", "no/such"], "--cases no/such: no such file"),
    ([], "give --manifest FILE"),
    (["--backend", "gloo", "--skip-budget", "2"], "a share from 0 to 1"),
])
def test_certify_bad_input_is_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    proc = run("-m", "harness.certify", *args, "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert proc.returncode == 2
    assert words in proc.stderr and "Traceback" not in proc.stderr


def test_the_gate_requires_the_certificate_level(
        tmp_path: Path, faithful: tuple[Path, dict[str, Any]]) -> None:
    report, baseline = faithful[0] / "r-none.json", tmp_path / "base.json"
    assert run("-m", "harness.gate", str(report), str(baseline), "--update").returncode == 0
    cert = {"level": "none", "backend": "certfake", "why": ["identity: rank 1 answers 0"]}
    (tmp_path / "c.json").write_text(json.dumps(cert))
    gate = ("-m", "harness.gate", str(report), str(baseline), "--certificate",
            str(tmp_path / "c.json"))
    failed = run(*gate)
    assert failed.returncode == 1 and "level none, required declared: FAIL" in failed.stdout
    assert "identity: rank 1 answers 0" in failed.stdout
    (tmp_path / "c.json").write_text(json.dumps({**cert, "level": "declared", "why": []}))
    assert run(*gate).returncode == 0
    assert run(*gate, "--require-level", "conforming").returncode == 1
    (tmp_path / "c.json").write_text(json.dumps({**cert, "backend": "other"}))
    other = run(*gate)
    assert other.returncode == 2 and "a certificate for other" in other.stderr


def test_torchft_through_the_shipped_adapter_leads_with_its_rank(tmp_path: Path) -> None:
    """torchft's ProcessGroupGloo, from PyPI, certified on a small library: its identity fails
    first, and a declared gap (gather) is rejected as declared."""
    out = tmp_path / "cert"
    proc = run("-m", "harness.certify", "--manifest",
               str(REPO / "examples" / "backends" / "torchft-gloo.yaml"),
               "--cases", str(LIBRARY), "--out", str(out), "--no-reference")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["why"][0].startswith("identity: world_identity")
    assert "expected dist.get_rank(group) = 1 got 0" in cert["identity"]["problems"][0]
    gather = [c for c in cert["cells"] if c["op"] == "gather"]
    assert gather and all(c["status"] == "unsupported as declared" for c in gather)
    assert [c["status"] for c in cert["cells"] if c["op"] == "broadcast"] == ["conforming"]
    # Gloo's pretend divergence reaches torchft through inherits: gloo.
    assert [c["status"] for c in cert["cells"] if c["op"] == "all_reduce"] == [
        "inherited divergence"]


def test_the_torchft_reproduction_shows_each_documented_deviation() -> None:
    proc = run(str(REPO / "ci" / "torchft" / "deviations_repro.py"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "process 1: rank(): 0 DEVIATES (expected 1)" in proc.stdout
    assert "allreduce(tensors) without options: DEVIATES" in proc.stdout
    assert "is_completed() = False DEVIATES" in proc.stdout
    assert "all_reduce after set_timeout(2 s), peer 8 s late: completed" in proc.stdout


def test_the_fuzzer_takes_the_manifest(tmp_path: Path) -> None:
    """A declared gap is no finding for collective-fuzz, and a bad manifest is one line."""
    (tmp_path / "m.yaml").write_text("backend: certfake\nmodule: tests.certify_backend\n"
                                     "inherits: gloo\nsupports: {ops: [all_reduce]}\n")
    out = tmp_path / "f"
    proc = run("-m", "harness.fuzz", "--backend", "certfake", "--manifest",
               str(tmp_path / "m.yaml"), "--ops", "gather", "--examples", "4",
               "--world-size", "2", "--out", str(out), fault="no_gather")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 finding(s)" in proc.stdout and "limitation" in proc.stdout
    (tmp_path / "bad.yaml").write_text("backend: certfake\nsupports: {ops: [gathr]}\n")
    bad = run("-m", "harness.fuzz", "--backend", "certfake", "--manifest",
              str(tmp_path / "bad.yaml"), "--out", str(out))
    assert bad.returncode == 2 and "--manifest: " in bad.stderr and ":2:" in bad.stderr
    assert "did you mean 'gather'" in bad.stderr and "Traceback" not in bad.stderr


SUBGROUP_UINT16 = """cases:
  - name: fuzz
    op: all_reduce
    world_size: 3
    dtype: uint16
    shape: [3]
    input: "rank"
    expected: auto
    args: {group: [1, 2]}
"""


@pytest.mark.parametrize("inherits", [True, False])
def test_the_fuzzer_reads_a_gloo_limitation_on_a_subgroup_as_inherited(
        tmp_path: Path, inherits: bool) -> None:
    """Issue 39.7d: a Gloo limitation met on a subgroup (rank 0 outside it, so not every
    rank raises) is known behaviour of a backend whose manifest inherits Gloo: absorbed by
    the bundled Gloo override, never a finding; without ``inherits`` it is the backend's own."""
    from harness.fuzz import options
    from harness.fuzz.session import Session

    (tmp_path / "m.yaml").write_text("backend: certfake\nmodule: tests.certify_backend\n"
                                     + ("inherits: gloo\n" if inherits else ""))
    args = options.parser().parse_args(["--backend", "certfake", "--manifest",
                                        str(tmp_path / "m.yaml"), "--ops", "all_reduce",
                                        "--out", str(tmp_path / "f")])
    session = Session(args, options.check(args))
    try:
        ran = session.executor.run_text(SUBGROUP_UINT16)
    finally:
        session.close()
    assert args.overrides_for == ("gloo" if inherits else None)
    assert ran.outcome == "error" and "ranks 1-2: RuntimeError" in ran.message, ran.message
    if inherits:
        assert "all_reduce.yaml:" in ran.absorbed_by and not ran.bad
        assert "Gloo's collectives handle only" in session.known.reasons[ran.absorbed_by]
    else:
        assert ran.absorbed_by == "" and ran.bad


def test_the_breaker_trips_on_two_cases_and_never_on_a_case_of_its_own_setting() -> None:
    from harness.model import InstanceResult, RankState
    from harness.runner.breaker import Breaker
    from tests.helpers import case_instances

    def hung() -> InstanceResult:
        return InstanceResult("hang", "", states=[RankState(0, "blocked", step=0)])

    plain = case_instances("""
cases:
  - {name: a, op: all_reduce, world_size: 2, input: "rank", shape: [2]}
  - {name: b, op: all_reduce, world_size: 2, input: "rank", shape: [3]}
""")
    special = case_instances("""
cases:
  - {name: a, op: all_reduce, world_size: 2, input: "rank", shape: [2],
     env: {TORCH_DISTRIBUTED_DEBUG: DETAIL}}
  - {name: b, op: all_reduce, world_size: 2, input: "rank", shape: [3],
     env: {TORCH_DISTRIBUTED_DEBUG: DETAIL}}
""")
    breaker = Breaker()
    for inst in special:
        breaker.observe(inst, hung())
    assert not breaker.tripped and not breaker.blocked(plain[0])
    breaker.observe(plain[0], hung())
    assert not breaker.blocked(plain[1])  # one case is not enough
    breaker.observe(plain[1], hung())
    assert breaker.blocked(plain[0]).startswith("blocked: op all_reduce hung in ")


def test_a_hang_waiting_for_async_work_stops_the_async_op_only() -> None:
    """torchft's BabyGloo loses futures held in flight (futures_in_flight and
    works_waited_out_of_order hang in their wait and future steps) while its blocking
    all_reduce completes: the two hangs stop async all_reduce, not every all_reduce."""
    from harness.model import InstanceResult, RankState
    from harness.runner.breaker import Breaker
    from tests.helpers import case_instances

    held, out_of_order, sync, other_async = case_instances("""
cases:
  - name: held
    world_size: 2
    tensors: {a: {shape: [2], init: "rank"}}
    steps:
      - {op: all_reduce, tensor: a, async: true, handle: ha}
      - {future: ha, tensor: a, held: true}
      - {wait: ha}
    expected: {a: 1}
  - name: out_of_order
    world_size: 2
    tensors: {a: {shape: [2], init: "rank"}, b: {shape: [2], init: "rank"}}
    steps:
      - {op: all_reduce, tensor: a, async: true, handle: ha}
      - {op: all_reduce, tensor: b, async: true, handle: hb}
      - {wait: hb}
      - {wait: ha}
    expected: {a: 1, b: 1}
  - {name: sync, op: all_reduce, world_size: 2, input: "rank", shape: [2]}
  - {name: other_async, op: all_reduce, world_size: 2, input: "rank", shape: [2], async: true}
""")
    breaker = Breaker()
    breaker.observe(held, InstanceResult("hang", "", states=[RankState(0, "blocked", step=1)]))
    breaker.observe(out_of_order,
                    InstanceResult("hang", "", states=[RankState(1, "blocked", step=3)]))
    assert breaker.blocked(sync) == ""
    assert breaker.blocked(other_async).startswith(
        "blocked: op all_reduce with capability async hung in ")
    assert breaker.news() == [
        "--after-hang skip: the ranks hung in 2 cases (" + held.key + " and "
        + out_of_order.key + "), so op all_reduce with capability async is sent to this "
        "backend no more: later instances that need it are skipped as blocked"]


def test_the_breaker_stops_subgroups_whose_groups_never_form() -> None:
    """Ranks blocked while an instance's groups are made (before its first step, or in a
    new_group step) hung on subgroups, not on the op: subgroup instances of any op are
    blocked then, the same ops on the world group still run."""
    from harness.model import InstanceResult, RankState
    from harness.runner.breaker import Breaker
    from tests.helpers import case_instances

    a, b, c, world = case_instances("""
cases:
  - {name: a, op: all_reduce, world_size: 3, input: "rank", shape: [2], args: {group: [0, 1]}}
  - name: b
    world_size: 2
    tensors: {t: {shape: [2], init: "rank"}}
    steps: [{new_group: mine, subgroups: 2}, {op: broadcast, tensor: t, src: 0, group: mine}]
    expected: {t: "0"}
  - {name: c, op: all_gather, world_size: 3, input: "rank", shape: [2], args: {group: [1, 2]}}
  - {name: world, op: all_reduce, world_size: 2, input: "rank", shape: [2]}
""")
    breaker = Breaker()
    breaker.observe(a, InstanceResult("hang", "", states=[RankState(0, "blocked", step=-1)]))
    assert not breaker.blocked(c) and breaker.news() == []
    breaker.observe(b, InstanceResult("hang", "", states=[RankState(1, "blocked", step=0)]))
    assert breaker.blocked(c).startswith("blocked: capability subgroups hung in ")
    assert a.key in breaker.blocked(c) and b.key in breaker.blocked(c)
    assert not breaker.blocked(world)  # all_reduce itself never hung
    news = breaker.news()
    assert len(news) == 1 and "hung while their groups were made" in news[0]
    assert "capability subgroups is sent to this backend no more" in news[0]
    # Said once: more hangs on the same need add nothing to say.
    breaker.observe(c, InstanceResult("hang", "", states=[RankState(1, "blocked", step=-1)]))
    assert breaker.news() == []
