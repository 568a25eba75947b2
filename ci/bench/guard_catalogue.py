"""Which mutant faults collective-guard catches in the examples (issue 41 point 5).

    python ci/bench/guard_catalogue.py [--json PATH]

Runs each (example, fault, sampling) below under ``collective-guard --inject FAULT`` and
each example clean (``--inject none``: the same wrapper, no fault) and prints a markdown table:
caught or not, the mismatch reports and checked calls, and the first finding's line (call,
rank, chunk, sender, element). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = [
    ("ddp_buckets", "none", "every"), ("fsdp2_tiny", "none", "every"),
    ("dtensor_redistribute", "none", "every"), ("pipeline_p2p", "none", "every"),
    ("pipeline_p2p", "recv_unwritten", "every"), ("pipeline_p2p", "recv_unwritten", "3"),
    ("ddp_buckets", "last_rank_ulp", "every"), ("ddp_buckets", "last_rank_ulp", "10"),
    ("ddp_buckets", "run_dependent_sum", "every"),
    ("fsdp2_tiny", "dropped_contribution", "every"),
    ("ddp_buckets", "nonzero_root_wrong", "every"),
    ("dtensor_redistribute", "dropped_contribution", "every"),
]


def run(example: str, fault: str, sample: str) -> dict[str, str]:
    """One guarded run; its outcome as table cells."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        got = subprocess.run([sys.executable, "-m", "harness.guard", "--findings", d,
                              "--sample", sample, "--inject", fault, "--",
                              sys.executable, f"examples/{example}.py"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600, check=False)
    lines = got.stderr.splitlines()
    first = next((x for x in lines if "MISMATCH" in x), "")
    summary = next((x for x in reversed(lines) if x.startswith("collective-guard:")), "")
    counts = re.search(r"(\d+) mismatch report", summary)
    checked = re.search(r"in (\d+) checked", summary)
    return {"example": example, "fault": fault, "sample": sample,
            "caught": "yes" if first else "no", "reports": counts.group(1) if counts else "0",
            "checked": checked.group(1) if checked else "?", "rc": str(got.returncode),
            "first": first.split(": MISMATCH ", 1)[-1][:160].replace("|", "/"),
            "stopped": "yes" if "checking stopped" in got.stderr else ""}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = [run(*r) for r in RUNS]
    print("| example | fault | sample | caught | reports / checked | exit | first finding |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['example']} | {r['fault']} | {r['sample']} | {r['caught']} | "
              f"{r['reports']} / {r['checked']} | {r['rc']} | {r['first']}"
              f"{' (guard stopped)' if r['stopped'] else ''} |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
