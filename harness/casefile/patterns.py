"""The ``raises:`` patterns of case files: compiled at collection, matched in linear time.

Patterns come from case files, which may be hostile, and are matched against messages the
ranks produce. Python's :mod:`re` backtracks (``(a+)+$`` against 34 characters runs for
minutes), so patterns go through RE2 (``google-re2``), whose matching is linear in the subject.
RE2 has no backreferences or look-around; a pattern using them fails collection with a clean
message. Patterns are at most :data:`MAX_PATTERN` characters, and only the first
:data:`MAX_SUBJECT` characters of a message are searched.
"""

from __future__ import annotations

import functools
from typing import Any

import re2  # type: ignore[import-untyped]

MAX_PATTERN = 1000
MAX_SUBJECT = 64 * 1024

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print its own copy of every error to stderr
_OPTIONS.max_mem = 8 << 20  # bounds the compiled program (x{1000}{1000} is refused)


class PatternError(ValueError):
    """A pattern RE2 cannot compile, or one that is too long."""


@functools.lru_cache(maxsize=512)
def compile_pattern(pattern: str) -> Any:
    """The compiled pattern; :class:`PatternError` with a short reason if it is not valid."""
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"the pattern is longer than {MAX_PATTERN} characters")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(f"{str(reason)[:200]} (patterns use RE2 syntax: no backreferences "
                           "or look-around)") from None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` occurs in (the first :data:`MAX_SUBJECT` characters of) ``text``."""
    return compile_pattern(pattern).search(text[:MAX_SUBJECT]) is not None
