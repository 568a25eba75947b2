"""``python -m harness.external``: the options, and the entry point every rank runs.

The options that shape how an instance runs and is judged are the pytest plugin's, with the
same names and meanings (``--deadline``, ``--check-iters``, ``--ordering``, ``--ordering-delay``,
``--perf`` and its loop settings): a launched run checks what the same cases check under pytest.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import CaseFileError, float_in, int_in, quote
from ..manifest.load import error_line
from ..manifest.load import read as read_manifest
from ..ordering import plan as ordering
from ..perf import plan as perfplan
from ..report.jsonfile import unwritable
from ..runner.settings import RunSettings
from . import __doc__ as PACKAGE_DOC
from .files import PROG, ReportFiles, write_started
from .launch import env_int


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m harness.external``."""
    ap = argparse.ArgumentParser(prog=PROG, description=PACKAGE_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="case files or folders")
    ap.add_argument("--backend", default=None, help="the backend (default: the manifest's, "
                                                    "else gloo)")
    ap.add_argument("--backend-module", action="append", default=[])
    ap.add_argument("--manifest", default=None, metavar="FILE",
                    help="the backend's capability manifest, as pytest --manifest "
                         "(docs/howto/certify.md): declared gaps must be rejected")
    ap.add_argument("--deadline", type=float_in(0, 86400, open_low=True), default=120.0)
    ap.add_argument("-k", dest="keyword", default="", help="only instance keys containing this")
    ap.add_argument("--full", action="store_true",
                    help="also run instances marked 'full' (the long matrix), as pytest --full")
    ap.add_argument("--check-iters", type=int_in(1, 100), default=1, metavar="N",
                    help="run each instance whose expected values the reference model computes "
                         "N times on fresh inputs, checking every iteration (as pytest)")
    # The plugin's option tables: the same names, defaults, checks and help as under pytest.
    for flags, dest, default, text, choices in ordering.OPTIONS:
        ap.add_argument(flags[0], dest=dest, default=default, help=text,
                        **({"choices": choices} if choices else {"metavar": "SECONDS"}))
    ap.add_argument("--report-json", default="reports/conformance.json")
    ap.add_argument("--report-md", default="reports/conformance.md")
    ap.add_argument("--state-dir", default="reports/.external-state",
                    help="progress kept for resuming after a hang or crash (shared by all "
                         "nodes for multi-node resumes)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run recorded in --state-dir (a relaunch by hand; "
                         "torchrun's restarts resume by themselves)")
    ap.add_argument("--no-pack", action="store_true",
                    help="one instance at a time (to measure what packing gains)")
    ap.add_argument("--perf", action="store_true",
                    help="time every passing instance like nccl-tests (docs/howto/bandwidth.md); "
                         "instances then run one at a time, so that timings do not compete")
    for opt, ini, _typ, _default, text in perfplan.SETTINGS:
        ap.add_argument(opt, dest=ini, default=None, metavar="N", help=text)
    return ap


def settings(args: argparse.Namespace) -> RunSettings:
    """The run settings the options ask for (the runner's, as the plugin builds them);
    ValueError naming the option when one is out of range. Settles ``args.backend`` and
    ``args.backend_module`` from the manifest, as the plugin does."""
    manifest = None
    if args.manifest:
        try:
            manifest = read_manifest(args.manifest)
        except CaseFileError as exc:
            raise ValueError(f"--manifest: {error_line(exc)}") from None
        if args.backend and args.backend != manifest.backend:
            raise ValueError(f"--manifest {quote(args.manifest)} is for backend "
                             f"{quote(manifest.backend)}, not --backend {quote(args.backend)}: "
                             "leave --backend out, or give that backend's manifest")
        args.backend = manifest.backend
        if manifest.module and manifest.module not in args.backend_module:
            args.backend_module.append(manifest.module)
    args.backend = args.backend or "gloo"
    loop = perfplan.loop_settings({opt: getattr(args, ini)
                                   for opt, ini, _t, _d, _h in perfplan.SETTINGS})
    delay = args.collective_ordering_delay
    try:
        delay_s = float(delay)
    except ValueError:
        raise ValueError(f"--ordering-delay {str(delay)[:40]!r}: not a number") from None
    return RunSettings(backend=args.backend, backend_modules=tuple(args.backend_module),
                       deadline_s=args.deadline, check_iters=args.check_iters,
                       ordering=ordering.OrderingSettings(args.collective_ordering, delay_s),
                       perf=perfplan.PerfSettings(enabled=args.perf, loop=loop),
                       manifest=manifest)


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m harness.external`` on every rank."""
    ap = parser()
    args = ap.parse_args(argv)
    try:
        run_settings = settings(args)
    except ValueError as exc:  # every rank stops here alike, before anything is written
        ap.error(str(exc))
    for flag, path in (("--report-json", args.report_json), ("--report-md", args.report_md)):
        why = unwritable(path, "report")
        if why:  # every rank stops here alike (the path is the same for all of them)
            print(f"{PROG}: {flag} {why}; give another path", file=sys.stderr)
            return 2
    report_files = ReportFiles(args.report_json, args.report_md)
    if env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK") == 0:
        # Before anything can fail (a case file, the state directory, the process group):
        # whatever report stood at these paths is no longer this run's result.
        write_started(report_files, args.backend)
    from .session import ExternalRun  # imports torch: only once the options are good

    return ExternalRun(args, run_settings, report_files).run()
