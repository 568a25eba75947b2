"""A whitelisting evaluator for the small expressions case files may contain.

Case files can come from untrusted pull requests and run on expensive GPU runners, so nothing in
them reaches ``eval``. An expression is parsed with :mod:`ast`, checked against a whitelist
(arithmetic, comparisons, ``x if c else y``, a few pure functions, names the caller provides,
and indexing a table the case declares: ``routes[rank][j]``) at load time, and evaluated by
walking the tree. The same tree evaluates over Python
ints (for op arguments such as ``dst: (rank + 1) % world_size``) and over torch tensors (for
element values over the flat index ``i``), because it only uses operators both support.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ExprError, quote

MAX_LENGTH = 400
MAX_NODES = 200
MAX_POW_EXPONENT = 128
MAX_INT_BITS = 128
PARSED_KEPT = 4096  # parsed expressions kept (see parse): bounded, whatever a file holds

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_CMP: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape")


def _where(cond: Any, a: Any, b: Any) -> Any:
    if _is_tensor(cond) or _is_tensor(a) or _is_tensor(b):
        import torch

        def as_t(v: Any) -> Any:
            return v if _is_tensor(v) else torch.tensor(v)

        return torch.where(as_t(cond).bool(), as_t(a), as_t(b))
    return a if cond else b


def _min(a: Any, b: Any) -> Any:
    if _is_tensor(a) or _is_tensor(b):
        import torch

        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))
    return min(a, b)


def _max(a: Any, b: Any) -> Any:
    if _is_tensor(a) or _is_tensor(b):
        import torch

        return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))
    return max(a, b)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "where": _where,
    "min": _min,
    "max": _max,
    "abs": abs,
}
ARITY = {"where": 3, "min": 2, "max": 2, "abs": 1}

_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.BoolOp, ast.Name,
    ast.Constant, ast.Call, ast.Load, ast.And, ast.Or, ast.Not, ast.Subscript,
    *_BINOPS, *_UNARY, *_CMP,
)


@dataclass(frozen=True)
class Expr:
    """A parsed, whitelisted expression; ``names`` are the free variables it uses."""

    source: str
    tree: ast.Expression
    names: frozenset[str]

    def __call__(self, env: Mapping[str, Any]) -> Any:
        return _eval(self.tree.body, env)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rank processes receive the source and re-parse it: ASTs pickle, but this keeps the
        # wire format small and re-checks the whitelist on the receiving side.
        return (parse, (self.source, sorted(self.names)))


def parse(source: str, allowed_names: Iterable[str]) -> Expr:
    """Parse ``source`` and check it only uses whitelisted syntax and ``allowed_names``.

    Answers are kept (an :class:`Expr` is immutable): a case file repeats the same few
    expressions in every instance of its matrix, and parsing them again was a tenth of the
    bundled suite's collection. Errors are not kept: each raises anew."""
    return _parse(source, frozenset(allowed_names))


