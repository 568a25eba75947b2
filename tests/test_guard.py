"""collective-guard: what it checks, that it changes nothing, and how it fails.

Unit level (no processes): the exact digest finds and locates a flipped bit; the linear
checksum's bound passes honest bf16/fp16 rounding in any summation order and fails a dropped
contribution in the right chunk; hostile settings are one line. End to end (two Gloo ranks):
parameters bit-identical with and without the guard; an injected fault localised to the
receiving rank, the sender and the element, its case file replaying under pytest; a failing
side channel disables the guard with one line and the job succeeds; an aborting rank's finding
is on disk; no process is left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from harness.guard import check, digest
from harness.guard.cli import main
from harness.guard.settings import ENV, SettingsError, from_env

from .helpers import HANG_S

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _guard(tmp: Path, *opts: str, script: str = "tests/guard_train.py",
           extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([PY, "-m", "harness.guard", "--findings", str(tmp / "findings"),
                           *opts, "--", PY, script, *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=HANG_S, check=False)


def _left_behind(tag: str) -> list[int]:
    """Processes whose environment names this test's findings folder."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if tag.encode() in (proc / "environ").read_bytes():
                left.append(int(proc.name))
        except OSError:
            continue
    return left


def test_exact_digest_locates_a_flipped_bit() -> None:
    x = torch.randn(1000, dtype=torch.bfloat16)
    y = x.clone()
    y.view(torch.int16)[700] ^= 1
    a, b = digest.exact(x, 256).tolist(), digest.exact(y, 256).tolist()
    spec = {"chunk": 256, "per": 1}
    differ = [c for c in range(len(a)) if a[c] != b[c]]
    assert differ == [2]
    assert check.locate(b[2], a[2], spec, 2) == 700


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_linear_bound_passes_honest_rounding_in_any_order(dtype: torch.dtype) -> None:
    world, n = 4, 5000
    gen = torch.Generator().manual_seed(1)
    ins = [(torch.randn(n, generator=gen) * 10 ** torch.randint(-3, 3, (n,), generator=gen)
            ).to(dtype) for _ in range(world)]
    spec = {"kind": "reduce", "group": list(range(world)), "reduce": "sum", "chunk": 1024,
            "per": 1, "u": torch.finfo(dtype).eps / 2, "tiny": torch.finfo(dtype).tiny}
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        acc = ins[order[0]].clone()
        for r in order[1:]:
            acc = acc + ins[r]  # rounded to the dtype at every step, as a backend may
        outs = [digest.linear(acc, 1024).tolist()] * world
        digs = [{"in": [digest.linear(ins[r], 1024).tolist()],
                 "out": [outs[r], digest.exact(acc, 1024).tolist()]} for r in range(world)]
        assert check.decide(spec, digs).mismatches == []
    if dtype != torch.float32:
        return  # a dropped rank is within bf16/fp16's worst-case bound (docs/howto/guard.md)
    dropped = torch.stack([ins[r].double() for r in range(world - 1)]).sum(0)
    dropped[2048:3072] += ins[world - 1][2048:3072].double()  # rank 3 reached chunk 2 only
    wrong = dropped.to(dtype)
    digs = [{"in": [digest.linear(ins[r], 1024).tolist()],
             "out": [digest.linear(wrong, 1024).tolist(), digest.exact(wrong, 1024).tolist()]}
            for r in range(world)]
    found = check.decide(spec, digs).mismatches
    assert {m.chunk for m in found} == {0, 1, 3, 4}


