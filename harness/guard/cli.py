"""``collective-guard``: run a training command with a sample of its collectives checked.

    collective-guard [--sample N|every] [--on-mismatch warn|raise|abort] [--findings DIR]
                     [--chunk ELEMENTS] [--timeout S] [--ops a,b] [--keep-inputs ELEMENTS]
                     [--inject FAULT] -- CMD ...

Exit status: the command's own (the guard never turns a run that succeeded into a failure:
``--on-mismatch raise|abort`` are how a finding stops the job); 2 for a bad setting (one line
on stderr, nothing run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from harness.guard.findings import read_folder, write_cases
from harness.guard.settings import (
    DEFAULT_CHUNK,
    DEFAULT_EVERY,
    DIR_ENV,
    ENV,
    FAMILIES,
    MAX_KEEP,
    MODES,
    Settings,
    SettingsError,
    sample_rate,
    to_env,
    validate,
)

SITE = Path(__file__).resolve().parent / "site"
ROOT = Path(__file__).resolve().parents[2]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SettingsError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="collective-guard",
                description="Run a training command; check a sample of its own collectives "
                            "from digests exchanged on the job's store; write each mismatch "
                            "as a case file.",
                epilog="example: collective-guard --sample 100 -- torchrun --nproc-per-node 8 "
                       "train.py")
    p.add_argument("--sample", default=str(DEFAULT_EVERY), metavar="N|every",
                   help=f"check one call in N per op family and group (default "
                        f"{DEFAULT_EVERY}); 'every' checks each call (a soak test)")
    p.add_argument("--on-mismatch", default="warn", metavar="|".join(MODES),
                   help="warn: one line, the job goes on (default); raise: the rank's next "
                        "checked collective raises; abort: the rank aborts after writing it")
    p.add_argument("--findings", type=Path, default=Path("findings"),
                   help="folder for the case files (default findings/); the ranks' raw "
                        "findings go to its raw/ folder")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, metavar="ELEMENTS",
                   help=f"elements per digested chunk: the unit a mismatch is localised to "
                        f"(default {DEFAULT_CHUNK})")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds a rank waits for the others' digests before it stops checking "
                        "(default 60)")
    p.add_argument("--ops", default=",".join(FAMILIES),
                   help=f"op families to check (default all: {','.join(FAMILIES)})")
    p.add_argument("--keep-inputs", type=int, default=0, metavar="ELEMENTS",
                   help=f"copy each sampled call's input of at most ELEMENTS elements per rank "
                        f"(up to {MAX_KEEP}) so that a finding's case replays the job's own "
                        "values; default 0: none kept (the case uses generated inputs)")
    p.add_argument("--inject", default="", metavar="FAULT",
                   help="a drill: run the job's Gloo groups on collective-mutate's backend with "
                        "this fault (see collective-mutate --list-faults)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch command")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    """The validated settings of a parsed command line (SettingsError if one is bad)."""
    if args.on_mismatch not in MODES:
        raise SettingsError(f"--on-mismatch {args.on_mismatch!r}: choose one of "
                            f"{', '.join(MODES)}")
    families = tuple(f.strip() for f in str(args.ops).split(",") if f.strip())
    return validate(Settings(every=sample_rate(args.sample), on_mismatch=args.on_mismatch,
                             chunk=args.chunk, timeout_s=args.timeout, families=families,
                             inject=args.inject, keep_inputs=args.keep_inputs))


def _launch(command: list[str], raw: Path, settings: Settings) -> int:
    env = dict(os.environ)
    path = [str(SITE), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[DIR_ENV] = str(raw)
    env[ENV] = to_env(settings)
    try:
        return subprocess.run(command, env=env, check=False).returncode
    except OSError as e:
        raise SettingsError(f"cannot run {command[0]!r}: {e.strerror or e}") from None


def _with_kernel(settings: Settings) -> Settings:
    """Build the C++ kernel before the ranks start (once; cached), so that they only load it;
    where it cannot be built the ranks use the Python kernel, and this says so once."""
    from harness.record import native  # imports torch: only for a launch
    try:
        native.load_announced("collective-guard")
    except native.NativeUnavailable as exc:
        print(f"collective-guard: the C++ kernel cannot be built ({exc}); the ranks use the "
              "Python kernel, which makes every checked-kind call slower", file=sys.stderr)
        return replace(settings, hook="python")
    return settings


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring for the exit status."""
    try:
        args = _parser().parse_args(argv)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            raise SettingsError("no launch command: give it after '--', e.g. "
                                "collective-guard -- python train.py")
        settings = settings_from(args)
        raw = args.findings / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for old in [*raw.glob("findings-*.jsonl"), *raw.glob("stats-*.json"),
                    *raw.glob("inputs-*.jsonl")]:
            old.unlink()
        rc = _launch(command, raw.resolve(), _with_kernel(settings))
    except SettingsError as e:
        print(f"collective-guard: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"collective-guard: error: {e.filename or args.findings}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    read = read_folder(raw)
    written, problems = write_cases(read, args.findings, " ".join(command))
    for line in problems:
        print(f"collective-guard: {line}", file=sys.stderr)
    checked = sum(int(s.get("checked", 0)) for s in read.stats)
    off = [s.get("rank") for s in read.stats if s.get("off")]
    tail = f"; stopped early in rank(s) {off}" if off else ""
    # A rank that aborted (or was killed) wrote no counts: the total would understate it.
    counted = {s.get("pid") for s in read.stats}
    uncounted = sorted({f.get("rank") for f in read.findings if f.get("pid") not in counted},
                       key=str)
    if uncounted:
        tail += f"; rank(s) {uncounted} ended before writing their counts (not included)"
    torn = f"; {read.skipped} unreadable line(s) skipped" if read.skipped else ""
    if read.findings:
        print(f"collective-guard: {len(read.findings)} mismatch report(s) in {checked} checked "
              f"call(s) -> {len(written)} case file(s) in {args.findings}/ (replay: pytest "
              f"{args.findings}/){tail}{torn}", file=sys.stderr)
    else:
        print(f"collective-guard: no mismatch in {checked} checked call(s){tail}{torn}",
              file=sys.stderr)
    return rc
