"""The package's shape: the pipeline stages import one way, and only each other's public names.

Walks every module of ``harness/`` with :mod:`ast` (nothing is imported) and fails on an import
cycle between modules or between stages, on a private name (``_x``) of one module used by
another, and on a harness import inside a function that is not there to keep torch out of
the pytest process.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "harness"
# The shared vocabulary: records and the helpers they are made of. They import only each other.
BASE = {"harness.model", "harness.errors", "harness.expr", "harness.dtypes"}


@dataclass
class Module:
    name: str
    path: Path
    is_pkg: bool
    top: set[str] = field(default_factory=set)  # harness modules imported at module level
    lazy: set[str] = field(default_factory=set)  # ... inside a function
    torch_top: bool = False  # imports torch at module level
    private: list[str] = field(default_factory=list)  # "line: what" for cross-module _names


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def _modules() -> dict[str, Module]:
    out: dict[str, Module] = {}
    for path in sorted(PKG.rglob("*.py")):
        name, is_pkg = _module_name(path)
        out[name] = Module(name, path, is_pkg)
    return out


def _resolve(mod: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _in_function(tree: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it sits inside a function body."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, inside = stack.pop()
        yield node, inside
        nested = inside or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        stack.extend((child, nested) for child in ast.iter_child_nodes(node))


def _scan(mods: dict[str, Module]) -> None:
    for mod in mods.values():
        tree = ast.parse(mod.path.read_text(), str(mod.path))
        aliases: dict[str, str] = {}  # local name -> harness module it stands for
        for node, inside in _in_function(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "torch" or a.name.startswith("torch."):
                        mod.torch_top |= not inside
                    if a.name.startswith("harness"):
                        targets.append(a.name)
                        if a.asname:
                            aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(mod, node)
                if src == "torch" or src.startswith("torch."):
                    mod.torch_top |= not inside
                if not src.startswith("harness"):
                    continue
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    if sub in mods:  # ``from pkg import module``
                        targets.append(sub)
                        aliases[a.asname or a.name] = sub
                    else:
                        targets.append(src)
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            mod.private.append(f"{node.lineno}: imports {src}.{a.name}")
            for t in targets:
                if t in mods and t != mod.name:
                    (mod.lazy if inside else mod.top).add(t)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                mod.private.append(f"{node.lineno}: uses {aliases[node.value.id]}.{node.attr}")


@pytest.fixture(scope="module")
def mods() -> dict[str, Module]:
    out = _modules()
    _scan(out)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative enough)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _stage(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2])


def test_no_import_cycle_between_modules(mods: dict[str, Module]) -> None:
    # Function-level imports count too: moving an import into a function does not remove
    # the dependency, it only hides it.
    graph = {m.name: {t for t in m.top | m.lazy if not mods[t].is_pkg or t == "harness"}
             for m in mods.values()}
    assert _cycles(graph) == []


def test_no_import_cycle_between_stages(mods: dict[str, Module]) -> None:
    graph: dict[str, set[str]] = {}
    for m in mods.values():
        for t in m.top | m.lazy:
            if _stage(t) != _stage(m.name):
                graph.setdefault(_stage(m.name), set()).add(_stage(t))
    assert _cycles(graph) == []


def test_no_private_name_used_across_modules(mods: dict[str, Module]) -> None:
    bad = [f"{m.path.relative_to(ROOT)}:{p}" for m in mods.values() for p in m.private]
    assert bad == []


def _imports_torch(name: str, mods: dict[str, Module], seen: set[str] | None = None) -> bool:
    seen = seen if seen is not None else set()
    if name in seen:
        return False
    seen.add(name)
    m = mods[name]
    return m.torch_top or any(_imports_torch(t, mods, seen) for t in m.top)


def test_function_level_imports_only_keep_torch_lazy(mods: dict[str, Module]) -> None:
    """A harness import inside a function is allowed only where the module brings torch: the
    pytest process must not import torch at collection, so the rank side is loaded late."""
    bad = [f"{m.name} imports {t} inside a function"
           for m in mods.values() for t in sorted(m.lazy) if not _imports_torch(t, mods)]
    assert bad == []


def test_records_depend_on_nothing_above_them(mods: dict[str, Module]) -> None:
    for name in BASE:
        assert mods[name].top | mods[name].lazy <= BASE, name
        assert not mods[name].torch_top, name


def test_every_package_says_what_it_takes_gives_and_must_not_do(mods: dict[str, Module]) -> None:
    for m in mods.values():
        if m.is_pkg and m.name.count(".") == 1 and m.name != "harness.schemas":
            doc = ast.get_docstring(ast.parse(m.path.read_text())) or ""
            assert len(doc) > 80, f"{m.name} needs a docstring"
            if m.name != "harness.ops":
                assert "Must not" in doc or "must not" in doc, m.name


ARCHITECTURE = ROOT / "docs" / "explanation" / "architecture.md"


def test_every_package_is_described_in_both_maps(mods: dict[str, Module]) -> None:
    """harness/__init__.py and docs/explanation/architecture.md each name every package."""
    init = ast.get_docstring(ast.parse((PKG / "__init__.py").read_text())) or ""
    tree = ARCHITECTURE.read_text("utf-8").split("```")[1]
    packages = sorted(m.name.split(".")[1] for m in mods.values()
                      if m.is_pkg and m.name.count(".") == 1)
    assert "docsgen" in packages
    missing_init = [p for p in packages if f"``{p}/``" not in init]
    missing_page = [p for p in packages if not re.search(rf"^  {p}/ ", tree, re.M)]
    assert missing_init == [], "not described in harness/__init__.py"
    assert missing_page == [], "not in the tree of docs/explanation/architecture.md"


def test_no_stage_imports_the_docs_generators(mods: dict[str, Module]) -> None:
    """docsgen renders pages from the pipeline's code; the pipeline never depends on it."""
    bad = [m.name for m in mods.values() if _stage(m.name) != "harness.docsgen"
           and any(_stage(t) == "harness.docsgen" for t in m.top | m.lazy)]
    assert bad == []


