"""Plain data from a file someone else wrote: a JSON document or a restricted pickle, bounded.

``collective-record --from-trace`` reads torch's Flight Recorder dumps (JSON, or the pickle a
``TORCH_FR_DUMP_TEMP_FILE`` dump writes) and execution traces (JSON). Whatever the file holds,
:func:`load_document` gives dicts with string keys, lists, strings, numbers, booleans and
``None``, or one :class:`~harness.record.trace.TraceError` line naming the file and, where
there is one, the place in it (``entries[3].input_sizes``):

- only a regular file of at most :data:`MAX_IMPORT_BYTES` is read (a FIFO or ``/dev/zero`` is
  refused before a byte is read: :func:`harness.report.jsonfile.read_bytes`);
- a pickle is first scanned opcode by opcode: only the opcodes of plain data pass (no global,
  no ``REDUCE`` or ``BUILD``, no set, no persistent id), every dict key is a string, memo
  indices stay within what was read. Then it is loaded by :class:`PlainUnpickler`, which
  refuses every global as well, so nothing in the file is ever called. Non-string keys are
  refused because hashing them is where a small pickle costs without bound (a tuple key
  built from shared tuples hashes 2**60 leaves; integer keys can all collide);
- a pickle may share parts (torch's dumps share their stack frames); they are counted every
  time they are used, and a document that would expand past :data:`MAX_VALUES` values is
  refused, as is one that contains itself or nests deeper than :data:`MAX_DEPTH`;
- an integer of more than :data:`MAX_INT_DIGITS` digits is refused where it stands (Python
  could not print it; a JSON parser refuses it with no position at all).

Shared parts stay shared in the result: the work of reading is linear in the file's size,
and everything downstream walks at most :data:`MAX_VALUES` values.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
from pathlib import Path
from typing import Any

from harness.record.trace import TraceError
from harness.report.jsonfile import UnreadableFile, printable, read_bytes

MAX_IMPORT_BYTES = 256 << 20
MAX_VALUES = 1 << 26  # counting shared parts each time they are used
MAX_DEPTH = 64
MAX_STACK = 1 << 22  # the unpickler's stack and marks: legit dumps stay near their depth
# Python prints no integer of more than 4300 digits; stay below, so every message can quote one.
MAX_INT_DIGITS = 4000
_INT_LIMIT = 10 ** MAX_INT_DIGITS

_STRINGS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE",
            "BINUNICODE", "BINUNICODE8"}
_PLAIN = _STRINGS | {
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "NONE", "NEWTRUE", "NEWFALSE",
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "EMPTY_LIST", "APPEND", "APPENDS", "LIST", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "PUT", "BINPUT", "LONG_BINPUT",
    "MEMOIZE", "GET", "BINGET", "LONG_BINGET"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_STR, _MARK, _OTHER = "str", "mark", "other"


class PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused before it is
    looked up, so ``__reduce__`` tricks (os.system, open, eval) never run. (The opcode scan
    of :func:`load_document` refuses them first; this is the second lock.)"""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses the global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses a persistent id")


class Refused(Exception):
    """Why a document is not plain, bounded data (the caller adds the file)."""


def load_document(path: Path) -> Any:
    """The file's content as plain data (JSON or a restricted pickle); TraceError otherwise."""
    try:
        raw = read_bytes(str(path), "trace", max_bytes=MAX_IMPORT_BYTES, gunzip=False)
    except UnreadableFile as e:
        raise TraceError(str(e)) from None
    if raw[:1] == b"\x80":  # a pickle (protocol 2 and later)
        try:
            scan_pickle(raw)
            doc = PlainUnpickler(io.BytesIO(raw)).load()
        except Refused as e:
            raise TraceError(f"{path}: not a plain-data pickle, refused without running it "
                             f"({e})") from None
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError,
                IndexError, AttributeError, RecursionError, MemoryError,
                UnicodeDecodeError) as e:
            raise TraceError(f"{path}: not a plain-data pickle, refused without running it "
                             f"({printable(str(e) or type(e).__name__, 80)})") from None
    else:
        doc = _json(path, raw)
    try:
        return Plain(shared=raw[:1] == b"\x80").value(doc)
    except Refused as e:
        raise TraceError(f"{path}: {e}") from None


def _json(path: Path, raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_int)
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: neither JSON nor a pickle (byte {e.start} is not UTF-8)"
                         ) from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                         "a truncated dump?") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply") from None


class _Huge(int):
    """A JSON integer too long to convert: kept as its digit count, refused where it stands."""


def _int(digits: str) -> int:
    # json would fail past 4300 digits with no position: Plain refuses it at its place.
    return _Huge(len(digits)) if len(digits.lstrip("-")) > MAX_INT_DIGITS else int(digits)


