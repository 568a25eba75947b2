"""Errors meant for a person at a terminal: what was wrong, where, and what to do."""

from __future__ import annotations

from dataclasses import dataclass


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
        self.path = path
        self.message = message
        self.hint = hint
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
        return "\n".join([head, *(e.render() for e in self.errors)])


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