LONG_MODULE = 500  # lines; a module past it says at its top why it stays whole


def test_a_long_module_says_why_it_stays_whole(mods: dict[str, Module]) -> None:
    for m in mods.values():
        lines = m.path.read_text().splitlines()
        if len(lines) <= LONG_MODULE:
            continue
        head = "\n".join(lines[:40])
        why = head.split("Kept whole:", 1)[1].strip() if "Kept whole:" in head else ""
        assert len(why) > 40, (f"{m.name} has {len(lines)} lines: split it by concern, or say "
                               "at its top why it stays whole ('Kept whole: ...')")


def test_the_checker_sees_what_it_must(tmp_path: Path) -> None:
    """The walker itself: a cycle, a private use and a hidden import are all found."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    (tmp_path / "a.py").write_text("from . import b\nfrom .b import _hidden\nb._x()\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n")
    fake = {n: Module(n, tmp_path / f"{n.split('.')[-1]}.py", False)
            for n in ("harness.a", "harness.b")}
    _scan(fake)
    assert fake["harness.a"].top == {"harness.b"}
    assert fake["harness.b"].lazy == {"harness.a"} and not fake["harness.b"].top
    assert [p.split(":")[0] for p in fake["harness.a"].private] == ["2", "3"]
    graph = {m.name: m.top | m.lazy for m in fake.values()}
    assert _cycles(graph) == [["harness.a", "harness.b"]]
    assert not _imports_torch("harness.a", fake)


def _imported_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_only_the_plugin_imports_pytest(mods: dict[str, Module]) -> None:
    """The stages below the plugin take plain settings values (harness.runner.settings), so
    every front end (pytest, the fuzzer, external mode, the benchmarks) can drive them."""
    bad = [m.name for m in mods.values()
           if not m.name.startswith("harness.plugin") and "pytest" in _imported_names(m.path)]
    assert bad == []


def test_a_pool_key_is_built_in_one_place(mods: dict[str, Module]) -> None:
    """Every front end gets an instance's pool from harness.runner.prepare.pool_key: a key
    built elsewhere drifts (it once missed the case's env and device binding)."""
    builders = sorted(
        m.name for m in mods.values()
        for node in ast.walk(ast.parse(m.path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "PoolKey")
    assert set(builders) <= {"harness.runner.prepare", "harness.run.pool"}, builders
    assert "harness.runner.prepare" in builders