@pytest.mark.parametrize("opts,quoted", [
    (["--sample", "0"], "--sample 0"), (["--sample", "1e3"], "--sample '1e3'"),
    (["--on-mismatch", "explode"], "--on-mismatch 'explode'"),
    (["--chunk", "0"], "--chunk 0"), (["--timeout", "nan"], "--timeout nan"),
    (["--ops", "all_reduce,teleport"], "--ops"), (["--inject", "x\x1b[31m"], "--inject"),
])
def test_hostile_settings_are_one_line(opts: list[str], quoted: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*opts, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("collective-guard: error: ")
    assert quoted in err and "\x1b" not in err


def test_hostile_environment_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw in ("{", "[1]", '{"every": -1}', '{"families": "p2p"}', '{"evil": 1}'):
        monkeypatch.setenv(ENV, raw)
        with pytest.raises(SettingsError):
            from_env()


def test_guarded_run_is_bit_identical_and_leaves_nothing(tmp_path: Path) -> None:
    plain = tmp_path / "plain.bin"
    subprocess.run([PY, "tests/guard_train.py", "--out", str(plain)], cwd=ROOT, check=True,
                   timeout=HANG_S)
    guarded = tmp_path / "guarded.bin"
    got = _guard(tmp_path, "--sample", "every", extra=("--out", str(guarded)))
    assert got.returncode == 0, got.stderr
    assert "no mismatch in 36 checked call(s)" in got.stderr
    assert plain.read_bytes() == guarded.read_bytes()
    assert _left_behind(str(tmp_path / "findings")) == []


def test_injected_fault_localised_and_replayed(tmp_path: Path) -> None:
    got = _guard(tmp_path, "--sample", "every", "--inject", "recv_unwritten",
                 script="examples/pipeline_p2p.py")
    assert got.returncode == 0, got.stderr
    line = next(x for x in got.stderr.splitlines() if "MISMATCH p2p seq 0" in x
                and "rank 1 chunk" in x)
    assert "rank 1 chunk 0, element 255 from rank 0" in line
    assert "pipeline_p2p.py:" in line  # the user's call site
    # every receive checked, the last ones decided while the ranks finish (batches); how many
    # are found wrong is the drill's: its backend reads the "old" last element after issuing
    # the receive, which sometimes has already landed
    assert " in 8 checked call(s)" in got.stderr
    case = tmp_path / "findings" / "p2p-seq0-rank1.yaml"
    assert "first differing element 255" in case.read_text()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    base = [PY, "-m", "pytest", str(case), "-q", "-p", "no:cacheprovider",
            "--report-json", str(tmp_path / "r.json"), "-o", "collective_baseline="]
    honest = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=HANG_S, check=False)
    assert honest.returncode == 0, honest.stdout[-2000:]
    mutant = subprocess.run([*base, "--backend-module", "harness.mutate.backend", "--backend",
                             "mutant"], cwd=ROOT, capture_output=True, text=True,
                            env=env | {"COLLECTIVE_MUTANT": "recv_unwritten"}, timeout=HANG_S,
                            check=False)
    assert mutant.returncode == 1, mutant.stdout[-2000:]
    assert _left_behind(str(tmp_path / "findings")) == []


def test_kept_inputs_make_the_case_replay_the_jobs_own_values(tmp_path: Path) -> None:
    got = _guard(tmp_path, "--sample", "every", "--inject", "last_rank_ulp", "--keep-inputs",
                 "4096")
    assert got.returncode == 0, got.stderr
    case_file = tmp_path / "findings" / "all_reduce-seq0-rank1.yaml"
    text = case_file.read_text()
    assert "inputs: every rank's own, kept by --keep-inputs" in text
    case = yaml.safe_load(text)["cases"][0]
    for r in (0, 1):  # tests/guard_train.py's first all_reduce input on rank r
        want = torch.randn(3000, generator=torch.Generator().manual_seed(r))
        assert torch.equal(torch.tensor(case["input"][r], dtype=torch.float32), want)
    assert "tolerance" not in case  # two ranks: the sum is the same in any order
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    base = [PY, "-m", "pytest", str(case_file), "-q", "-p", "no:cacheprovider",
            "--report-json", str(tmp_path / "r.json"), "-o", "collective_baseline="]
    honest = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert honest.returncode == 0, honest.stdout[-2000:]
    mutant = subprocess.run([*base, "--backend-module", "harness.mutate.backend", "--backend",
                             "mutant"], cwd=ROOT, capture_output=True, text=True,
                            env=env | {"COLLECTIVE_MUTANT": "last_rank_ulp"}, timeout=300,
                            check=False)
    assert mutant.returncode == 1, mutant.stdout[-2000:]


def test_inputs_past_the_bound_are_not_kept(tmp_path: Path) -> None:
    got = _guard(tmp_path, "--sample", "every", "--inject", "last_rank_ulp", "--keep-inputs",
                 "2999")
    assert got.returncode == 0, got.stderr
    text = (tmp_path / "findings" / "all_reduce-seq0-rank1.yaml").read_text()
    assert "inputs: generated by the harness (the job's were not kept)" in text
    assert "generator: exact" in text


def test_failing_side_channel_disables_with_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "plain.bin"
    subprocess.run([PY, "tests/guard_train.py", "--out", str(plain)], cwd=ROOT, check=True,
                   timeout=HANG_S)
    out = tmp_path / "guarded.bin"
    got = _guard(tmp_path, "--sample", "every", extra=("--out", str(out), "--break-channel"))
    assert got.returncode == 0, got.stderr
    # one line per rank; the two ranks' lines may interleave on the shared stderr (seen under
    # load): count the phrases, not lines
    assert got.stderr.count("checking stopped in this rank") == 2, got.stderr
    assert got.stderr.count("side channel unreachable (test)") == 2, got.stderr
    assert "Traceback" not in got.stderr
    assert out.read_bytes() == plain.read_bytes()


