"""Files anyone may have written or pointed at: reading JSON, printing its text, output paths.

Every command that reads a report or a baseline goes through :func:`read_json`: whatever the
file holds (a directory, a FIFO, UTF-16, a truncated gzip stream, 60,000 nested ``[``, a
duplicated key), the result is a parsed document or one :class:`UnreadableFile` whose message is
one line naming the file, never a traceback or a hang. :func:`printable` makes text taken from
such a file inert on a terminal (no escape sequence, no forged line).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import zlib
from typing import Any

# A report of the whole library with --full is about 15 MB; anything past this is not one.
MAX_BYTES = 1 << 30
# The deepest legitimate document (a record's ranks, their checks, their first wrong values) is
# about 8 levels; deeper ones are refused before a validator recurses through them.
MAX_DEPTH = 64
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
         (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))
# C0/C1 controls, line and paragraph separators, bidirectional overrides: each could move the
# cursor, clear the screen, start a line or reorder what a person reads.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                          "\u2066-\u2069]")


class UnreadableFile(Exception):
    """A file that cannot be used; the message is one line and names the file."""


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def printable(text: object, limit: int = 0) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``), so it
    prints on one line and cannot drive the terminal; cut to ``limit`` characters if given."""
    out = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"),
                           str(text))
    return out if not limit or len(out) <= limit else out[:limit - 1] + "…"


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return out


def read_bytes(path: str, what: str = "file", missing_hint: str = "",
               max_bytes: int = MAX_BYTES, gunzip: bool | None = None) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them (decompressed
    when ``gunzip``, by default when the name ends in ``.gz``).

    :class:`UnreadableFile` (one line naming the file) for a missing file (``missing_hint``
    follows), a directory, a FIFO, device or socket (it would block or never end: refused
    before a byte is read, the type taken from the opened file itself), or more bytes than
    ``max_bytes``, which are never read past."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the type is then checked on
        # the descriptor itself, so a file swapped after a stat cannot slip through.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnreadableFile(f"{path}: {what} not found{missing_hint}") from None
    except NotADirectoryError:
        raise UnreadableFile(f"{path}: {what} not found (a part of the path is a file, "
                             "not a folder)") from None
    except IsADirectoryError:
        raise UnreadableFile(f"{path}: is a directory; give the {what}'s file path") from None
    except (OSError, ValueError) as exc:
        raise UnreadableFile(f"{path}: cannot read the {what}: {_why(exc)}") from None
    refusal = _refusal(path, what, os.fstat(fd), max_bytes)
    if refusal:
        os.close(fd)
        raise UnreadableFile(refusal)
    with os.fdopen(fd, "rb") as raw:
        try:
            if path.endswith(".gz") if gunzip is None else gunzip:
                with gzip.open(raw, "rb") as fh:
                    data = fh.read(max_bytes + 1)
            else:
                data = raw.read(max_bytes + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise UnreadableFile(f"{path}: not a complete gzip file (truncated or corrupt: "
                                 f"{_why(exc)})") from None
        except OSError as exc:
            raise UnreadableFile(f"{path}: cannot read the {what}: {_why(exc)}") from None
    if len(data) > max_bytes:  # grew while being read, or decompresses to more
        raise UnreadableFile(f"{path}: larger than the {_size(max_bytes)} a {what} may have")
    return data


def _refusal(path: str, what: str, info: os.stat_result, max_bytes: int) -> str:
    """Why an opened file is not read ("" when it is read)."""
    if stat.S_ISDIR(info.st_mode):
        return f"{path}: is a directory; give the {what}'s file path"
    if not stat.S_ISREG(info.st_mode):
        return (f"{path}: not a regular file (a device, FIFO or socket); give the {what}'s "
                "file path")
    if info.st_size > max_bytes:
        return (f"{path}: {info.st_size} bytes, larger than the {_size(max_bytes)} a {what} "
                "may have")
    return ""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


def _why(exc: BaseException) -> str:
    return printable(getattr(exc, "strerror", None) or exc or type(exc).__name__, 200)


def _depth_ok(doc: Any) -> bool:
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return True


def read_json(path: str, what: str = "file", missing_hint: str = "",
              max_bytes: int = MAX_BYTES) -> Any:
    """The JSON document at ``path`` (gzip-compressed when it ends in ``.gz``), read by
    :func:`read_bytes` (a regular file of at most ``max_bytes``).

    :class:`UnreadableFile` for anything else: missing (``missing_hint`` follows), a directory
    or special file, not UTF-8, not JSON, nested deeper than :data:`MAX_DEPTH` or holding a key
    twice in one object (a later value would silently hide an earlier one)."""
    data = read_bytes(path, what, missing_hint, max_bytes)
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise UnreadableFile(f"{path}: the text is {name} (it starts with a byte order "
                                 "mark); save it as UTF-8")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"{path}: not UTF-8 text (invalid byte at offset {exc.start}); "
                             f"not a {what}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise UnreadableFile(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: "
                             f"{exc.msg})") from None
    except _Duplicate as exc:
        raise UnreadableFile(f"{path}: the key {printable(repr(exc.key), 80)} appears twice "
                             "in one object (a later value would hide the earlier one); not a "
                             f"{what} as written by collective-harness") from None
    except RecursionError:
        raise UnreadableFile(f"{path}: nested too deeply to be a {what}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UnreadableFile(f"{path}: not valid JSON ({_why(exc)})") from None
    if not _depth_ok(doc):
        raise UnreadableFile(f"{path}: nested more than {MAX_DEPTH} levels deep; not a {what}")
    return doc


def unwritable(path: str, what: str = "file") -> str:
    """Why ``path`` cannot be written as a file (one line naming it), or ``""`` when it can:
    checked before any work so that a wrong output path costs nothing."""
    if os.path.isdir(path):
        return f"{path}: is a directory; give a file path for the {what}"
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):  # write_all creates missing folders
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if not os.path.isdir(folder):
        return (f"{path}: cannot write the {what}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{path}: cannot write the {what}: the folder {folder} is not writable"
    return ""
