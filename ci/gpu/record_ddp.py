"""gpu-check's record part: collective-record on a real CUDA DDP run over NCCL.

    python ci/gpu/record_ddp.py OUT_DIR

Runs ``examples/ddp_buckets.py --backend nccl --world-size 1`` twice, plain and under
``collective-record``, writes ``OUT_DIR/record-nccl.yaml`` (the case file, which the next part
replays with ``pytest --backend nccl``) and ``OUT_DIR/record.json``: the recorder's summary
line, the number of cases, the device kinds the cases declare, which kernel recorded (the
C++ one, or the Python one where it could not be built), and whether the final parameters
are bit-identical with and without recording (issue 28 point 7, on the GPU). Exit 1 when
anything of that does not hold.

Without a GPU (gpu-check's dry run) it records the Gloo/CPU run instead, at the GPU run's world
size 1, so that the replay part has a file to collect (its instances skip there, with NCCL's
reason) and the folder still holds what a GPU run writes. World size 1, not the example's 2:
the dry run proves the part runs and writes its files, and each run at world size 2 started
one more rank importing torch (about 3.5 s of CPU a run, two runs); recording DDP at world size
2 without changing its parameters is tests/test_record_workloads.py's.

The part's time limit in gpu-check bounds this script and what it starts (``timeout`` signals
the whole process group); the runs here have no limits of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python ci/gpu/record_ddp.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    gpu = torch.cuda.is_available()
    example = [sys.executable, "examples/ddp_buckets.py"]
    example += [*(["--backend", "nccl"] if gpu else []), "--world-size", "1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    summary: dict[str, object] = {"gpu": gpu, "command": " ".join(example[1:])}
    with tempfile.TemporaryDirectory() as tmp:
        plain, recorded = Path(tmp, "plain.bin"), Path(tmp, "recorded.bin")
        run = subprocess.run([*example, "--out", str(plain)], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        print(run.stdout + run.stderr)
        if run.returncode != 0:
            summary["error"] = f"plain run exited {run.returncode}"
            return _finish(out, summary)
        traces = Path(tmp, "traces")
        rec = subprocess.run([sys.executable, "-m", "harness.record",
                              "-o", str(out / "record-nccl.yaml"), "--trace-dir", str(traces),
                              "--",
                              *example, "--out", str(recorded)],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        print(rec.stdout + rec.stderr)
        summary["record_exit"] = rec.returncode
        summary["record_said"] = rec.stdout.strip().splitlines()[-1:] or rec.stderr[-400:]
        if rec.returncode != 0 or not recorded.exists():
            summary["error"] = f"collective-record exited {rec.returncode}"
            return _finish(out, summary)
        summary["bit_identical"] = plain.read_bytes() == recorded.read_bytes()
        # which kernel recorded (the C++ one where it builds): the trace headers say
        summary["hook"] = sorted({json.loads(t.read_text().split("\n", 1)[0])["header"]
                                  .get("hook", "?") for t in traces.glob("trace-*.jsonl")})
        summary["parameter_bytes"] = plain.stat().st_size
    cases = yaml.safe_load((out / "record-nccl.yaml").read_text())["cases"]
    summary["cases"] = len(cases)
    summary["devices"] = sorted({str(c.get("device", "cpu")) for c in cases})
    summary["ops"] = sorted({str(c.get("op", "program")) for c in cases})
    if not summary["bit_identical"]:
        summary["error"] = "the parameters differ with and without recording"
    elif gpu and summary["devices"] != ["cuda"]:
        summary["error"] = f"a CUDA run was recorded as devices {summary['devices']}"
    return _finish(out, summary)


def _finish(out: Path, summary: dict[str, object]) -> int:
    (out / "record.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 1 if "error" in summary else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