def test_aborting_rank_leaves_its_finding(tmp_path: Path) -> None:
    got = _guard(tmp_path, "--sample", "every", "--on-mismatch", "abort", "--inject",
                 "recv_unwritten", script="examples/pipeline_p2p.py")
    assert got.returncode != 0
    # Both ranks receive a corrupted buffer; whichever checks first aborts, and the launcher
    # then ends the other, so either rank's finding may be the one on disk.
    found = list((tmp_path / "findings").glob("p2p-seq*-rank*.yaml"))
    assert found
    assert all("received bytes differ from what was sent" in f.read_text() for f in found)
    assert "ended before writing their counts" in got.stderr
    assert _left_behind(str(tmp_path / "findings")) == []


def test_linear_digest_leaves_a_float64_input_unchanged() -> None:
    x = torch.randn(5000, dtype=torch.float64)
    before = x.clone()
    digest.linear(x, 1024)
    assert torch.equal(x, before)


@pytest.mark.parametrize("sample", ["1000", "every"])
def test_a_cpu_call_enters_no_python_sampled_or_not(tmp_path: Path, sample: str) -> None:
    # unsampled: counted in C++; sampled: digested in C++ (its site's code objects and its
    # group were met at the first call, before the probe)
    got = _guard(tmp_path, "--sample", sample, extra=("--probe", "python"))
    assert got.returncode == 0, got.stderr
    # the two ranks' lines may interleave on the shared stdout: count the phrase, not lines
    assert got.stdout.count("python calls into the guard: 0 []") == 2, got.stdout
    if sample == "every":
        assert "no mismatch in 12 checked call(s)" in got.stderr


def test_a_clean_call_never_has_its_case_or_site_made(tmp_path: Path) -> None:
    got = _guard(tmp_path, "--sample", "every", extra=("--probe", "describe"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("10 checked, made {'call_json': 0, 'site_json': 0}") == 2, \
        got.stdout + got.stderr[-2000:]


def test_a_finding_names_its_training_step_and_call(tmp_path: Path) -> None:
    # digested by the C++ kernel, which also keeps the inputs (the case's)
    got = _guard(tmp_path, "--sample", "every", "--keep-inputs", "1000",
                 extra=("--probe", "step"))
    assert got.returncode == 0, got.stderr
    line = next(x for x in got.stderr.splitlines() if "MISMATCH" in x)
    assert "all_reduce seq 2 " in line and "(step 2, call 2 of this rank)" in line, line
    text = (tmp_path / "findings" / "all_reduce-seq2-rank0.yaml").read_text()
    assert "issued at training step 2 (optimizer steps taken before it), call 2 " in text
    assert yaml.safe_load(text)["cases"][0]["input"] == {0: [3.0] * 1000, 1: [3.0] * 1000,
                                                         "others": "zeros"}


def test_sampled_async_call_is_not_waited_in_the_kernel(tmp_path: Path) -> None:
    # rank 1 issues its all_reduce only after rank 0's async call returned: a kernel that
    # waited for the call would block rank 0 until rank 1's store wait failed
    got = _guard(tmp_path, "--sample", "every", extra=("--probe", "overlap"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("overlap result 3.0 3.0") == 2, got.stdout
    assert "no mismatch in 2 checked call(s)" in got.stderr


def test_without_a_compiler_the_python_kernel_checks_and_says_so(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CXX=str(tmp_path / "no-such-compiler"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    got = subprocess.run([PY, "-m", "harness.guard", "--findings", str(tmp_path / "findings"),
                          "--sample", "every", "--", PY, "tests/guard_train.py"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert got.returncode == 0, got.stderr
    # the build is announced before it starts (it takes minutes on a busy machine)
    assert got.stderr.startswith("collective-guard: building the C++ recording kernel (once"), \
        got.stderr
    assert got.stderr.count("the C++ kernel cannot be built") == 1, got.stderr
    assert "no mismatch in 36 checked call(s)" in got.stderr


def test_raise_mode_raises_at_the_next_call_through_the_cpp_kernel(tmp_path: Path) -> None:
    # every check reports rank 0 (a made-up verdict): its next all_reduce must raise
    got = _guard(tmp_path, "--sample", "every", "--on-mismatch", "raise", "--timeout", "5",
                 extra=("--probe", "raise"))
    assert "rank 0: raised GuardMismatch: collective-guard: MISMATCH all_reduce seq 0" in \
        got.stdout, got.stdout + got.stderr[-2000:]
