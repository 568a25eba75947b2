"""Load a YAML case file safely, keeping the line and column of every value.

PyYAML's defaults are hostile to a declarative format: ``yes``/``no``/``on``/``off`` become
booleans, ``1e-5`` becomes a string, ``010`` becomes 8, duplicate keys silently overwrite the
first, and aliases can expand into a billion nodes. This loader composes the node tree with a
YAML-1.2-like resolver and builds plain Python values itself, so each of those is either read
the way a person meant it (``1e-5`` is a float) or rejected with a message naming the place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import CaseFileError, Pos, json_path

Path = tuple[str | int, ...]

MAX_NODES = 200_000  # guards against alias ("billion laughs") expansion in untrusted files

_INT_RE = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_HEX_RE = re.compile(r"^0x[0-9a-fA-F_]+$")
_FLOAT_RE = re.compile(
    r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
)
_LEADING_ZERO_RE = re.compile(r"^[-+]?0[0-9_]+$")
_YAML11_BOOLS = {"yes", "no", "on", "off"}

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


class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,
              yaml.composer.Composer, _Resolver):
    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Resolver.__init__(self)


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


def _scalar(doc: Document, node: ScalarNode, path: Path) -> Any:
    value: str = node.value
    if node.tag != _STR and node.tag not in _STD_TAGS and node.tag != "?":
        raise doc.error(path, f"YAML tag {node.tag!r} is not allowed in case files",
                        "case files may only hold plain data: strings, numbers, lists, maps")
    if node.tag == _STR:  # quoted or explicitly tagged: always a string
        return value
    if node.tag == "tag:yaml.org,2002:int":
        return int(value.replace("_", ""), 0)
    if node.tag == "tag:yaml.org,2002:float":
        return float(value.lower().replace(".inf", "inf").replace(".nan", "nan"))
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
    if _INT_RE.match(value):
        return int(value.replace("_", ""))
    if _HEX_RE.match(value):
        return int(value.replace("_", ""), 16)
    if _LEADING_ZERO_RE.match(value):
        raise doc.error(path, f"ambiguous number {value!r}: a leading zero reads as octal "
                        "in YAML 1.1",
                        f"write {value.lstrip('0') or '0'} for the decimal number, or quote it")
    if _FLOAT_RE.match(value):
        text = value.replace("_", "").lower()
        return float(text.replace(".inf", "inf").replace(".nan", "nan"))
    return value


def _build(doc: Document, node: Node, path: Path, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise doc.error(path, f"document expands to more than {MAX_NODES} values",
                        "aliases (*name) may not be used to blow up a case file")
    doc.positions.setdefault(path, Pos(doc.file, node.start_mark.line + 1,
                                       node.start_mark.column + 1))
    if isinstance(node, ScalarNode):
        return _scalar(doc, node, path)
    if node.tag not in _STD_TAGS:
        raise doc.error(path, f"YAML tag {node.tag!r} is not allowed in case files",
                        "case files may only hold plain data: strings, numbers, lists, maps")
    if isinstance(node, SequenceNode):
        return [_build(doc, item, (*path, i), budget) for i, item in enumerate(node.value)]
    if isinstance(node, MappingNode):
        out: dict[Any, Any] = {}
        first_seen: dict[Any, Pos] = {}
        for knode, vnode in node.value:
            kpos = Pos(doc.file, knode.start_mark.line + 1, knode.start_mark.column + 1)
            if not isinstance(knode, ScalarNode):
                raise CaseFileError(kpos, "mapping keys must be plain scalars", json_path(path))
            # Keys are names or rank numbers: only a plain decimal integer becomes an int.
            key: Any = knode.value
            if knode.tag == "?" and _INT_RE.match(key):
                key = int(key)
            if key in first_seen:
                raise CaseFileError(
                    kpos, f"duplicate key {key!r} (first defined at line {first_seen[key].line})",
                    json_path(path), "YAML would silently keep only the last one; remove one")
            first_seen[key] = kpos
            doc.key_positions[(*path, key)] = kpos
            out[key] = _build(doc, vnode, (*path, key), budget)
        return out
    raise doc.error(path, f"unsupported YAML node {type(node).__name__}")


def load_text(text: str, file: str) -> Document:
    """Parse ``text`` (the contents of ``file``) into a :class:`Document`."""
    doc = Document(file=file, data=None)
    try:
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        col = mark.column + 1 if mark else 1
        raise CaseFileError(Pos(file, line, col), f"YAML syntax error: {exc.problem or exc}",
                            hint=str(exc.context or "check indentation and quoting")) from None
    except yaml.YAMLError as exc:
        raise CaseFileError(Pos(file, 1, 1), f"YAML error: {exc}") from None
    if root is None:
        doc.data = None
        return doc
    doc.data = _build(doc, root, (), [MAX_NODES])
    return doc


def load_file(path: str, display: str | None = None) -> Document:
    """Read and parse a case file; ``display`` is the name used in messages."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return load_text(text, display or path)
