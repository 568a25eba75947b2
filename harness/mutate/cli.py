"""``collective-mutate``: which realistic backend bugs would this case set miss?

    collective-mutate cases/ [-k EXPR] [--full] [--faults a,b] [-j N] [--json PATH]

Exit status: 0 when every fault is killed, 1 when some survived (the blind spots are listed),
2 when a run was inconclusive or nothing passed on the faithful wrapper.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import float_in, int_in
from ..report.jsonfile import printable, unwritable
from ..report.records import write_atomic
from .faults import FAULTS, NAMES
from .runner import Options, Outcome, mutate


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="collective-mutate",
        description="Mutation score of a case set: run it against Gloo behind a faithful "
                    "wrapper and behind one injected fault at a time; a fault is killed when "
                    "an instance that passes faithfully does not pass under it.")
    ap.add_argument("paths", nargs="*", default=["cases"], help="case files or folders")
    ap.add_argument("-k", dest="keyword", default="", help="pytest -k selection")
    ap.add_argument("--full", action="store_true", help="include the long matrix (--full)")
    ap.add_argument("--faults", default=None,
                    help="comma-separated fault names (default: all; see --list-faults)")
    ap.add_argument("--list-faults", action="store_true", help="print the faults and exit")
    ap.add_argument("-j", "--jobs", type=int_in(1, 64), default=1,
                    help="fault sessions run in parallel (default 1)")
    ap.add_argument("--deadline", type=float_in(0, 3600, open_low=True), default=None,
                    help="per-instance hang deadline passed to pytest (default: the plugin's)")
    ap.add_argument("--all-kills", action="store_true",
                    help="run every instance under every fault and list all that kill it "
                         "(slower; default: stop each fault at its first kill)")
    ap.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                    help="write the results as JSON")
    ap.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for every pytest session (repeatable)")
    return ap


def to_json(outcome: Outcome, opts: Options) -> dict[str, Any]:
    """The JSON document of a run."""
    killed = sum(r.status == "killed" for r in outcome.results)
    total = len(outcome.results)
    return {
        "schema": "collective-mutate/1",
        "paths": opts.paths, "keyword": opts.keyword, "full": opts.full,
        "faithful": outcome.faithful,
        "faults": [asdict(r) for r in outcome.results],
        "score": {"killed": killed, "total": total,
                  "ratio": round(killed / total, 4) if total else None},
        "survivors": [{"name": r.name, "does": r.does} for r in outcome.results
                      if r.status == "survived"],
        "duration_s": outcome.duration_s,
    }


def render(doc: dict[str, Any]) -> str:
    """The terminal summary: per fault, the score, and the blind spots."""
    lines = []
    for r in doc["faults"]:
        if r["status"] == "killed":
            k = r["killed_by"][0]
            more = f" (+{len(r['killed_by']) - 1} more)" if len(r["killed_by"]) > 1 else ""
            lines.append(f"  killed        {r['name']:<26} by {printable(k['nodeid'], 300)} "
                         f"({k['outcome']})"
                         f"{more}")
        elif r["status"] == "survived":
            lines.append(f"  SURVIVED      {r['name']:<26} {r['instances_run']} instance(s) "
                         "all passed")
        else:
            lines.append(f"  INCONCLUSIVE  {r['name']:<26} {printable(r['detail'], 300)}")
    s = doc["score"]
    pct = f" ({100 * s['ratio']:.1f}%)" if s["ratio"] is not None else ""
    lines.append(f"mutation score: {s['killed']}/{s['total']} faults killed{pct}; "
                 f"{doc['faithful']['passed']} instance(s) pass on the faithful wrapper; "
                 f"{doc['duration_s']:.0f} s")
    if doc["survivors"]:
        lines.append("blind spots (survivors):")
        lines += [f"  - {v['name']}: {v['does']}" for v in doc["survivors"]]
    inconclusive = [r["name"] for r in doc["faults"] if r["status"] == "inconclusive"]
    if inconclusive:
        lines.append(f"inconclusive (neither killed nor survived): {', '.join(inconclusive)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``collective-mutate`` and ``python -m harness.mutate``."""
    args = _parser().parse_args(argv)
    if args.list_faults:
        for f in FAULTS:
            print(f"{f.name:<26} {f.does}")
        return 0
    if args.faults is None:
        faults = list(NAMES)
    else:  # given: an empty list is a mistake, never "every fault"
        faults = [f.strip() for f in args.faults.split(",") if f.strip()]
        if not faults:
            print("collective-mutate: --faults names no fault; give fault names (see "
                  "--list-faults) or leave the option out for all of them", file=sys.stderr)
            return 2
    unknown = [f for f in faults if f not in NAMES]
    if unknown:
        print(f"collective-mutate: unknown fault(s) {', '.join(unknown)}; "
              "--list-faults shows them", file=sys.stderr)
        return 2
    why = unwritable(args.json_path, "--json file") if args.json_path else ""
    if why:
        print(f"collective-mutate: error: {why}", file=sys.stderr)
        return 2
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(f"collective-mutate: no such case file or folder: {', '.join(missing)}",
              file=sys.stderr)
        return 2
    opts = Options(paths=args.paths, keyword=args.keyword, full=args.full,
                   deadline=args.deadline, jobs=args.jobs, stop_at_first_kill=not args.all_kills,
                   extra=args.pytest_arg)
    print(f"collective-mutate: {len(faults)} fault(s) against {' '.join(args.paths)}"
          + (f" -k {args.keyword!r}" if args.keyword else "") + (" --full" if args.full else ""),
          flush=True)
    outcome = mutate(opts, faults, progress=lambda s: print("  .. " + s, flush=True))
    doc = to_json(outcome, opts)
    if args.json_path:
        try:
            write_atomic(args.json_path, json.dumps(doc, indent=1) + "\n")
        except OSError as exc:
            print(f"collective-mutate: error: {args.json_path}: cannot write it: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 2
    if not outcome.faithful["passed"]:
        print("collective-mutate: no instance passes on the faithful wrapper; nothing to "
              "measure. pytest said:\n" + str(outcome.faithful.get("tail", "")),
              file=sys.stderr)
        return 2
    if outcome.faithful["returncode"] not in (0, 1):
        print(f"collective-mutate: warning: the faithful session exited "
              f"{outcome.faithful['returncode']} (interrupted or a usage error?): only the "
              f"{outcome.faithful['instances']} instance(s) it reported were measured",
              file=sys.stderr)
    print(render(doc))
    if any(r.status == "inconclusive" for r in outcome.results):
        return 2
    return 1 if doc["survivors"] else 0
