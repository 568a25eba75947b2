"""Errors meant for a person at a terminal: what was wrong, where, and what to do."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any

# A message quotes at most this much of any value taken from a case file: a hostile file must
# not turn one error into megabytes of terminal output.
QUOTE_LIMIT = 200
MESSAGE_LIMIT = 1000
MAX_LISTED = 50


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to about ``limit`` characters (long values end with ``...``)."""
    if isinstance(value, str) and len(value) > 4 * limit:
        value = value[:4 * limit]  # repr of a huge string would cost its whole length first
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value) if not isinstance(value, (list, dict, tuple)) else _short_repr(value, limit)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _short_repr(value: Any, limit: int) -> str:
    # Containers from a hostile file may be huge or deeply nested: render only a prefix.
    out = ""
    seq = list(value.items())[:limit] if isinstance(value, dict) else list(value)[:limit]
    parts: list[str] = []
    for item in seq:
        if isinstance(item, tuple) and isinstance(value, dict):
            parts.append(f"{quote(item[0], 40)}: {quote(item[1], 60)}")
        else:
            parts.append(quote(item, 60) if not isinstance(item, (list, dict, tuple))
                         else "[...]" if not isinstance(item, dict) else "{...}")
        out = ", ".join(parts)
        if len(out) > limit:
            break
    open_, close = ("{", "}") if isinstance(value, dict) else ("[", "]")
    return open_ + out + close


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class Pos:
    """A position in a case file (1-based line and column)."""

    file: str
    line: int
    col: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class CaseFileError(Exception):
    """A case file is malformed. Rendered as ``file:line:col: at PATH: message (hint)``."""

    def __init__(self, pos: Pos, message: str, path: str = "", hint: str = "") -> None:
        self.pos = pos
        self.path = clip(path, QUOTE_LIMIT)
        self.message = clip(message)
        self.hint = clip(hint)
        super().__init__(self.render())

    def render(self) -> str:
        where = f" at {self.path}:" if self.path else ""
        text = f"{self.pos}:{where} {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


class CaseFileErrors(Exception):
    """Several problems found in one file, reported together so a person fixes them at once."""

    def __init__(self, errors: list[CaseFileError]) -> None:
        self.errors = errors
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{len(self.errors)} problem(s) in case file {self.errors[0].pos.file}:"
        shown = [e.render() for e in self.errors[:MAX_LISTED]]
        if len(self.errors) > MAX_LISTED:
            shown.append(f"... and {len(self.errors) - MAX_LISTED} more")
        return "\n".join([head, *shown])


class ExprError(ValueError):
    """An expression in a case uses something the whitelisting evaluator does not allow."""


def json_path(parts: tuple[str | int, ...]) -> str:
    """Render a key path as ``cases[3].input.0``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "<document>"


# Frames of files under the package root (where this module lives) are the harness's own
# machinery, not the user's call.
HARNESS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FRAME = re.compile(r'\s*File "([^"]+)", line \d+')
_PACKAGE_SEP = os.sep + "harness" + os.sep


@functools.cache
def _modules() -> frozenset[str]:
    """The package's module files, relative to its root (``program/interpreter.py``)."""
    return frozenset(os.path.relpath(os.path.join(d, f), HARNESS_DIR)
                     for d, _, files in os.walk(HARNESS_DIR) for f in files
                     if f.endswith(".py"))


def harness_frame(path: str) -> bool:
    """Whether a traceback frame's file is the harness's own. A rank on another node
    (external-ranks mode) may run the harness from another install path: its frames are
    known by a path ending in ``harness/`` and a module this package has."""
    if path.startswith(HARNESS_DIR):
        return True
    _, sep, rel = path.rpartition(_PACKAGE_SEP)
    return bool(sep) and rel in _modules()


def trim_traceback(text: str) -> str:
    """``text`` without the harness's own frames (the rank loop, the interpreter, the op
    table's call): what is left starts at torch's entry point, and a line says how many
    frames were cut. The op call itself is named by the step description beside it."""
    out: list[str] = []
    skipping = False
    cut = 0
    for ln in text.rstrip().splitlines():
        frame = _FRAME.match(ln)
        if frame:
            skipping = harness_frame(frame.group(1))
            cut += skipping
            if skipping:
                continue
        elif skipping and ln.startswith("    "):
            continue  # the source line and ^^^ markers of a cut frame
        else:
            skipping = False
        out.append(ln)
    if cut and out and out[0].startswith("Traceback"):
        out.insert(1, f"  ({cut} harness frame(s) left out)")
    return "\n".join(out)


def int_in(least: int, most: int) -> Any:
    """An argparse ``type`` for a whole number within ``least..most`` (argparse then reports
    a value outside it as a one-line usage error naming the option, exit 2)."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{clip(text, 40)!r} is not a whole number"
                                             ) from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{value} is outside {least}..{most:,}")
        return value

    return parse


def float_in(least: float, most: float, *, open_low: bool = False) -> Any:
    """An argparse ``type`` for a finite number within ``least..most`` (``(least..most]``
    with ``open_low``): nan and inf are refused, never taken for "no limit"."""
    import argparse
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{clip(text, 40)!r} is not a number") from None
        low_ok = value > least if open_low else value >= least
        if not (math.isfinite(value) and low_ok and value <= most):
            raise argparse.ArgumentTypeError(
                f"{clip(text, 40)} is not a finite number in {'(' if open_low else '['}"
                f"{least:g}, {most:g}]")
        return value

    return parse
