"""collective-fuzz: bad input, faults found from scratch and their case files, Ctrl-C, and
the differential report read back as hostile input."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.fuzz.differential import BadReport, compare, load_digests, write_digests
from harness.mutate.faults import BACKEND, BACKEND_MODULE, ENV

from .helpers import HANG_S, signal_state, wait_for

ROOT = Path(__file__).resolve().parents[1]
FUZZ = [sys.executable, "-m", "harness.fuzz"]


def _fuzz(*args: str, fault: str | None = None, timeout: float = HANG_S,
          cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if fault:
        env[ENV] = fault
    return subprocess.run([*FUZZ, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout, check=False)


@pytest.mark.parametrize(("args", "names"), [
    (["--backend", "gloo", "--ops", "all_reduce,frobnicate"], "--ops"),
    (["--backend", "gloo", "--examples", "0"], "--examples"),
    (["--backend", "gloo", "--examples", "x\x1b"], "--examples"),
    (["--backend", "gloo", "--time", "-3m"], "--time"),
    (["--backend", "nosuchbackend"], "--backend"),
    (["--backend", "gloo", "--out", "/proc/version/x"], "--out"),
    (["--backend", "gloo", "--confirm-env", "X=1"], "--confirm-env"),
    (["--backend", "gloo", "--confirm-against", "nosuchbackend"], "--confirm-against"),
    # checked once, by the coordinator, before any lane's worker starts
    (["--backend", "gloo", "--lanes", "2", "--ops", "frobnicate"], "--ops"),
    (["--backend", "gloo", "--lanes", "17"], "--lanes"),
    # the range's ends are checked before it is expanded (this one built 10**11 sizes)
    (["--backend", "gloo", "--world-size", "1-100000000000"], "--world-size"),
    (["--backend", "gloo", "--world-size", "4-2"], "--world-size"),
])
def test_bad_input_is_one_line_naming_the_option(tmp_path: Path, args: list[str],
                                                 names: str) -> None:
    proc = _fuzz(*args, timeout=HANG_S, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert names in err
    assert "\x1b" not in err
    assert list(tmp_path.iterdir()) == []  # every option is checked before --out is made


FOUND = [
    ("nonzero_root_wrong", "broadcast", "wrong-values", 1),
    ("dropped_contribution", "reduce_scatter_tensor", "wrong-values", 1),
    # Two worker processes: each lane shrinks on its own; one case file for the signature.
    ("dropped_contribution", "reduce_scatter_tensor", "wrong-values", 2),
]
Found = tuple[str, str, str, int]


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory
          ) -> dict[Found, tuple[subprocess.CompletedProcess[str], list[Path]]]:
    """Each fault of FOUND fuzzed until found: the run and the case files it wrote."""
    runs = {}
    for fault, ops, outcome, lanes in FOUND:
        out = tmp_path_factory.mktemp("found") / f"{fault}-{lanes}"
        proc = _fuzz("--backend", BACKEND, "--backend-module", BACKEND_MODULE,
                     "--overrides-for", "gloo", "--lanes", str(lanes),
                     "--ops", ops, "--world-size", "2", "--examples", "300", "--seed", "3",
                     "--out", str(out), "--stop-at-first", "--shrink-time", "20s", "-q",
                     "--skip-signatures", f"{ops}:raise,{ops}:async-contract",
                     fault=fault)
        runs[(fault, ops, outcome, lanes)] = (proc, sorted(out.glob("*.yaml")))
    return runs


Replay = tuple[subprocess.CompletedProcess[str], dict[str, list[dict[str, Any]]]]


@pytest.fixture(scope="module")
def replays(found: dict[Found, tuple[subprocess.CompletedProcess[str], list[Path]]],
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Replay]:
    """The written case files run under pytest: behind each fault (``bad-FAULT``: the files
    found with it) and on Gloo (``good``: all of them), one session each instead of two per
    file. Each session's result and its records by case file (the file's path under the
    temporary folder, as :func:`_replayed` names it)."""
    base = tmp_path_factory.getbasetemp()
    where = tmp_path_factory.mktemp("replays")
    files = [f for _, cases in found.values() if len(cases) == 1 for f in cases]
    sessions: dict[str, tuple[list[str], dict[str, str], list[Path]]] = {
        "good": (["--backend", "gloo"], {}, files)}
    for (fault, *_), (_, cases) in found.items():
        bad = sessions.setdefault(f"bad-{fault}", (
            ["--backend-module", BACKEND_MODULE, "--backend", BACKEND], {ENV: fault}, []))
        bad[2].extend(cases if len(cases) == 1 else [])
    done: dict[str, Replay] = {}
    for name, (args, env, paths) in sessions.items():
        report = where / f"{name}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *map(str, paths), "-q", "-p", "no:cacheprovider",
             "--rootdir", str(base), "--report-json", str(report), "--report-md",
             str(where / f"{name}.md"), "--report-html", str(where / f"{name}.html"),
             "-o", "collective_baseline=", *args],
            env={**os.environ, **env}, capture_output=True, text=True, cwd=where,
            timeout=HANG_S, check=False)
        by_file: dict[str, list[dict[str, Any]]] = {}
        if report.exists():
            for rec in json.loads(report.read_text())["records"]:
                by_file.setdefault(rec["file"], []).append(rec)
        done[name] = (proc, by_file)
    return done


def _replayed(case_file: Path, base: Path) -> str:
    return case_file.relative_to(base).as_posix()


@pytest.mark.parametrize(("fault", "ops", "outcome", "lanes"), FOUND)
def test_a_fault_is_found_shrunk_and_written_as_a_failing_case(
        found: dict[Found, tuple[subprocess.CompletedProcess[str], list[Path]]],
        replays: dict[str, Replay], tmp_path_factory: pytest.TempPathFactory, fault: str,
        ops: str, outcome: str, lanes: int) -> None:
    proc, cases = found[(fault, ops, outcome, lanes)]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FINDING {ops}:{outcome}" in proc.stdout
    (case_file,) = cases
    text = case_file.read_text()
    # lane k of N draws with seed 3 + k (its later rounds stride by N)
    assert re.search(rf"Seed: {3 if lanes == 1 else '[34]'}\b", text), text
    assert "@reproduce_failure(" in text
    # The written case fails the same way under pytest behind the fault, passes on Gloo.
    mine = _replayed(case_file, tmp_path_factory.getbasetemp())
    bad, bad_records = replays[f"bad-{fault}"]
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert [r["outcome"] for r in bad_records.get(mine, [])] == ["failed"], bad.stdout[-2000:]
    assert any(ln.startswith(f"[FAILED] {mine}:") for ln in bad.stdout.splitlines()), \
        bad.stdout[-2000:]
    good, good_records = replays["good"]
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    assert [r["outcome"] for r in good_records.get(mine, [])] == ["passed"], \
        good.stdout[-2000:]


def test_against_reports_a_bit_level_difference(tmp_path: Path) -> None:
    # Gloo against the mutant whose last rank is one ulp off: random float sums over three
    # ranks have no single expected value (uncheckable on both sides), so only the
    # bit-for-bit comparison can see it.
    out = tmp_path / "d"
    proc = _fuzz("--backend", "gloo", "--against", BACKEND, "--backend-module",
                 BACKEND_MODULE, "--ops", "all_reduce", "--world-size", "3", "--examples",
                 "300", "--seed", "1", "--out", str(out), "--stop-at-first", "--shrink-time",
                 "15s", "-q", "--skip-signatures",
                 "all_reduce:raise,all_reduce:async-contract,all_reduce:wrong-values",
                 fault="last_rank_ulp", timeout=HANG_S)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FINDING all_reduce:differs" in proc.stdout
    assert "outputs differ bit for bit from backend mutant" in proc.stdout
    (case_file,) = out.glob("*.yaml")
    assert "generator: random" in case_file.read_text()


def test_confirm_against_sets_apart_what_fails_without_the_fault(tmp_path: Path) -> None:
    # Without the bundled overrides, bitwise reductions of floats raise on Gloo itself: with
    # the faithful wrapper as the confirming backend they are "also fails without the
    # fault", never a finding, and the fault's own wrong values are still found.
    out = tmp_path / "c"
    proc = _fuzz("--backend", BACKEND, "--backend-module", BACKEND_MODULE, "--no-bundled",
                 "--confirm-against", BACKEND, "--confirm-env", f"{ENV}=none",
                 "--ops", "all_reduce", "--world-size", "2", "--examples", "300", "--seed",
                 "0", "--out", str(out), "--stop-at-first", "--shrink-time", "15s", "-q",
                 fault="large_all_reduce_wrong", timeout=HANG_S)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ALSO FAILS WITHOUT THE FAULT all_reduce:raise" in proc.stdout
    assert "FINDING all_reduce:wrong-values" in proc.stdout
    assert "FINDING all_reduce:raise" not in proc.stdout
    assert [p.name for p in out.glob("*.yaml")] == ["all_reduce_wrong_values.yaml"]
    assert list((out / "also-fails").glob("all_reduce_raise*.yaml"))


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            out |= {child} | _children(child)
    return out


@pytest.mark.parametrize("lanes", [1, 2])
def test_ctrl_c_prints_the_summary_and_leaves_no_rank(tmp_path: Path, lanes: int) -> None:
    proc = subprocess.Popen([*FUZZ, "--backend", "gloo", "--time", "5m", "--world-size", "2",
                             "--out", str(tmp_path / "o"), "--ops", "all_reduce",
                             "--lanes", str(lanes)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    seen: set[int] = set()
    for line in proc.stderr:  # progress lines: instances are running on a live pool
        seen |= _children(proc.pid)
        if "instances (" in line and len(seen) >= 2:
            break
    assert len(seen) >= 2  # the forkserver and the ranks were there
    state = signal_state(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, state
    assert "collective-fuzz summary (interrupted)" in out and "all_reduce" in out

    def alive() -> set[int]:
        out = set()
        for p in seen:
            try:
                state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                out.add(p)
        return out

    # The forkserver exits when its parent's pipe closes, the ranks when their owner ends.
    wait_for(lambda: alive() == set(), HANG_S, "every process the run started to end")


def test_digests_report_round_trip_and_hostile_input(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    key = "ab" * 32
    write_digests(str(path), {key: {"0/tensor": "00ff"}}, {"torch": "2.13.0"})
    digests, meta = load_digests(str(path))
    assert digests == {key: {"0/tensor": "00ff"}} and meta["torch"] == "2.13.0"
    assert compare({"0/tensor": "00ff"}, digests[key], "x") == ""
    assert "differ bit for bit" in compare({"0/tensor": "00fe"}, digests[key], "x")
    bad_docs = ["[]", "{\"schema\": \"other\"}", "not json",
                json.dumps({"schema": "collective-fuzz-digests/1", "instances": []}),
                json.dumps({"schema": "collective-fuzz-digests/1",
                            "instances": {key: {"../../x": "00"}}}),
                json.dumps({"schema": "collective-fuzz-digests/1",
                            "instances": {"zz": {"0/t": "00"}}})]
    for i, text in enumerate(bad_docs):
        p = tmp_path / f"bad{i}.json"
        p.write_text(text)
        with pytest.raises(BadReport):
            load_digests(str(p))
    p.write_text(text)
    proc = _fuzz("--backend", "gloo", "--against-report", str(p), "--out",
                 str(tmp_path / "o"), timeout=HANG_S)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _small() -> None:
    # Past a bound, the reader fails here with a MemoryError instead of filling the machine.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("kind", ["fifo", "device", "huge-integer", "duplicate-key"])
def test_against_report_reads_only_a_bounded_regular_file(tmp_path: Path, kind: str) -> None:
    """A FIFO blocked the start forever, /dev/zero filled memory, a long integer gave a
    traceback, a repeated key hid the first: each is one line naming the file. (In a child,
    with a timeout: a regression fails the test instead of hanging it.)"""
    path = tmp_path / "r.json"
    head = '{"schema": "collective-fuzz-digests/1", "instances": {}, '
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "huge-integer":
        path.write_text(head + '"n": ' + "9" * 5000 + "}")
    else:
        path.write_text(head + '"instances": {}}')
    code = ("import sys\nfrom harness.fuzz.differential import BadReport, load_digests\n"
            "try:\n    load_digests(sys.argv[1])\nexcept BadReport as e:\n    print(e)\n"
            "    raise SystemExit(2)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=HANG_S, preexec_fn=_small, check=False)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stdout.splitlines()) == 1 and proc.stdout.startswith(f"{path}: ")
    assert {"fifo": "not a regular file", "device": "not a regular file",
            "huge-integer": "not valid JSON", "duplicate-key": "'instances' appears twice"
            }[kind] in proc.stdout


def test_a_file_where_the_example_database_goes_is_an_error(tmp_path: Path) -> None:
    """Hypothesis saved nothing into a file at --out/.hypothesis and said nothing: a run
    would never replay its findings. It is refused before anything runs."""
    out = tmp_path / "o"
    out.mkdir()
    (out / ".hypothesis").write_text("not a folder")
    proc = _fuzz("--backend", "gloo", "--out", str(out), "--examples", "1", timeout=HANG_S)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"--out: {out / '.hypothesis'} is not a folder; it is where the example database " \
        "goes" in err


LIBRARY_GATHER = """
cases:
  - name: gather_v
    op: gather
    world_size: [2, 3]
    args: {dst: [0, "world_size - 1"]}
    entry_shape: ["j + 1"]
    input: "rank * 100 + i"
    overrides:
      - when: {backend: gloo, args: {dst: "world_size - 1"}, world_size: 2}
        raises: {match: "invalid tensor size", ranks: [1], others: [blocked]}
        reason: the last root at world size 2
      - when: {backend: gloo}
        raises: {match: "invalid tensor size", ranks: [dst], others: [blocked]}
        reason: the root, whichever it is
