"""``collective-fuzz``: generated instances from the op table, shrunk findings as case files.

    collective-fuzz --backend NAME [--time 10m | --examples N] [--seed S] [--out DIR]
                    [--world-size 1-4] [--ops all_reduce,p2p,...] [--known PATH ...]
                    [--against NAME | --against-report REPORT.json] [--report PATH]
                    [--lanes N] ...  (the options: :mod:`harness.fuzz.options`)

With one lane the fuzzer runs in this process (:mod:`harness.fuzz.session`); with
``--lanes N`` in N worker processes that this one coordinates (:mod:`harness.fuzz.lanes`).
Exit status: 0 when nothing was found, 1 when there are findings (one case file each in
``--out``), 2 on bad input (a one-line error naming the option), 3 when a lane's worker
failed (the run is incomplete), 130 when interrupted. Ctrl-C or SIGTERM ends the run with the
summary of what was found so far; no rank or worker process outlives the command.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from ..report.jsonfile import printable
from . import space
from .differential import BadReport, text_key, write_digests
from .engine import AlsoFails, Finding, Stats
from .execute import Ran
from .findings import write_also, write_case
from .lanes import Coordinator
from .options import (
    Usage,
    backend_options,
    confirm_label,
    differ_label,
    parser,
    prepare,
    reproduce_command,
)
from .session import Session
from .summary import PROG, progress_line, summary


def _terminate(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the run as Ctrl-C does: summary, no rank left


def run_here(args: argparse.Namespace, ops: tuple[str, ...],
             report_digests: dict[str, dict[str, str]] | None) -> int:
    """One lane, in this process: fuzz, write case files, print the summary; the status."""
    out = Path(args.out)
    digests: dict[str, dict[str, str]] = {}
    taken: set[str] = set()
    found: list[Finding] = []

    def on_ran(text: str, ran: Ran) -> None:
        if args.report and ran.digests:
            digests[text_key(text)] = ran.digests

    def on_finding(f: Finding) -> None:
        write_case(f, out, args.backend, reproduce_command(args), taken, backend_options(args))
        found.append(f)

    def on_also(a: AlsoFails) -> None:
        write_also(a, out, args.backend, confirm_label(args), taken)

    def on_progress(stats: Stats, note: str) -> None:
        if not args.quiet:
            print(progress_line(stats, note, len(found)), file=sys.stderr, flush=True)

    session = Session(args, ops, report_digests, on_finding=on_finding, on_also=on_also,
                      on_progress=on_progress, on_ran=on_ran)
    for b in session.broken:
        print(f"{PROG}: warning: --known: {printable(b, 200)} (its overrides are not applied)",
              file=sys.stderr)
    interrupted = True
    try:
        interrupted = session.run()
    finally:
        session.close()
    if args.report:
        write_digests(args.report, digests, report_meta(args))
    print(summary(session.tally(), session.fuzzer.findings, list(session.fuzzer.also.values()),
                  differ_label(args), args.confirm_against is not None,
                  "interrupted" if interrupted else ""))
    return 130 if interrupted else (1 if session.fuzzer.findings else 0)


def run_lanes(args: argparse.Namespace, argv: list[str]) -> int:
    """``--lanes N``: N worker processes coordinated from here; the status."""
    co = Coordinator(args, argv)
    co.run()
    if args.report:
        write_digests(args.report, co.digests, {**report_meta(args), "lanes": str(args.lanes)})
    print(co.summary(differ_label(args)))
    return co.status()


def report_meta(args: argparse.Namespace) -> dict[str, str]:
    """What a ``--report`` says about its run."""
    import torch

    return {"backend": args.backend, "seed": str(args.seed), "torch": str(torch.__version__)}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``collective-fuzz``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.list_ops:
        print("\n".join(space.DEFAULT_OPS))
        return 0
    try:
        ops, report_digests = prepare(args)
    except (Usage, BadReport) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"{PROG}: error: --backend-module: {printable(exc, 200)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    if args.lanes > 1:
        return run_lanes(args, argv)
    return run_here(args, ops, report_digests)
