"""Overrides: per-backend / per-torch-version patches of a case's expectation.

Built at expansion (:func:`build`: the ``when:`` conditions, the scope's version specifiers
checked), resolved at run time (setup), when the installed torch version (and the NCCL version
it was built with, for ``when: {nccl: ...}``) is known; expansion keeps every override on the
instance so that one case documents how backends and versions differ.

A ``when:`` value may be an expression of the world size and params (``dst: world_size -
1``): it matches an instance whose axis has that value at its world size, whether the case
wrote the number or the same expression (:func:`override_applies`), so that the plugin, the
fuzzer's known behaviour and the certificate match alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from .. import dtypes
from ..errors import ExprError, quote
from ..expr import parse
from ..model import Case, Fill, Instance, Override, Step, Tolerance
from .fields import KEYWORDS, as_list

# Keys whose values are names, never expressions.
SCOPES = ("backend", "device")


def build(case: Case) -> tuple[Override, ...]:
    """The case's overrides as records (every one kept on every instance of the case)."""
    out: list[Override] = []
    for i, o in enumerate(case.raw.get("overrides", [])):
        when = o.get("when", {})
        conds = tuple(sorted((k, tuple(as_list(v))) for k, v in when.items()
                             if k not in ("torch", "nccl", "params", "args")))
        conds += tuple((f"params.{k}", tuple(as_list(v)))
                       for k, v in when.get("params", {}).items())
        conds += tuple((f"args.{k}", tuple(as_list(v)))
                       for k, v in when.get("args", {}).items())
        patch = tuple((k, v) for k, v in o.items() if k not in ("when", "reason", "issue"))
        line = case.doc.pos((*case.origin["overrides"], i)).line
        for key in ("torch", "nccl"):
            if key in when:
                _check_specifier(case, ("overrides", i, "when", key), key, when[key])
        out.append(Override(conds, when.get("torch", ""), patch, o["reason"],
                            o.get("issue", ""), line, nccl=when.get("nccl", "")))
    return tuple(out)


def _check_specifier(case: Case, path: tuple[str | int, ...], key: str, spec: str) -> None:
    # Checked here, not when the override is resolved, so a bad scope fails collection at
    # its line on every machine instead of tracing back on the one whose version it reaches.
    try:
        SpecifierSet(spec, prereleases=True)
    except InvalidSpecifier:
        raise case.error(path, f"when.{key} {quote(spec)} is not a version specifier; "
                         f"write e.g. \">=2.5,<2.8\" (PEP 440)") from None


def override_applies(o: Override, inst: Instance, torch_version: str,
                     nccl_version: str = "", inherits: str = "") -> bool:
    """Whether override ``o`` matches ``inst`` on this torch (and NCCL) version
    (``inherits``: the backend the instance's backend wraps, whose overrides apply too)."""
    return not _mismatch(o, inst, torch_version, nccl_version, inherits)


def inherited(o: Override, inst: Instance, inherits: str) -> bool:
    """Whether ``o`` is scoped to the wrapped backend ``inherits`` and not to the instance's
    own: a known behaviour of what the backend wraps, reported apart from its own."""
    scope = dict(o.when).get("backend")
    return bool(inherits) and scope is not None and inst.backend not in scope \
        and inherits in scope


def _value_at(value: Any, env: dict[str, Any]) -> Any:
    """A ``when:`` value or an axis value at the instance: an expression of the world size
    and params (``dst: world_size - 1``) evaluated there, anything else as written (a name
    such as ``gloo`` or ``stack`` is not an expression over those names)."""
    if not isinstance(value, str):
        return value
    try:
        return parse(value, tuple(env))(env)
    except (ExprError, ValueError, TypeError, ArithmeticError):
        return value


def _matches(have: Any, allowed: tuple[Any, ...], env: dict[str, Any]) -> bool:
    """Whether an instance's axis value is one of a ``when:`` key's values, as written or by
    value at the instance (a case's ``world_size - 1`` and an override's ``2`` at world size
    3, or the other way round)."""
    if have in allowed or (isinstance(have, list) and tuple(have) in allowed):
        return True
    value = _value_at(have, env)
    if not _number(value):
        return False
    return any(_number(v) and v == value for v in (_value_at(a, env) for a in allowed))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


