"""The options of ``collective-fuzz``: the parser and every check that can fail with a usage
error (exit 2, one line), all made before anything runs or is written.

Takes: the command line. Gives: the checked options, the ops to draw from and the digests of
``--against-report``. Must not: leave anything behind when an option is bad (``--out`` is
created last), or start a rank.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from ..errors import CaseFileError, float_in, int_in
from ..manifest.load import error_line as manifest_error
from ..manifest.load import read as read_manifest
from ..report.jsonfile import printable, unwritable
from . import space
from .differential import load_digests
from .summary import PROG

UNITS = {"s": 1, "m": 60, "h": 3600, "": 1}
BUNDLED = Path(__file__).resolve().parents[2] / "cases"
MAX_WORLD = 16  # the long matrix's largest world (cases/integrity.yaml)
DEFAULT_WORLD_SIZES = (1, 2, 3, 4)
DATABASE = ".hypothesis"  # the example database's folder, under --out


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
    """``2``, ``1-4`` or ``2,3`` -> world sizes within 1..MAX_WORLD (a range's ends are
    checked before it is expanded)."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            bounds = [lo, hi]
        else:
            bounds = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{printable(text, 40)!r} is not a world size, a "
                                         "range like 1-4 or a list like 2,3") from None
    if min(bounds) < 1 or max(bounds) > MAX_WORLD:
        raise argparse.ArgumentTypeError(f"{printable(text, 40)!r}: world sizes must lie "
                                         f"within 1..{MAX_WORLD}")
    if "-" not in text:
        return tuple(bounds)
    if lo > hi:
        raise argparse.ArgumentTypeError(f"{printable(text, 40)!r}: an empty range (write "
                                         "the smaller size first)")
    return tuple(range(lo, hi + 1))


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (exit 2)."""

    def error(self, message: str) -> NoReturn:  # one line, no usage block
        print(f"{PROG}: error: {printable(message, 300)}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    """The command line of ``collective-fuzz`` (and of each lane's worker process)."""
    ap = OneLineParser(
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
    ap.add_argument("--world-size", type=parse_world_sizes, default=DEFAULT_WORLD_SIZES,
                    help="world sizes to draw from: 2, 1-4 (default) or 2,3; at most "
                    f"{MAX_WORLD}")
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
                    help="run N fuzzing worker processes at once, each a whole fuzzer with its "
                    "own rank pools and seed (lane k: --seed + k); --examples is split "
                    "between them (default 1: in this process)")
    ap.add_argument("--against", default=None, metavar="NAME",
                    help="differential: compare passing instances bit for bit with backend NAME")
    ap.add_argument("--against-report", default=None, metavar="REPORT",
                    help="differential: compare with a --report written by another run")
    ap.add_argument("--report", default=None, metavar="PATH",
                    help="write every instance's output digests (for --against-report)")
    ap.add_argument("--overrides-for", default=None, metavar="NAME",
                    help="apply the overrides written for backend NAME too (a wrapper of it)")
    ap.add_argument("--manifest", default=None, metavar="FILE",
                    help="the backend's capability manifest: its module is imported, what it "
                    "inherits gives --overrides-for, and what it declares unsupported must be "
                    "rejected (a limitation, not a finding)")
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


def check(args: argparse.Namespace) -> tuple[str, ...]:
    """The ops to draw from, once every option that needs no backend is known good (Usage
    otherwise); sets the default budget."""
    if args.time is None and args.examples is None:
        args.examples = 1000
    apply_manifest(args)
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
    database = out / DATABASE
    if (database.exists() or database.is_symlink()) and not database.is_dir():
        # Hypothesis would fail to save quietly and replay nothing: no database at all.
        raise Usage(f"--out: {printable(database, 160)} is not a folder; it is where the "
                    "example database goes (remove it, or give another --out)")
    if args.report:
        why = unwritable(args.report, "--report file")
        if why:
            raise Usage(f"--report: {printable(why, 200)}")
    return ops


def apply_manifest(args: argparse.Namespace) -> None:
    """``--manifest``: read (Usage, one line, on anything wrong), its module added to the
    backend modules and its ``inherits:`` made the ``--overrides-for`` default."""
    args.manifest_data = None
    if not args.manifest:
        return
    try:
        manifest = read_manifest(args.manifest)
    except CaseFileError as exc:
        raise Usage(f"--manifest: {manifest_error(exc)}") from None
    if manifest.backend != args.backend:
        raise Usage(f"--manifest {printable(args.manifest, 120)} is for backend "
                    f"{manifest.backend!r}, not --backend {printable(args.backend, 60)!r}")
    if manifest.module and manifest.module not in args.backend_module:
        args.backend_module.append(manifest.module)
    if args.overrides_for is None and manifest.inherits:
        args.overrides_for = manifest.inherits
    args.manifest_data = manifest


def env_var(item: str) -> tuple[str, str]:
    """``VAR=VALUE`` (checked by :func:`check`) -> (VAR, VALUE)."""
    name, value = item.split("=", 1)
    return name, value


def database_path(args: argparse.Namespace) -> Path:
    """The folder of the Hypothesis example database: ``--out``/.hypothesis."""
    return Path(args.out) / DATABASE


def make_out(args: argparse.Namespace) -> None:
    """Create ``--out`` and its example database folder, each checked writable (only once
    every other option is known to be good)."""
    for folder, what in ((Path(args.out), "--out"), (database_path(args),
                                                      "the example database")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise Usage(f"--out: {printable(folder, 160)} is not a writable folder for "
                        f"{what} ({exc.strerror or type(exc).__name__})") from None


def backend_known(name: str, modules: tuple[str, ...]) -> bool:
    """Whether torch.distributed has backend ``name`` once ``modules`` are imported."""
    import importlib

    import torch.distributed as dist

    for m in modules:
        importlib.import_module(m)
    if name in ("gloo", "nccl", "mpi", "ucc"):
        return bool(dist.is_backend_available(name))
    return name.upper() in dist.Backend._plugins or hasattr(dist.Backend, name.upper())


def prepare(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, dict[str, str]] | None]:
    """Every usage check, then ``--out`` made: the ops and the ``--against-report`` digests.
    Usage (or BadReport, or ImportError from ``--backend-module``) on the first bad option."""
    ops = check(args)
    modules = tuple(args.backend_module)
    for opt, name in (("--backend", args.backend), ("--against", args.against),
                      ("--confirm-against", args.confirm_against)):
        if name is not None and not backend_known(name, modules):
            raise Usage(f"{opt}: unknown or unavailable backend {name!r}")
    report_digests: dict[str, dict[str, str]] | None = None
    if args.against_report:
        report_digests, _meta = load_digests(args.against_report)
    make_out(args)  # last: a bad option leaves nothing behind
    return ops, report_digests



def backend_options(args: argparse.Namespace) -> str:
    """``--backend NAME`` and every ``--backend-module``: what both collective-fuzz and pytest
    need to reach the backend under test (a third-party one is registered by its module)."""
    return shlex.join(["--backend", args.backend,
                       *(x for m in args.backend_module for x in ("--backend-module", m))])


def reproduce_command(args: argparse.Namespace) -> str:
    """The options a finding's case file names to find it again (with its seed): the backend
    and its modules, and what changes the draws (the ops, the world sizes)."""
    extra = ["--ops", args.ops] if args.ops else []
    if args.manifest:
        extra += ["--manifest", args.manifest]
    if tuple(args.world_size) != DEFAULT_WORLD_SIZES:
        extra += ["--world-size", ",".join(str(w) for w in args.world_size)]
    return backend_options(args) + (" " + shlex.join(extra) if extra else "")


def confirm_label(args: argparse.Namespace) -> str:
    """The confirming backend and its environment, as "also fails" files name them."""
    return (args.confirm_against or "") + "".join(f" {e}" for e in args.confirm_env)


def differ_label(args: argparse.Namespace) -> str | None:
    """What differential mode compares with (``--against`` or ``--against-report``)."""
    if args.against:
        return f"backend {args.against}"
    return f"report {args.against_report}" if args.against_report else None
