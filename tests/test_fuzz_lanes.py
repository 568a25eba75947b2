"""collective-fuzz --lanes N: worker processes coordinated over checked JSON messages.

The coordinator is tested against stand-in workers that misbehave on purpose (no ranks), and
end to end on Gloo: the budget split exactly over two processes, one case file per
signature, Ctrl-C, SIGTERM and SIGKILL of the coordinator, a worker killed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.fuzz import space, wire
from harness.fuzz.lanes import Coordinator, shares
from harness.fuzz.options import parser
from harness.fuzz.summary import Tally

from .helpers import HANG_S, finish, start, wait_for

ROOT = Path(__file__).resolve().parents[1]
FUZZ = [sys.executable, "-m", "harness.fuzz"]
CASE = {"name": "fuzz", "op": "all_reduce", "world_size": 2, "dtype": "float32",
        "shape": [2], "reduce_op": "max", "input": {"generator": "exact", "seed": 0},
        "expected": "auto", "deadline": 5}


def test_examples_are_split_exactly() -> None:
    assert shares(10, 3) == [4, 3, 3] and shares(1, 4) == [1] and shares(None, 2) == [None] * 2
    for n in (1, 2, 7, 600, 1001):
        for lanes in (1, 2, 3, 16):
            parts = shares(n, lanes)
            assert sum(p or 0 for p in parts) == n and all(parts) and len(parts) <= lanes


def test_a_tally_goes_through_the_wire_and_adds_up() -> None:
    t = Tally()
    t.stats.tried, t.stats.shrinking = 7, 2
    t.stats.by_op["all_reduce"] = 7
    t.absorbed["cases/x.yaml:3"] = 2
    t.reasons["cases/x.yaml:3"] = "known"
    kind, m = wire.decode(wire.encode("progress", tally=t.to_json(), note=""))
    back = Tally.from_json(m["tally"])
    assert kind == "progress" and back.to_json() == t.to_json()
    back.add(t)
    assert back.stats.tried == 14 and back.stats.by_op["all_reduce"] == 14
    assert back.absorbed["cases/x.yaml:3"] == 4


@pytest.mark.parametrize("line", [
    b"not json", b"[]", b'{"kind": "exec"}', b'{"kind": "ready", "extra": 1}',
    b'{"kind": "ran", "key": "' + b"a" * 64 + b'", "digests": {"../x": "00"}}',
    b'{"kind": "warning", "text": NaN}', b'{"kind": "warning"}',
    b"{" * 100000 + b"}" * 100000, b"x" * (wire.MAX_LINE + 1),
])
def test_a_malformed_message_is_a_bad_message(line: bytes) -> None:
    with pytest.raises(wire.BadMessage):
        wire.decode(line)


def test_a_count_must_be_a_whole_number() -> None:
    tally = {**Tally().to_json(), "tried": 2.0}
    with pytest.raises(wire.BadMessage, match="tried"):
        wire.decode(json.dumps({"kind": "progress", "tally": tally, "note": ""}).encode())


def test_a_finding_cannot_name_a_path() -> None:
    good = {"signature": "all_reduce:wrong-values", "op": "all_reduce", "outcome":
            "wrong-values", "text": space.render_case(CASE), "message": "m", "seed": 0,
            "blob": "", "found_after_s": 0.1, "found_after_examples": 1, "shrink_s": 0.0,
            "exception": ""}
    assert wire.decode(wire.encode("finding", **good)) == ("finding", good)
    for field, bad in (("op", "../../etc/x"), ("outcome", "x/y"), ("signature", "a/b:c")):
        with pytest.raises(wire.BadMessage, match=field):
            wire.decode(wire.encode("finding", **{**good, field: bad}))


def _fake(tmp_path: Path, body: str, lanes: int = 2) -> tuple[Coordinator, str, str]:
    """A coordinator over stand-in workers running ``body`` (``config``, ``send`` and an
    empty tally ``TALLY`` are defined), run to its end: it, its summary and its stderr."""
    script = ("import json, sys\nconfig = json.loads(sys.stdin.readline())\n"
              "def send(**m):\n    print(json.dumps(m), flush=True)\n"
              f"TALLY = {Tally().to_json()!r}\n" + body)
    argv = ["--backend", "gloo", "--lanes", str(lanes), "--examples", "10", "--out",
            str(tmp_path / "out")]
    (tmp_path / "out").mkdir()
    co = Coordinator(parser().parse_args(argv), argv, command=[sys.executable, "-c", script])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        co.run()
    return co, co.summary(None), err.getvalue()


END = ("send(kind='end', tally=TALLY, interrupted=False, cpu_s=0.0, ranks_cpu_s=0.0, "
       "pools_started=0)\n")


def test_a_malformed_message_ends_that_lane_with_one_line(tmp_path: Path) -> None:
    co, summary, err = _fake(tmp_path, "if config['lane'] == 1:\n    print('{oops', flush=True)\n"
                             "    sys.stdin.read()\n" + END)
    assert co.status() == 3
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert re.search(r"lane 1 \(pid \d+\) sent a malformed message \(not JSON", line)
    assert "incomplete: 1 lane(s) failed" in summary and "LANE FAILED lane 1" in summary


def test_a_finding_whose_document_carries_a_python_tag_is_refused(tmp_path: Path) -> None:
    hostile = "cases:\n  - !!python/object/apply:os.system ['touch pwned']\n"
    msg = {"kind": "finding", "signature": "all_reduce:wrong-values", "op": "all_reduce",
           "outcome": "wrong-values", "text": hostile, "message": "m", "seed": 0,
           "blob": "", "found_after_s": 0.1, "found_after_examples": 1, "shrink_s": 0.0,
           "exception": ""}
    co, _, err = _fake(tmp_path, f"send(**{msg!r})\nsys.stdin.read()\n", lanes=1)
    assert co.status() == 3 and "Traceback" not in err
    assert "its case document does not load" in err
    assert not (tmp_path / "pwned").exists() and not list((tmp_path / "out").glob("*.yaml"))


def test_one_signature_found_by_two_lanes_is_one_case_file(tmp_path: Path) -> None:
    msg = {"kind": "finding", "signature": "all_reduce:wrong-values", "op": "all_reduce",
           "outcome": "wrong-values", "text": space.render_case(CASE),
           "message": "wrong values on rank 1", "seed": 0, "blob": "@reproduce_failure(x)",
           "found_after_s": 0.1, "found_after_examples": 1, "shrink_s": 0.0,
           "exception": ""}
    co, summary, err = _fake(tmp_path, f"send(**{msg!r})\n" + END)
    assert co.status() == 1, err
    (case_file,) = (tmp_path / "out").glob("*.yaml")
    (written,) = yaml.safe_load(case_file.read_text())["cases"]
    assert written["reduce_op"] == "max" and written["shape"] == [2]
    assert "Verdict: wrong values on rank 1" in written["description"]
    assert "found again by other lanes 1 time(s)" in summary
    assert summary.count("FINDING all_reduce:wrong-values") == 1


def test_a_worker_that_dies_is_reported_with_its_stderr(tmp_path: Path) -> None:
    co, summary, err = _fake(tmp_path, "if config['lane'] == 0:\n"
                             "    sys.stderr.write('something broke\\n'); sys.exit(7)\n" + END)
    assert co.status() == 3
    assert re.search(r"lane 0 \(pid \d+\) ended with exit status 7 before sending its final "
                     r"tally \(stderr: something broke\)", err), err
    assert "lane 1" not in err  # the other lane ended well
    assert "summary (incomplete: 1 lane(s) failed)" in summary


# ---- end to end on Gloo -------------------------------------------------------------------


def _env(marker: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FUZZ_LANES_TEST": marker, **extra}


def _ours(marker: str) -> set[int]:
    """Live processes (not zombies) carrying ``marker``: workers, forkservers, ranks."""
    pids: set[int] = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if f"FUZZ_LANES_TEST={marker}".encode() not in (entry / "environ").read_bytes():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def _workers(coordinator: int) -> list[int]:
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == coordinator and b"harness.fuzz.worker" in cmd:
            out.append(int(entry.name))
    return sorted(out)


def _summary_counts(out: str) -> dict[str, Any]:
    head = re.search(r"summary[^:]*: (\d+) instances in .*?, (\d+) while shrinking", out)
    lanes = re.findall(r"lane (\d+) \(pid (\d+)\) (\d+) instances", out)
    by_op = re.search(r"instances by op: (.*)", out)
    assert head and lanes and by_op, out
    return {"tried": int(head.group(1)), "shrinking": int(head.group(2)),
            "lanes": [(int(k), int(p), int(n)) for k, p, n in lanes],
            "by_op": sum(int(x.rsplit(" ", 1)[1]) for x in by_op.group(1).split(", "))}


def _run(tmp_path: Path, name: str, marker: str, *args: str
         ) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """collective-fuzz over all_reduce and broadcast at world size 2, every signature
    skipped (so that no finding starts another round): the result and the documents it ran
    (its --report's keys)."""
    report = tmp_path / f"{name}.json"
    skip = ",".join(f"{op}:{c}" for op in ("all_reduce", "broadcast") for c in (
        "wrong-values", "async-contract", "raise", "hang", "crash"))
    proc = subprocess.run([*FUZZ, "--backend", "gloo", "--world-size", "2", "--ops",
                           "all_reduce,broadcast", "--skip-signatures", skip, "--out",
                           str(tmp_path / name), "--report", str(report), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=_env(marker),
                          timeout=HANG_S, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, set(json.loads(report.read_text())["instances"])


def test_two_lanes_split_the_examples_between_two_processes(tmp_path: Path) -> None:
    """Lane k draws with seed + k and its share of --examples: together the two processes
    run exactly the documents of two one-lane runs with those seeds and shares."""
    marker = uuid.uuid4().hex
    two, ran = _run(tmp_path, "two", marker, "--lanes", "2", "--examples", "24", "--seed", "5")
    c = _summary_counts(two.stdout)
    assert sorted(k for k, _, _ in c["lanes"]) == [0, 1]
    assert len({p for _, p, _ in c["lanes"]}) == 2  # two worker processes
    assert sum(n for _, _, n in c["lanes"]) == c["tried"] == c["by_op"]
    assert 0 < c["tried"] - c["shrinking"] <= 24
    assert re.search(r"collective-fuzz: \d+ instances \(\d+/s\)", two.stderr)
    one = [_run(tmp_path, f"seed{seed}", marker, "--examples", "12", "--seed", str(seed))
           for seed in (5, 6)]
    assert ran and ran == one[0][1] | one[1][1]
    tried = [int(m.group(1)) for p, _ in one
             if (m := re.search(r"summary: (\d+) instances", p.stdout))]
    assert sorted(n for _, _, n in c["lanes"]) == sorted(tried)
    assert json.loads((tmp_path / "two.json").read_text())["meta"]["lanes"] == "2"
    # each lane's forkserver ends when its lane's pipe closes, just after the lane
    wait_for(lambda: _ours(marker) == set(), HANG_S, "the lanes' processes to end")


def _lanes(tmp_path: Path, marker: str, *args: str) -> subprocess.Popen[str]:
    """collective-fuzz with two lanes on all_reduce at world size 2, started."""
    return start(tmp_path, [*FUZZ, "--backend", "gloo", "--lanes", "2", "--world-size", "2",
                            "--ops", "all_reduce", "--out", str(tmp_path / "o"), *args],
                 env=_env(marker))


def _await_progress(proc: subprocess.Popen[str]) -> None:
    """Until the first progress line: the lanes are then fuzzing on live pools."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if "instances (" in line:
            return


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupt_ends_every_lane_with_the_summary(tmp_path: Path, how: str) -> None:
    marker = uuid.uuid4().hex
    proc = _lanes(tmp_path, marker, "--time", "5m")
    try:
        _await_progress(proc)
        wait_for(lambda: len(_workers(proc.pid)) == 2, HANG_S, "two worker processes")
        if how == "ctrl-c":  # the terminal signals the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=HANG_S)
        assert proc.returncode == 130, out
        assert "collective-fuzz summary (interrupted)" in out and "all_reduce" in out
        assert "lanes: 2 worker processes" in out and "LANE FAILED" not in out
        wait_for(lambda: _ours(marker) == set(), HANG_S, "every worker and rank to end")
    finally:
        finish(proc, 10)


def test_sigkill_of_the_coordinator_leaves_no_worker_or_rank(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    proc = _lanes(tmp_path, marker, "--time", "5m")
    try:
        _await_progress(proc)
        workers = _workers(proc.pid)
        assert len(workers) == 2
        proc.kill()  # the coordinator alone, as the OOM killer would
        proc.wait()
        wait_for(lambda: _ours(marker) == set(), HANG_S, "the lanes to notice and end")
    finally:
        finish(proc, 10)


def test_a_killed_worker_is_reported_and_the_run_says_incomplete(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    proc = _lanes(tmp_path, marker, "--time", "10s", "--shrink-time", "3s")
    try:
        _await_progress(proc)
        victim = _workers(proc.pid)[1]
        os.kill(victim, signal.SIGKILL)
        result = finish(proc, HANG_S)
    finally:
        finish(proc, 10)
    assert result.returncode == 3, result.stdout + result.stderr
    assert re.search(rf"lane \d \(pid {victim}\) ended with signal SIGKILL before sending its "
                     "final tally", result.stderr), result.stderr
    assert "summary (incomplete: 1 lane(s) failed)" in result.stdout
    assert re.search(rf"LANE FAILED lane \d \(pid {victim}\): ended with signal SIGKILL",
                     result.stdout), result.stdout
    wait_for(lambda: _ours(marker) == set(), HANG_S, "the killed lane's ranks to end")