ROOT_NAMES = ("src", "dst")  # what a raises: rank expression may name besides params


def rank_env(world_size: int, params: dict[str, Any], steps: tuple[Step, ...]
             ) -> dict[str, Any]:
    """What a ``raises: {ranks: [...]}`` expression is evaluated over: the world size, the
    params and, in the ``op:`` form, its root (``src`` or ``dst``, as global ranks)."""
    roots = {k: v for k, v in (steps[0].args if len(steps) == 1 else ())
             if k in ROOT_NAMES and type(v) is int}
    return {"world_size": world_size, **params, **roots}


def raise_ranks(given: Any, env: dict[str, Any]) -> tuple[int, ...] | None:
    """The ranks a ``raises:`` names (None: every rank): numbers as written, expressions
    (``[dst]``, ``["world_size - 1"]``) evaluated; ExprError where one cannot be."""
    if not given:
        return None
    out: list[int] = []
    for r in given:
        value = parse(r, tuple(env))(env) if isinstance(r, str) else r
        if type(value) is not int:
            raise ExprError(f"{quote(r, 60)} is not a rank here ({quote(value, 60)})")
        out.append(value)
    return tuple(out)


def _mismatch(o: Override, inst: Instance, torch_version: str, nccl_version: str,
              inherits: str = "") -> set[str]:
    """What keeps ``o`` from applying: ``axes`` (the instance is not what it is about),
    ``backend``, ``torch`` and/or ``nccl`` (its scope); empty when it applies. An ``nccl``
    scope never applies where torch has no NCCL (``nccl_version`` empty)."""
    axes = dict(inst.axes)
    axes["backend"] = inst.backend
    axes["device"] = inst.device
    env = {"world_size": inst.world_size, **{k: v for k, v in inst.params
                                             if not isinstance(v, tuple)}}
    out: set[str] = set()
    for key, allowed in o.when:
        have = axes.get(key)
        if key == "backend" and have not in allowed and inherits in allowed:
            continue  # the wrapped backend's scope reaches the wrapper (manifest inherits:)
        if key == "dtype":
            allowed = tuple(dtypes.canonical(a) or a for a in allowed)
        if key in SCOPES or key == "dtype":
            if have not in allowed:
                out.add("backend" if key == "backend" else "axes")
        elif not _matches(have, allowed, env):
            out.add("axes")
    if o.torch:
        base = Version(torch_version.split("+")[0])
        if base not in SpecifierSet(o.torch, prereleases=True):
            out.add("torch")
    if o.nccl and (not nccl_version or Version(nccl_version)
                   not in SpecifierSet(o.nccl, prereleases=True)):
        out.add("nccl")
    return out


def not_applied(inst: Instance, torch_version: str, nccl_version: str = "",
                inherits: str = "") -> list[dict[str, Any]]:
    """Overrides that match ``inst`` in everything but their torch-version or backend scope.

    They are why a known divergence can show up as an unexplained failure on another torch or
    backend, so the report lists them (line, scope, the scope's condition, reason)."""
    out: list[dict[str, Any]] = []
    for o in inst.overrides:
        miss = _mismatch(o, inst, torch_version, nccl_version, inherits)
        if not miss or "axes" in miss:
            continue
        when = dict(o.when)
        scope = next(s for s in ("backend", "torch", "nccl") if s in miss)
        cond = {"backend": f"backend {', '.join(map(str, when.get('backend', ())))}",
                "torch": f"torch {o.torch}", "nccl": f"NCCL {o.nccl}"}[scope]
        out.append({"line": o.line, "scope": scope, "when": cond, "reason": o.reason})
    return out


