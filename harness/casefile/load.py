"""Load a YAML case file safely, keeping the line and column of every value.

PyYAML's defaults are hostile to a declarative format: ``yes``/``no``/``on``/``off`` become
booleans, ``1e-5`` becomes a string, ``010`` becomes 8, duplicate keys silently overwrite the
first, and aliases can expand into a billion nodes. This loader composes the node tree with a
YAML-1.2-like resolver and builds plain Python values itself, so each of those is either read
the way a person meant it (``1e-5`` is a float) or rejected with a message naming the place.
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import CaseFileError, Pos, json_path, quote
from .limits import Limits

Path = tuple[str | int, ...]

MAX_NODES = Limits().nodes  # guards against alias ("billion laughs") expansion
# No case needs more than a dozen levels; a few hundred would exhaust Python's recursion.
MAX_DEPTH = 64
MAX_DIGITS = 40  # an integer literal longer than this is not a case value (and int() is slow)
INT_BOUND = 1 << 64  # integers must fit 64 bits (uint64 included)

_INT_RE = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_HEX_RE = re.compile(r"^0x[0-9a-fA-F_]+$")
_FLOAT_RE = re.compile(
    r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
)
_LEADING_ZERO_RE = re.compile(r"^[-+]?0[0-9_]+$")
# Escapes in double-quoted strings ("\0", "\ud800") reach what the reader lets through: control
# characters break JUnit XML, and a lone surrogate cannot be written as UTF-8 at session end.
_BAD_CHAR_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_YAML11_BOOLS = {"yes", "no", "on", "off"}
# Where PyYAML's parser and libyaml's read the same text differently (found by mutating the
# bundled case files: libyaml takes tabs as separators, a "?" inside a flow collection as
# text, some tags PyYAML refuses; it finds a control character only when it gets there, PyYAML
# before anything; it places an empty value in a flow mapping, ``{a: , b: 1}``, or an empty
# document one column or line further; it takes ``|#`` as a block scalar and a comment): such a
# text is read by PyYAML's alone, so that it is accepted or refused, and every position and
# message is the same, whatever else the file holds.
_PYYAML_ONLY = re.compile(r"[\t?!\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|:[ ]*[,}\]]|[|>]#")

_STR = "tag:yaml.org,2002:str"
_STD_TAGS = {
    _STR,
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:map",
}


class _Resolver(yaml.resolver.BaseResolver):
    """Resolve nothing implicitly: plain scalars get the tag ``?`` and :func:`_scalar` decides."""

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        if kind is ScalarNode and implicit[0]:
            return "?"
        return str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]


class _Budgeted(yaml.composer.Composer):
    """PyYAML's composer with a node budget and a depth limit checked while it builds; the
    events come from PyYAML's pure-Python parser (:class:`_Loader`) or libyaml's
    (:class:`_CEventLoader`)."""

    file: str
    max_nodes: int
    budget: int
    depth: int

    def _budget(self, file: str, max_nodes: int) -> None:
        self.file = file
        self.max_nodes = max_nodes
        self.budget = max_nodes
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        mark = self.peek_event().start_mark  # type: ignore[attr-defined]
        pos = Pos(self.file, mark.line + 1, mark.column + 1)
        self.budget -= 1
        if self.budget < 0:
            raise CaseFileError(pos, f"the file has more than {self.max_nodes} YAML values",
                                hint="split it, or raise the limit: --max-case-nodes / ini "
                                "collective_max_case_nodes")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CaseFileError(pos, f"values nested more than {MAX_DEPTH} levels deep",
                                hint="case files are shallow: flatten this value")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _Budgeted,
              _Resolver):
    """The pure-Python parser under the budgeted composer: it words every syntax error."""

    def __init__(self, stream: str, file: str, max_nodes: int) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Resolver.__init__(self)
        self._budget(file, max_nodes)


# libyaml's parser (PyYAML built with it): about ten times faster than the pure-Python one.
_CParser: Any = getattr(getattr(yaml, "_yaml", None), "CParser", None)
_CEventLoader: Any = None
if _CParser is not None:
    class _CEventLoader(_Budgeted, _CParser, _Resolver):  # type: ignore[no-redef,misc]
        """libyaml's events composed in Python: the budget and depth limit apply to them as
        they are read, as with :class:`_Loader`."""

        def __init__(self, stream: str, file: str, max_nodes: int) -> None:
            _CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            _Resolver.__init__(self)
            self._budget(file, max_nodes)


@dataclass
class Document:
    """A loaded YAML document: plain data plus the position of every path in it."""

    file: str
    data: Any
    positions: dict[Path, Pos] = field(default_factory=dict)
    key_positions: dict[Path, Pos] = field(default_factory=dict)  # where each key is written

    def pos(self, path: Path) -> Pos:
        """Position of ``path``, or of its nearest ancestor that has one."""
        p = path
        while p not in self.positions and p:
            p = p[:-1]
        return self.positions.get(p, Pos(self.file, 1, 1))

    def error(self, path: Path, message: str, hint: str = "", at_key: bool = False
              ) -> CaseFileError:
        """An error at ``path`` (at the key itself rather than its value if ``at_key``)."""
        pos = self.key_positions.get(path) if at_key else None
        return CaseFileError(pos or self.pos(path), message, json_path(path), hint)


def _check_text(pos: Pos, value: str, path: Path) -> None:
    bad = _BAD_CHAR_RE.search(value)
    if bad:
        raise CaseFileError(pos, f"the string holds the character U+{ord(bad.group()):04X}",
                            json_path(path), "case files hold printable text only")


def _scalar(doc: Document, node: ScalarNode, path: Path) -> Any:
    value: str = node.value
    _check_text(doc.pos(path), value, path)
    if node.tag != _STR and node.tag not in _STD_TAGS and node.tag != "?":
        raise doc.error(path, f"YAML tag {quote(node.tag)} is not allowed in case files",
                        "case files may only hold plain data: strings, numbers, lists, maps")
    if node.tag == _STR:  # quoted or explicitly tagged: always a string
        return value
    if node.tag != "?":
        return _tagged(doc, node.tag, value, path)
    low = value.lower()
    if value in ("", "~", "null", "Null", "NULL"):
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    if low in _YAML11_BOOLS:
        raise doc.error(path, f"ambiguous value {value!r}: YAML 1.1 reads it as a boolean",
                        f"write true or false, or quote it ('{value}') if you meant the string")
    if _INT_RE.match(value) or _HEX_RE.match(value):
        return _int(doc, value, path, 16 if _HEX_RE.match(value) else 10)
    if _LEADING_ZERO_RE.match(value):
        raise doc.error(path, f"ambiguous number {value!r}: a leading zero reads as octal "
                        "in YAML 1.1",
                        f"write {value.lstrip('0') or '0'} for the decimal number, or quote it")
    if _FLOAT_RE.match(value):
        return _float(doc, value, path)
    return value


def _int(doc: Document, value: str, path: Path, base: int) -> int:
    text = value.replace("_", "")
    if len(text) > MAX_DIGITS:
        raise doc.error(path, f"integer {quote(value, 60)} has {len(text)} digits",
                        "case values must fit in 64 bits")
    try:
        number = int(text, base)
    except ValueError:
        raise doc.error(path, f"{quote(value)} is not an integer") from None
    if not -INT_BOUND < number < INT_BOUND:
        raise doc.error(path, f"integer {quote(value, 60)} does not fit in 64 bits",
                        "case values must fit in 64 bits")
    return number


def _float(doc: Document, value: str, path: Path) -> float:
    text = value.replace("_", "").lower().replace(".inf", "inf").replace(".nan", "nan")
    try:
        number = float(text)
    except ValueError:
        raise doc.error(path, f"{quote(value)} is not a number") from None
    if math.isinf(number) and "inf" not in text:
        raise doc.error(path, f"{quote(value, 60)} is too large for a float (it would read as "
                        "infinity)", "write .inf or -.inf if you mean infinity")
    return number


def _tagged(doc: Document, tag: str, value: str, path: Path) -> Any:
    """An explicitly tagged scalar (``!!int 3``): the value must be what the tag says."""
    short = tag.replace("tag:yaml.org,2002:", "!!")
    if tag == "tag:yaml.org,2002:int":
        text = value.replace("_", "")
        if _INT_RE.match(text) or _HEX_RE.match(text):
            return _int(doc, value, path, 16 if _HEX_RE.match(text) else 10)
        raise doc.error(path, f"{short} {quote(value)} is not an integer",
                        "write a decimal integer such as 42")
    if tag == "tag:yaml.org,2002:float":
        if _FLOAT_RE.match(value) or _INT_RE.match(value):
            return _float(doc, value, path)
        raise doc.error(path, f"{short} {quote(value)} is not a number",
                        "write a number such as 1.5, 1e-5 or .inf")
    if tag == "tag:yaml.org,2002:bool" and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if tag == "tag:yaml.org,2002:null" and value in ("", "~", "null", "Null", "NULL"):
        return None
    raise doc.error(path, f"{short} {quote(value)} is not a valid {short} value",
                    "drop the tag and write plain data")


class _Build:
    """State of one document build: the value budget and the nodes being built (cycles)."""

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = max_nodes
        self.budget = max_nodes
        self.open: set[int] = set()


def _build(doc: Document, node: Node, path: Path, state: _Build) -> Any:
    state.budget -= 1
    pos = Pos(doc.file, node.start_mark.line + 1, node.start_mark.column + 1)
    if state.budget < 0:
        raise CaseFileError(pos, f"document expands to more than {state.max_nodes} values",
                            json_path(path),
                            "aliases (*name) may not be used to blow up a case file")
    if id(node) in state.open:
        raise CaseFileError(pos, "an alias refers to a value that contains it",
                            json_path(path), "self-referencing aliases are not allowed")
    if len(path) > MAX_DEPTH:
        raise CaseFileError(pos, f"values nested more than {MAX_DEPTH} levels deep "
                            "(through aliases)", json_path(path), "flatten this value")
    doc.positions.setdefault(path, pos)
    if isinstance(node, ScalarNode):
        return _scalar(doc, node, path)
    if node.tag not in _STD_TAGS or node.tag == _STR:
        raise doc.error(path, f"YAML tag {quote(node.tag)} is not allowed in case files",
                        "case files may only hold plain data: strings, numbers, lists, maps")
    state.open.add(id(node))
    try:
        return _build_collection(doc, node, path, state)
    finally:
        state.open.discard(id(node))


def _build_collection(doc: Document, node: Node, path: Path, state: _Build) -> Any:
    if isinstance(node, SequenceNode):
        if node.tag != "tag:yaml.org,2002:seq":
            raise doc.error(path, f"a list cannot carry the tag {quote(node.tag)}")
        return [_build(doc, item, (*path, i), state) for i, item in enumerate(node.value)]
    if isinstance(node, MappingNode):
        if node.tag != "tag:yaml.org,2002:map":
            raise doc.error(path, f"a map cannot carry the tag {quote(node.tag)}")
        out: dict[Any, Any] = {}
        first_seen: dict[Any, Pos] = {}
        for knode, vnode in node.value:
            kpos = Pos(doc.file, knode.start_mark.line + 1, knode.start_mark.column + 1)
            if not isinstance(knode, ScalarNode):
                raise CaseFileError(kpos, "mapping keys must be plain scalars", json_path(path))
            _check_text(kpos, knode.value, path)
            # Keys are names or rank numbers: only a plain decimal integer becomes an int.
            key: Any = knode.value
            if knode.tag == "?" and _INT_RE.match(key):
                key = _int(doc, key, (*path, key), 10)
            elif knode.tag == "?" and _LEADING_ZERO_RE.match(key):
                raise CaseFileError(kpos, f"key {quote(key)} has a leading zero",
                                    json_path(path),
                                    f"write the rank as {key.lstrip('0') or '0'}")
            elif knode.tag not in ("?", _STR):
                raise CaseFileError(kpos, f"a key cannot carry the tag {quote(knode.tag)}",
                                    json_path(path))
            if key in first_seen:
                raise CaseFileError(
                    kpos, f"duplicate key {quote(key)} (first defined at line "
                    f"{first_seen[key].line})",
                    json_path(path), "YAML would silently keep only the last one; remove one")
            first_seen[key] = kpos
            doc.key_positions[(*path, key)] = kpos
            out[key] = _build(doc, vnode, (*path, key), state)
        return out
    raise doc.error(path, f"unsupported YAML node {type(node).__name__}")


def _text_pos(file: str, text: str, index: int) -> Pos:
    line = text.count("\n", 0, index) + 1
    return Pos(file, line, index - (text.rfind("\n", 0, index) + 1) + 1)


def load_text(text: str, file: str, limits: Limits | None = None, *,
              reference: bool = False) -> Document:
    """Parse ``text`` (the contents of ``file``) into a :class:`Document`.

    libyaml's parser reads an ASCII text (where PyYAML has libyaml) and the node budget and
    depth limit apply to its events as they are composed: collecting the bundled suite takes
    about 0.5 s less. A text in which the two parsers are known to differ (:data:`_PYYAML_ONLY`),
    and any text libyaml refuses, is read by PyYAML's pure-Python parser, which words every
    error; ``reference`` reads every text that way (the tests compare the two)."""
    max_nodes = (limits or Limits()).nodes
    root: Node | None = None
    parsed = False
    if (not reference and _CEventLoader is not None and text.isascii()
            and not _PYYAML_ONLY.search(text)):
        loader = _CEventLoader(text, file, max_nodes)
        try:
            root = loader.get_single_node()
            # an empty document: PyYAML and libyaml place its null differently
            parsed = not (isinstance(root, ScalarNode) and root.value == "")
        except (yaml.YAMLError, RecursionError):
            pass  # worded by the pure-Python parser below
        finally:
            loader.dispose()
    if not parsed:
        root = _python_compose(text, file, max_nodes)
    doc = Document(file=file, data=None)
    if root is not None:
        doc.data = _build(doc, root, (), _Build(max_nodes))
    return doc


def _python_compose(text: str, file: str, max_nodes: int) -> Node | None:
    try:
        loader = _Loader(text, file, max_nodes)
        try:
            return loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        col = mark.column + 1 if mark else 1
        raise CaseFileError(Pos(file, line, col),
                            f"YAML syntax error: {quote(exc.problem or str(exc))[1:-1]}",
                            hint=quote(str(exc.context or "check indentation and quoting"))[1:-1]
                            ) from None
    except yaml.reader.ReaderError as exc:
        raise CaseFileError(_text_pos(file, text, exc.position),
                            f"character {quote(chr(exc.character))} is not allowed in YAML",
                            hint="remove control characters from the file") from None
    except yaml.YAMLError as exc:
        raise CaseFileError(Pos(file, 1, 1), f"YAML error: {quote(str(exc))}") from None
    except RecursionError:  # a backstop: the depth limit above should make this unreachable
        raise CaseFileError(Pos(file, 1, 1), "values nested too deeply") from None


# libyaml's parser and composer, for documents this program wrote; plain scalars still
# resolve to "?" so that _build reads them as the pure-Python path does.
_CComposer: Any = (type("_CComposer", (_CParser, _Resolver), {}) if _CParser is not None
                   else None)


def load_generated_text(text: str, file: str, limits: Limits | None = None) -> Document:
    """:func:`load_text` for a document this program rendered itself (collective-fuzz's
    generated cases): the same :class:`Document` (values, positions, every scalar and key
    rule of :func:`_build`), composed by libyaml, about ten times faster.

    Never for a file a person or another program wrote: libyaml composes without the node
    budget and depth limit of :class:`_Loader`. Text that is not ASCII, or that libyaml
    cannot compose, goes through :func:`load_text` (which also words any error)."""
    if _CComposer is None or not text.isascii():
        return load_text(text, file, limits)
    try:
        composer = _CComposer(text)
        try:
            root = composer.get_single_node()
        finally:
            composer.dispose()
    except yaml.YAMLError:
        return load_text(text, file, limits)
    doc = Document(file=file, data=None)
    if root is not None:
        doc.data = _build(doc, root, (), _Build((limits or Limits()).nodes))
    return doc


def decode(data: bytes, file: str) -> str:
    """Case files are UTF-8 (a leading byte-order mark is allowed); anything else is an error."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data[:4]:
        raise CaseFileError(Pos(file, 1, 1), "the file is not UTF-8 (it looks like UTF-16 or "
                            "UTF-32)", "save case files as UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise CaseFileError(Pos(file, line, col), f"byte 0x{data[exc.start]:02x} is not valid "
                            "UTF-8", "save case files as UTF-8") from None


def load_file(path: str, display: str | None = None, limits: Limits | None = None
              ) -> Document:
    """Read and parse a case file; ``display`` is the name used in messages.

    The size limit is checked before anything is read, and the node budget while parsing, so
    a huge or hostile file costs little (see :class:`~harness.casefile.limits.Limits`).
    """
    lim = limits or Limits()
    name = display or path
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise CaseFileError(Pos(name, 1, 1), "not a regular file",
                                hint="case files are plain files")
        size = st.st_size
        if size > lim.file_bytes:
            raise CaseFileError(Pos(name, 1, 1), f"the file is {size} bytes; case files may "
                                f"have at most {lim.file_bytes}",
                                hint="split it, or raise the limit: --max-case-file-bytes / ini "
                                "collective_max_case_file_bytes")
        with open(path, "rb") as fh:
            data = fh.read(lim.file_bytes + 1)
    except OSError as exc:
        raise CaseFileError(Pos(name, 1, 1), f"cannot read the file: {exc.strerror}") from None
    if len(data) > lim.file_bytes:  # grew while being read
        raise CaseFileError(Pos(name, 1, 1), f"the file has more than {lim.file_bytes} bytes")
    return load_text(decode(data, name), name, lim)