@functools.lru_cache(maxsize=PARSED_KEPT)
def _parse(source: str, allowed: frozenset[str]) -> Expr:
    if len(source) > MAX_LENGTH:
        raise ExprError(f"expression is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"not a valid expression: {exc.msg}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExprError(f"expression has more than {MAX_NODES} parts")
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    used: set[str] = set()
    for node in nodes:
        if not isinstance(node, _ALLOWED_NODES):
            raise ExprError(f"{type(node).__name__} is not allowed in expressions "
                            "(only arithmetic, comparisons, 'x if c else y' and "
                            f"{', '.join(sorted(FUNCTIONS))})")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
            raise ExprError(f"constant {node.value!r} is not a number")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise ExprError("only these functions may be called: "
                                + ", ".join(sorted(FUNCTIONS)))
            if node.keywords:
                raise ExprError("keyword arguments are not allowed in expressions")
            want = ARITY[node.func.id]
            if len(node.args) != want or any(isinstance(a, ast.Starred) for a in node.args):
                raise ExprError(f"{node.func.id}() takes {want} argument"
                                f"{'s' if want > 1 else ''}, got {len(node.args)}")
        if isinstance(node, ast.Name) and id(node) not in callees:
            if node.id not in allowed:
                raise ExprError(f"unknown name {node.id!r}; available here: "
                                + ", ".join(sorted(allowed)))
            used.add(node.id)
    for node in nodes:  # every part is allowed: now how a subscript uses them
        if isinstance(node, ast.Subscript):
            root = node.value
            while isinstance(root, ast.Subscript):
                root = root.value
            if not isinstance(root, ast.Name) or isinstance(node.slice, ast.Slice | ast.Tuple):
                raise ExprError("only a table may be indexed, one index at a time: "
                                "name[index] or name[index][index]")
    return Expr(source, tree, frozenset(used))


def _check_int(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ExprError(f"integer result exceeds {MAX_INT_BITS} bits")
    if isinstance(value, complex):
        raise ExprError("the result is not a real number")
    return value


def _number(name: str, value: Any) -> Any:
    """Expressions are numeric only: a string param would turn ``*`` into repetition."""
    if _is_tensor(value) or (isinstance(value, int | float) and not isinstance(value, complex)):
        return value
    raise ExprError(f"{name!r} is {type(value).__name__} {quote(value, 60)}; expressions "
                    "work on numbers only")


def _bounded_operands(op: ast.operator, left: Any, right: Any) -> None:
    if _is_tensor(right):
        return
    if isinstance(op, ast.Pow) and abs(right) > MAX_POW_EXPONENT:
        raise ExprError(f"exponent {quote(right, 60)} is larger than {MAX_POW_EXPONENT}")
    if isinstance(op, ast.LShift | ast.RShift):
        if not isinstance(right, int) or not 0 <= right <= MAX_INT_BITS:
            raise ExprError(f"shift {quote(right, 60)} must be a whole number from 0 to "
                            f"{MAX_INT_BITS}")
        if not _is_tensor(left) and not isinstance(left, int):
            raise ExprError("shifts take whole numbers")


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    try:
        return _eval_node(node, env)
    except ExprError:
        raise
    except ZeroDivisionError:
        raise ExprError("division by zero") from None
    except OverflowError:
        raise ExprError("the result is too large") from None
    except KeyError as exc:
        raise ExprError(f"name {quote(exc.args[0], 60)} has no value here") from None
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise ExprError(f"cannot evaluate: {quote(str(exc))[1:-1]}") from None


def _table_name(node: ast.Subscript) -> str:
    root: ast.AST = node
    while isinstance(root, ast.Subscript):
        root = root.value
    assert isinstance(root, ast.Name)  # parse() allows nothing else
    return root.id


def _index(node: ast.AST, env: Mapping[str, Any]) -> Any:
    """A table (a tuple of numbers or of tables) or one of its rows or numbers."""
    if isinstance(node, ast.Name):
        table = env[node.id]
        if not isinstance(table, tuple):
            raise ExprError(f"{node.id!r} is not a table (declare it under tables:)")
        return table
    assert isinstance(node, ast.Subscript)
    rows = _index(node.value, env)
    name = _table_name(node)
    if not isinstance(rows, tuple):
        raise ExprError(f"{name!r} has fewer dimensions than indices given")
    at = _eval_node(node.slice, env)
    if _is_tensor(at):  # a per-element index (i, j): gather from a row of numbers
        import torch

        if at.is_floating_point() or at.is_complex() or any(
                isinstance(v, tuple) for v in rows):
            raise ExprError(f"{name!r}: a per-element index needs whole numbers and a row "
                            "of numbers")
        if at.numel() and (int(at.min()) < 0 or int(at.max()) >= len(rows)):
            raise ExprError(f"index out of range 0..{len(rows) - 1} of {name!r}")
        return torch.as_tensor(rows)[at.long()]
    if isinstance(at, bool) or not isinstance(at, int):
        raise ExprError(f"{name!r} is indexed by {quote(at, 60)}; indices are whole numbers")
    if not 0 <= at < len(rows):
        raise ExprError(f"index {at} is out of range 0..{len(rows) - 1} of {name!r}")
    return rows[at]


def _eval_node(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Subscript):
        value = _index(node, env)
        if isinstance(value, tuple):
            raise ExprError(f"{_table_name(node)!r} has more dimensions than indices given "
                            "(a row is not a number)")
        return _number(_table_name(node), value)
    if isinstance(node, ast.Name):
        value = env[node.id]
        if isinstance(value, tuple):
            raise ExprError(f"{node.id!r} is a table: index it, e.g. {node.id}[rank]")
        return _number(node.id, value)
    if isinstance(node, ast.BinOp):
        left, right = _eval_node(node.left, env), _eval_node(node.right, env)
        _bounded_operands(node.op, left, right)
        return _check_int(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp):
        operand = _eval_node(node.operand, env)
        if isinstance(node.op, ast.Not):
            return ~operand.bool() if _is_tensor(operand) else not operand
        return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.Compare):
        result: Any = None
        left = _eval_node(node.left, env)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval_node(comp, env)
            part = _CMP[type(op)](left, right)
            result = part if result is None else result & part
            left = right
        return result
    if isinstance(node, ast.BoolOp):
        values = [_eval_node(v, env) for v in node.values]
        if any(_is_tensor(v) for v in values):
            out = values[0]
            for v in values[1:]:
                out = (out & v) if isinstance(node.op, ast.And) else (out | v)
            return out
        if isinstance(node.op, ast.And):
            return all(values)
        return any(values)
    if isinstance(node, ast.IfExp):
        return _where(_eval_node(node.test, env), _eval_node(node.body, env),
                      _eval_node(node.orelse, env))
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        return FUNCTIONS[node.func.id](*(_eval_node(a, env) for a in node.args))
    raise ExprError(f"{type(node).__name__} is not allowed")  # unreachable after parse()