"""


def test_known_overrides_naming_a_root_by_an_expression_absorb_the_number(
        tmp_path: Path) -> None:
    """A library names Gloo's rejected uneven gather root as dst: world_size - 1; a generated
    instance has dst: 1 at world size 2: the override must apply to it (else a known Gloo
    rejection comes back as a finding on every run). Issue 43.8: the shared override
    matcher evaluates the expression, not the fuzzer, so a case that writes the number is
    matched under pytest too, and the other way round; and an override that names the
    raising rank as the root (ranks: [dst]) holds for every root and world size."""
    from harness.casefile.overrides import override_applies, resolve
    from harness.fuzz.known import load_library

    from .helpers import case_instances

    (tmp_path / "uneven.yaml").write_text(LIBRARY_GATHER)
    known, broken = load_library([str(tmp_path / "uneven.yaml")])
    assert not broken and len(known) == 2
    by_expression, by_root = (k.override for k in known)

    def gather_at(ws: int, dst: str) -> Any:
        return next(iter(case_instances(
            f"cases:\n  - name: g\n    op: gather\n    world_size: {ws}\n    shape: [4]\n"
            f"    input: {{generator: ranks}}\n    args: {{dst: {dst}}}\n")))

    o = by_expression
    assert override_applies(o, gather_at(2, "1"), "2.13.0")  # the number the fuzzer draws
    assert override_applies(o, gather_at(2, '"world_size - 1"'), "2.13.0")  # as written
    assert not override_applies(o, gather_at(2, "0"), "2.13.0")
    assert not override_applies(o, gather_at(3, "2"), "2.13.0")  # world_size: 2 only
    # an override that writes the number matches a case that writes the expression
    numbered = replace(o, when=tuple((k, (1,) if k == "args.dst" else v) for k, v in o.when))
    assert override_applies(numbered, gather_at(2, '"world_size - 1"'), "2.13.0")
    assert not override_applies(numbered, gather_at(2, '"world_size - 2"'), "2.13.0")
    # the root's rank, at a world size and root the library never ran
    middle = replace(gather_at(4, "1"), overrides=(by_root,))
    assert resolve(middle, "2.13.0").expectation.ranks == (1,)


def test_generated_documents_load_as_through_the_case_file_loader() -> None:
    """The executor composes its own documents with libyaml (load_generated_text): for every
    drawn document the values, positions and instances must be those of the case-file
    loader, and a malformed one must fail with the loader's own message."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hyp_seed

    from harness.casefile import expand, load, validate
    from harness.errors import CaseFileError, CaseFileErrors
    from harness.fuzz import space

    def instances(doc: load.Document) -> str:
        """The instances, every field (an expression's parsed tree has no equality of its
        own: its source and names are compared), or the error."""
        try:
            found = [i for c in validate.load_cases(doc) for i in expand.expand(c, "gloo")]
        except (CaseFileError, CaseFileErrors, ValueError) as exc:
            return str(exc)
        return re.sub(r" at 0x[0-9a-f]+", "", repr(found))

    drawn = 0

    @hyp_seed(0)
    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(space.cases(space.DEFAULT_OPS, (1, 2, 3, 4)))
    def same(case: dict[str, object]) -> None:
        nonlocal drawn
        text = space.render_case(case)
        fast, real = load.load_generated_text(text, "f.yaml"), load.load_text(text, "f.yaml")
        assert (fast.data, fast.positions, fast.key_positions) == (
            real.data, real.positions, real.key_positions)
        assert instances(fast) == instances(real)
        drawn += 1

    same()
    assert drawn >= 100
    for bad in ("cases:\n  - name: a\n    name: b\n", "cases: [\n", "cases:\n  - x: yes\n"):
        with pytest.raises(CaseFileError) as fast_err:
            load.load_generated_text(bad, "f.yaml")
        with pytest.raises(CaseFileError) as real_err:
            load.load_text(bad, "f.yaml")
        assert str(fast_err.value) == str(real_err.value)