def resolve(inst: Instance, torch_version: str, nccl_version: str = "",
            inherits: str = "") -> Instance:
    """Apply the instance's matching overrides (later ones win) to its expectation.

    An override's ``ordering: [check, ...]`` is recorded on the ordering plan as a known
    divergence (reported, not failed); the other keys patch the expectation. ``inherits``:
    the backend the instance's backend wraps (a manifest's ``inherits:``); its overrides apply
    and their lines are kept apart as inherited.
    """
    exp, tol, expected = inst.expectation, inst.tolerance, inst.expected
    known: dict[str, str] = {}
    applied: list[tuple[int, str, tuple[str, ...]]] = []
    from_wrapped: list[int] = []
    shared: list[int] = []
    diverges = ""
    for o in inst.overrides:
        if not override_applies(o, inst, torch_version, nccl_version, inherits):
            continue
        if inherited(o, inst, inherits):
            from_wrapped.append(o.line)
        if "backend" not in dict(o.when):
            shared.append(o.line)
        patch = dict(o.patch)
        reason = o.reason + (f" ({o.issue})" if o.issue else "")
        applied.append((o.line, reason, tuple(sorted(patch))))
        if "expected" in patch or "tolerance" in patch:
            # What the backend computes instead of the contract: passing against it is a
            # declared divergence, counted apart from conformant.
            diverges = reason
        if patch.get("ordering"):
            known.update(dict.fromkeys(patch["ordering"], reason))
        if patch.get("skip"):
            exp = replace(exp, skip=reason)
        if patch.get("xfail"):
            exp = replace(exp, xfail=reason)
        if "raises" in patch:
            r = patch["raises"]
            exp = replace(exp, kind="raises", match=r if isinstance(r, str) else r["match"],
                          ranks=None if isinstance(r, str) else _ranks_at(inst, r.get("ranks")),
                          others=("finished", "raised") if isinstance(r, str) else
                          tuple(r.get("others", ("finished", "raised"))), reason=reason)
        if patch.get("hangs"):
            exp = replace(exp, kind="hangs", reason=reason)
        if patch.get("crashes"):
            exp = replace(exp, kind="crashes", reason=reason)
        if "tolerance" in patch:
            tol = Tolerance.parse(patch["tolerance"])
        if "expected" in patch:
            expected = _patch_expected(inst, expected, patch["expected"])
    if applied:
        exp = replace(exp, applied=tuple(applied), diverges=diverges or exp.diverges,
                      inherited=tuple(from_wrapped), every_backend=tuple(shared))
    plan = inst.ordering
    if plan is not None:
        plan = replace(plan, known=tuple(sorted(known.items())))
    return replace(inst, expectation=exp, tolerance=tol, expected=expected, ordering=plan)


def _ranks_at(inst: Instance, given: Any) -> tuple[int, ...] | None:
    """An override's ``raises`` ranks at ``inst``; one that cannot be evaluated there is a
    rank no world has (-1), so the verdict says the expectation could not be met."""
    env = rank_env(inst.world_size, dict(inst.params), inst.steps)
    try:
        return raise_ranks(given, env)
    except ExprError:
        return tuple(r if isinstance(r, int) else -1 for r in given)


def _patch_expected(inst: Instance, expected: tuple[tuple[str, Fill], ...], raw: Any
                    ) -> tuple[tuple[str, Fill], ...]:
    """The expectation with an override's ``expected:`` applied.

    The shorthand form's patch is the output buffer's fill; a program's maps tensor names to
    fills (like its own ``expected:``), and replaces the named tensors' expectations only.
    """
    names = ("rank", "world_size", "i", "j", "k", *dict(inst.params))
    if inst.shorthand:
        out_name = inst.shorthand[1]
        return tuple((n, _override_fill(raw, names) if n == out_name else f)
                     for n, f in expected)
    fills = {str(n): _override_fill(v, names) for n, v in raw.items()}
    patched = tuple((n, fills.pop(n, f)) for n, f in expected)
    return patched + tuple(fills.items())  # tensors the case left without an expectation


def _override_fill(raw: Any, names: tuple[str, ...]) -> Fill:
    if isinstance(raw, str) and raw in KEYWORDS:
        return Fill(raw)  # type: ignore[arg-type]
    if isinstance(raw, dict) and "generator" in raw:
        params = {k: v for k, v in raw.items() if k != "generator"}
        return Fill("generator", (raw["generator"], tuple(sorted(params.items()))))
    if isinstance(raw, dict):
        return Fill("per_rank", {k: _override_fill(v, names) for k, v in raw.items()})
    if isinstance(raw, str):
        return Fill("expr", parse(raw, names))
    return Fill("list", raw)