def json_value(text: str) -> Any:
    """Plain data from JSON text that a field of a document holds (Refused if it is not):
    bounded as a whole document is."""
    try:
        doc = json.loads(text, parse_int=_int)
    except json.JSONDecodeError as e:
        raise Refused(f"not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise Refused(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    return Plain(shared=False).value(doc)


def scan_pickle(raw: bytes) -> None:
    """Refused unless every opcode builds plain data: no global, call or set; dict keys are
    strings; memo indices within what was read; a bounded stack."""
    stack: list[str] = []
    memo: dict[int, str] = {}
    for n, (op, arg, where) in enumerate(pickletools.genops(raw)):
        name, pos = op.name, n if where is None else where
        if name not in _PLAIN:
            what = (f"the global {str(arg).replace(' ', '.')}" if name == "GLOBAL"
                    else f"the opcode {name}")
            raise Refused(f"refuses {printable(what, 80)} at byte {pos}")
        if name in _PUTS or name == "MEMOIZE":
            index = len(memo) if name == "MEMOIZE" else arg
            if not stack or stack[-1] == _MARK or type(index) is not int or not 0 <= index <= n:
                raise Refused(f"a memo entry {printable(index, 20)} at byte {pos} that does "
                              "not follow what was read")
            memo[index] = stack[-1]
            continue
        if name in _GETS:
            if arg not in memo:
                raise Refused(f"a memo entry {printable(arg, 20)} at byte {pos} that was "
                              "never stored")
            stack.append(memo[arg])
        elif name == "DUP":
            stack += _pop(stack, 1, pos) * 2
        else:
            taken = _pop_for(op, stack, pos)
            keys = taken[1:2] if name == "SETITEM" else taken[0::2] if name in {
                "SETITEMS", "DICT"} else []
            if any(k != _STR for k in keys):
                raise Refused(f"a dict key that is not a string at byte {pos}")
            for item in op.stack_after:
                stack.append(_MARK if item is pickletools.markobject
                             else _STR if name in _STRINGS else _OTHER)
        if len(stack) > MAX_STACK:
            raise Refused(f"more than {MAX_STACK} values pending at byte {pos}")


def _pop(stack: list[str], count: int, pos: int) -> list[str]:
    if len(stack) < count:
        raise Refused(f"an opcode at byte {pos} takes more than the stack holds")
    taken = stack[len(stack) - count:]
    del stack[len(stack) - count:]
    return taken


def _pop_for(op: Any, stack: list[str], pos: int) -> list[str]:
    """Pop what ``op`` takes; the items above its mark when it takes one, else all of them."""
    before = op.stack_before
    if pickletools.markobject not in before:
        return _pop(stack, len(before), pos)
    try:
        mark = len(stack) - 1 - stack[::-1].index(_MARK)
    except ValueError:
        raise Refused(f"an opcode at byte {pos} needs a mark that is not there") from None
    taken = stack[mark + 1:]
    del stack[mark:]
    _pop(stack, before.index(pickletools.markobject), pos)
    return taken


class _Misplaced(Exception):
    """Why a value is refused; each container on the way up adds its key to ``trail``."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why
        self.trail: list[str | int] = []


class Plain:
    """Checks a loaded document and gives it as JSON would (tuples as lists, converted in
    place), keeping shared parts shared; counts every value as often as it is used (at most
    :data:`MAX_VALUES`). ``shared``: whether parts may be shared (a pickle; a parsed JSON
    document has no shared part and no cycle, so nothing is remembered for it)."""

    def __init__(self, shared: bool = True) -> None:
        self.shared = shared
        self.done: dict[int, tuple[Any, int]] = {}  # id of a container -> (result, values)
        self.open: set[int] = set()

    def value(self, v: Any) -> Any:
        """The plain form of ``v`` (Refused, naming the place, if it is not one)."""
        try:
            return self._walk(v, 0)[0]
        except _Misplaced as e:
            raise Refused(f"at {_at(e.trail[::-1])}: {e.why}") from None

    def _walk(self, v: Any, depth: int) -> tuple[Any, int]:
        kind = type(v)
        if kind is str or kind is float or kind is bool or v is None:
            return v, 1
        if kind is int:
            if -_INT_LIMIT < v < _INT_LIMIT:
                return v, 1
            raise _Misplaced(f"an integer of more than {MAX_INT_DIGITS} digits, more than a "
                             "trace may hold")
        if kind is _Huge:
            raise _Misplaced(f"an integer of {int(v)} digits, more than the {MAX_INT_DIGITS} "
                             "a trace may hold")
        if kind is not dict and kind is not list and kind is not tuple:
            raise _Misplaced(f"a {kind.__name__}, not plain data")
        key = id(v)
        if self.shared:
            if key in self.done:
                return self.done[key]
            if key in self.open:
                raise _Misplaced("the document contains itself")
            self.open.add(key)
        if depth >= MAX_DEPTH:
            raise _Misplaced(f"nested more than {MAX_DEPTH} levels deep")
        size = 1
        out: Any = v if kind is not tuple else list(v)
        for k in (v if kind is dict else range(len(out))):
            item = out[k]
            try:
                plain, count = self._walk(item, depth + 1)
            except _Misplaced as e:
                e.trail.append(k)
                raise
            if kind is dict and type(k) is not str:
                raise _Misplaced("a key that is not a string")
            if plain is not item:
                out[k] = plain  # a tuple made a list; an existing key, so no resize
            size += count
        if size > MAX_VALUES:
            raise _Misplaced(f"more than {MAX_VALUES} values (a part shared in the file "
                             "counts each time it is used)")
        if self.shared:
            self.open.discard(key)
            self.done[key] = (out, size)
        return out, size


def _at(trail: list[str | int]) -> str:
    """``entries[3].input_sizes``: a place in a document, for messages."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in trail).lstrip(".")
    return printable(text or "the top", 100)
