"""``collective-fuzz``: generated instances from the op table, shrunk findings as case files.

    collective-fuzz --backend NAME [--time 10m | --examples N] [--seed S] [--out DIR]
                    [--world-size 1-4] [--ops all_reduce,p2p,...] [--known PATH ...]
                    [--against NAME | --against-report REPORT.json] [--report PATH]

Exit status: 0 when nothing was found, 1 when there are findings (one case file each in
``--out``), 2 on bad input (a one-line error naming the option). Ctrl-C ends the run with the
summary of what was found so far; no rank process outlives the command.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from ..errors import float_in, int_in
from ..report.jsonfile import printable, unwritable
from . import space
from .differential import BadReport, Differ, load_digests, text_key, write_digests
from .engine import AlsoFails, Budget, Finding, Fuzzer, Stats
from .execute import Executor, Ran
from .findings import write_also, write_case
from .known import KnownLibrary, load_library
from .lanes import Lanes

PROG = "collective-fuzz"
UNITS = {"s": 1, "m": 60, "h": 3600, "": 1}
BUNDLED = Path(__file__).resolve().parents[2] / "cases"


class Usage(Exception):
    """A one-line error about an option (exit 2)."""


def parse_time(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` -> seconds (a positive number)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{printable(text, 40)!r} is not a positive duration "
                                         "(e.g. 90s, 10m, 1h)")
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """``2``, ``1-4`` or ``2,3`` -> world sizes within 1..8."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            sizes = tuple(range(lo, hi + 1))
        else:
            sizes = tuple(sorted({int(x) for x in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{printable(text, 40)!r} is not a world size, a "
                                         "range like 1-4 or a list like 2,3") from None
    if not sizes or min(sizes) < 1 or max(sizes) > 8:
        raise argparse.ArgumentTypeError(f"{printable(text, 40)!r}: world sizes must lie "
                                         "within 1..8")
    return sizes


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        print(f"{PROG}: error: {printable(message, 300)}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog=PROG, description="Generate valid instances from the op table with Hypothesis, "
        "run them on real process groups, judge them with the reference model, and write "
        "every new failure, shrunk, as a case file.")
    ap.add_argument("--backend", required=True, help="backend under test (gloo, nccl, ...)")
    ap.add_argument("--backend-module", action="append", default=[], metavar="MOD",
                    help="import MOD in every rank first (a third-party backend); repeatable")
    ap.add_argument("--time", type=parse_time, default=None, help="time budget (10m, 90s)")
    ap.add_argument("--examples", type=int_in(1, 10**9), default=None,
                    help="number of generated instances (not counting shrinking)")
    ap.add_argument("--seed", type=int_in(0, 2**63), default=0, help="Hypothesis seed")
    ap.add_argument("--out", default="fuzz-findings", help="folder for the case files")
    ap.add_argument("--world-size", type=parse_world_sizes, default=(1, 2, 3, 4),
                    help="world sizes to draw from: 2, 1-4 (default) or 2,3; at most 8")
    ap.add_argument("--ops", default=None,
                    help="comma-separated ops / program kinds (default: all; see --list-ops)")
    ap.add_argument("--list-ops", action="store_true", help="print what can be generated")
    ap.add_argument("--known", nargs="+", default=[], metavar="PATH",
                    help="more case files whose overrides are known behaviour")
    ap.add_argument("--no-bundled", action="store_true",
                    help="do not apply the bundled library's overrides (cases/)")
    ap.add_argument("--deadline", type=float_in(0, 600, open_low=True), default=5.0,
                    help="per-instance hang deadline in seconds (default 5)")
    ap.add_argument("--shrink-time", type=parse_time, default=60.0,
                    help="cap on shrinking one finding (default 60s)")
    ap.add_argument("--probe-every", type=int_in(1, 10**6), default=4, metavar="N",
                    help="run the ordering probes on one async instance in N, chosen by the "
                    "document's hash (default 4; 1: on every one)")
    ap.add_argument("--lanes", type=int_in(1, 16), default=1, metavar="N",
                    help="run up to N instances at once, each lane on rank pools of its own "
                    "(an example is then a batch of 1 to 2N instances; default 1)")
    ap.add_argument("--against", default=None, metavar="NAME",
                    help="differential: compare passing instances bit for bit with backend NAME")
    ap.add_argument("--against-report", default=None, metavar="REPORT",
                    help="differential: compare with a --report written by another run")
    ap.add_argument("--report", default=None, metavar="PATH",
                    help="write every instance's output digests (for --against-report)")
    ap.add_argument("--overrides-for", default=None, metavar="NAME",
                    help="apply the overrides written for backend NAME too (a wrapper of it)")
    ap.add_argument("--skip-signatures", default="", metavar="SIGS",
                    help="comma-separated op:class signatures already known (not findings)")
    ap.add_argument("--confirm-against", default=None, metavar="NAME",
                    help="a bad instance is a finding only if it passes on backend NAME (the "
                    "same build without the change under test); others are reported as "
                    "'also fails without the fault'")
    ap.add_argument("--confirm-env", action="append", default=[], metavar="VAR=VALUE",
                    help="set VAR=VALUE in the confirming backend's ranks (e.g. "
                    "COLLECTIVE_MUTANT=none); repeatable")
    ap.add_argument("--stop-at-first", action="store_true",
                    help="end the run at the first finding (benchmarks)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return ap


def _check(args: argparse.Namespace) -> tuple[str, ...]:
    if args.time is None and args.examples is None:
        args.examples = 1000
    if args.ops is None:
        ops = space.DEFAULT_OPS
    else:
        ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
        if not ops:
            raise Usage("--ops names no op")
        bad = [o for o in ops if not space.known_op(o)]
        if bad:
            raise Usage(f"--ops: unknown op {printable(bad[0], 60)!r} (see --list-ops)")
    for opt, name in (("--backend", args.backend), ("--against", args.against),
                      ("--confirm-against", args.confirm_against)):
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
            raise Usage(f"{opt}: {printable(name, 60)!r} is not a backend name")
    if args.against and args.against_report:
        raise Usage("--against and --against-report: give one of them")
    for item in args.confirm_env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}=[^\x00-\x1f]{0,200}", item):
            raise Usage(f"--confirm-env: {printable(item, 60)!r} is not VAR=VALUE")
    if args.confirm_env and not args.confirm_against:
        raise Usage("--confirm-env needs --confirm-against")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise Usage(f"--out: {printable(args.out, 120)} is not a folder")
    if args.report:
        why = unwritable(args.report, "--report file")
        if why:
            raise Usage(f"--report: {printable(why, 200)}")
    return ops


def _var(item: str) -> tuple[str, str]:
    name, value = item.split("=", 1)
    return name, value


def _make_out(args: argparse.Namespace) -> None:
    """Create ``--out`` (only once every other option is known to be good)."""
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise Usage(f"--out: {printable(args.out, 120)} is not a writable folder "
                    f"({exc.strerror or type(exc).__name__})") from None


def _backend_known(name: str, modules: tuple[str, ...]) -> bool:
    import importlib

    import torch.distributed as dist

    for m in modules:
        importlib.import_module(m)
    if name in ("gloo", "nccl", "mpi", "ucc"):
        return bool(dist.is_backend_available(name))
    return name.upper() in dist.Backend._plugins or hasattr(dist.Backend, name.upper())


def progress_line(stats: Stats, note: str, found: int) -> str:
    """One progress line: tried, per second, findings, what is happening."""
    return (f"{PROG}: {stats.tried} instances ({stats.rate():.0f}/s), "
            f"{found} finding(s), {stats.shrinking} while shrinking"
            + (f"; {note}" if note else ""))


def summary(fz: Fuzzer, known: KnownLibrary, differ: Differ | None, interrupted: bool) -> str:
    """The end-of-run summary: instances by op, absorbed overrides, findings."""
    s = fz.stats
    took = time.monotonic() - s.started
    lines = [f"{PROG} summary{' (interrupted)' if interrupted else ''}: {s.tried} instances "
             f"in {took:.0f} s ({s.rate():.1f}/s), {s.shrinking} while shrinking; "
             f"{len(fz.findings)} finding(s)"]
    lines.append("  instances by op: " + ", ".join(f"{op} {n}" for op, n in
                                                   sorted(s.by_op.items())))
    lines.append("  outcomes: " + ", ".join(f"{k} {n}" for k, n in sorted(s.outcomes.items())))
    if s.invalid:
        lines.append(f"  {s.invalid} generated document(s) were not valid cases (a fuzzer bug)")
    if known.absorbed:
        lines.append(f"  known behaviour (overrides that absorbed instances, "
                     f"{sum(known.absorbed.values())} in all):")
        lines += [f"    {n:>5}  {where}: {printable(known.reasons[where], 90)}"
                  for where, n in known.absorbed.most_common()]
    if differ is not None:
        lines.append(f"  differential: {differ.compared} passing instance(s) compared with "
                     f"{differ.label}")
    if fz.confirm is not None:
        lines.append(f"  confirmation: {s.confirm_runs} bad instance(s) run again on the "
                     "confirming backend")
    for a in fz.also.values():
        lines.append(f"  ALSO FAILS WITHOUT THE FAULT {a.signature}: {a.path} ({a.count} "
                     f"instance(s); there: {a.confirm_outcome})")
    for f in fz.findings:
        lines.append(f"  FINDING {f.signature}: {f.path} (after {f.found_after_examples} "
                     f"instance(s), {f.found_after_s:.1f} s)")
        lines.append(f"          {printable(f.message.splitlines()[0] if f.message else '', 160)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``collective-fuzz``."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.list_ops:
        print("\n".join(space.DEFAULT_OPS))
        return 0
    try:
        ops = _check(args)
        modules = tuple(args.backend_module)
        for opt, name in (("--backend", args.backend), ("--against", args.against),
                          ("--confirm-against", args.confirm_against)):
            if name is not None and not _backend_known(name, modules):
                raise Usage(f"{opt}: unknown or unavailable backend {name!r}")
        report_digests: dict[str, dict[str, str]] | None = None
        if args.against_report:
            report_digests, _meta = load_digests(args.against_report)
        _make_out(args)  # last: a bad option leaves nothing behind
    except (Usage, BadReport) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"{PROG}: error: --backend-module: {printable(exc, 200)}", file=sys.stderr)
        return 2
    paths = ([] if args.no_bundled else [str(BUNDLED)]) + list(args.known)
    library, broken = load_library([p for p in paths if os.path.exists(p)])
    for b in broken:
        print(f"{PROG}: warning: --known: {printable(b, 200)} (its overrides are not applied)",
              file=sys.stderr)
    known = KnownLibrary(library, alias=args.overrides_for)
    out = Path(args.out)
    max_pools = len(args.world_size)
    executors = [Executor(args.backend, modules, args.deadline, known, max_pools,
                          probe_every=args.probe_every) for _ in range(args.lanes)]
    executor = executors[0]
    lanes = Lanes(executors) if args.lanes > 1 else None
    differ: Differ | None = None
    if args.against:
        differ = Differ(Executor(args.against, modules, args.deadline, KnownLibrary([]),
                                 max_pools, probe_every=args.probe_every),
                        label=f"backend {args.against}")
    elif report_digests is not None:
        differ = Differ(report=report_digests, label=f"report {args.against_report}")
    confirm: Executor | None = None
    if args.confirm_against:
        confirm = Executor(args.confirm_against, modules, args.deadline, known, max_pools,
                           env=tuple(sorted(_var(e) for e in args.confirm_env)),
                           probe_every=args.probe_every)
    confirm_label = (args.confirm_against or "") + "".join(f" {e}" for e in args.confirm_env)
    digests: dict[str, dict[str, str]] = {}
    taken: set[str] = set()
    command = f"--backend {args.backend}" + (f" --ops {args.ops}" if args.ops else "")

    def on_ran(text: str, ran: Ran) -> None:
        if args.report and ran.digests:
            digests[text_key(text)] = ran.digests

    def on_finding(f: Finding) -> None:
        write_case(f, out, args.backend, command, taken)

    def on_also(a: AlsoFails) -> None:
        write_also(a, out, args.backend, confirm_label, taken)

    def on_progress(stats: Stats, note: str) -> None:
        if not args.quiet:
            print(progress_line(stats, note, len(fz.findings)), file=sys.stderr, flush=True)

    fz = Fuzzer(executor, ops, args.world_size, args.seed,
                Budget(args.examples, args.time, args.shrink_time, args.stop_at_first),
                database=out / ".hypothesis", on_finding=on_finding, on_progress=on_progress,
                on_ran=on_ran, differ=differ.check if differ else None,
                skip={x.strip() for x in args.skip_signatures.split(",") if x.strip()},
                confirm=confirm.run_text if confirm is not None else None, on_also=on_also,
                lanes=lanes)
    interrupted = False
    try:
        fz.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if lanes is not None:
            lanes.close()
        executor.close()
        if confirm is not None:
            confirm.close()
        if differ is not None and differ.other is not None:
            differ.other.close()
    if args.report:
        import torch

        write_digests(args.report, digests, {"backend": args.backend, "seed": str(args.seed),
                                             "torch": str(torch.__version__)})
    print(summary(fz, known, differ, interrupted))
    return 130 if interrupted else (1 if fz.findings else 0)