def test_the_reproduction_names_the_backend_module_and_a_raise_its_exception(
        tmp_path: Path) -> None:
    """A third-party backend exists only once its module is imported: a finding's commands
    name every --backend-module, and a raise finding says what was raised."""
    out = tmp_path / "found"
    proc = _fuzz("--backend", "sticky", "--backend-module", "tests.sticky_backend",
                 "--no-bundled", "--ops", "reduce", "--world-size", "1-2", "--examples", "50",
                 "--seed", "1", "--out", str(out), "--stop-at-first", "--shrink-time", "10s",
                 "-q")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    raised = "RuntimeError: sticky: No backend type associated with device type cpu"
    assert "FINDING reduce:raise" in proc.stdout and f"raised {raised}" in proc.stdout
    (case_file,) = out.glob("*.yaml")
    text = " ".join(case_file.read_text().split())
    assert f"raise in reduce ({raised})." in text
    assert ("collective-fuzz --backend sticky --backend-module tests.sticky_backend --ops "
            "reduce --world-size 1,2 --seed 1") in text
    command = re.search(r"Run it: pytest (\S+) (--backend sticky --backend-module "
                        r"tests\.sticky_backend)\.", text)
    assert command is not None and command.group(1) == str(case_file), text
    again = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                            "--no-report", command.group(1), *command.group(2).split()],
                           capture_output=True, text=True, cwd=ROOT, timeout=HANG_S, check=False,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert again.returncode == 1 and raised in again.stdout, again.stdout[-2000:]


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "all_gather_into_tensor"])
def test_no_offset_is_drawn_where_the_case_file_checks_refuse_it(op: str) -> None:
    """Issue 43.8: about six documents a minute were "not valid (a fuzzer bug)": an offset
    drawn for a buffer of fewer elements than the offset (a 1-element, 0-dim or empty one)
    or together with a layout, both of which the case-file checks refuse. Hypothesis looks
    for such a document and must find none."""
    import math

    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    from harness.fuzz import space

    def refused(case: dict[str, Any]) -> bool:
        return "offset" in case and (math.prod(case.get("shape", ())) <= case["offset"]
                                     or "layout" in case)

    with pytest.raises(NoSuchExample):
        find(space.shorthand_case(op, 2), refused,
             settings=settings(max_examples=3000, derandomize=True, database=None,
                               suppress_health_check=list(HealthCheck)))
