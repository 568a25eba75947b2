"""The safe YAML loader: values read as a person means them, ambiguities rejected with a place."""

from __future__ import annotations

import math

import pytest

from harness.casefile.load import load_text
from harness.errors import CaseFileError


def test_numbers_and_strings_as_written() -> None:
    doc = load_text("a: 1e-5\nb: [1, -2, 0x10, 1.5, .inf, .nan]\nc: 'yes'\nd: null\ne: true\n",
                    "f.yaml")
    assert doc.data["a"] == pytest.approx(1e-5) and isinstance(doc.data["a"], float)
    b = doc.data["b"]
    assert b[:4] == [1, -2, 16, 1.5] and math.isinf(b[4]) and math.isnan(b[5])
    assert doc.data["c"] == "yes" and doc.data["d"] is None and doc.data["e"] is True


def test_rank_keys_are_ints_and_positions_are_kept() -> None:
    doc = load_text("input:\n  0: [1, 2]\n  others: [3, 4]\n", "f.yaml")
    assert set(doc.data["input"]) == {0, "others"}
    pos = doc.pos(("input", 0))
    assert (pos.line, pos.col) == (2, 6)
    assert str(doc.pos(("input", "others", 1))) == "f.yaml:3:15"


@pytest.mark.parametrize(("text", "fragment", "line"), [
    ("a: yes\n", "ambiguous value 'yes'", 1),
    ("x: 1\ny: off\n", "ambiguous value 'off'", 2),
    ("a: 1\na: 2\n", "duplicate key 'a' (first defined at line 1)", 2),
    ("a: 010\n", "leading zero", 1),
    ("a: !!python/object/apply:os.system [ls]\n", "not allowed in case files", 1),
    ("a: [1,\n", "YAML syntax error", 2),
])
def test_rejections_name_the_place(text: str, fragment: str, line: int) -> None:
    with pytest.raises(CaseFileError) as exc:
        load_text(text, "f.yaml")
    assert fragment in str(exc.value)
    assert exc.value.pos.line == line
    assert str(exc.value).startswith(f"f.yaml:{line}:")


def test_alias_bombs_are_bounded() -> None:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 8):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    with pytest.raises(CaseFileError, match="expands to more than"):
        load_text("\n".join(lines) + "\n", "bomb.yaml")


def _yaml_texts() -> list[tuple[str, str]]:
    from tests.runs import REPO
    files = sorted([*REPO.glob("cases/*.yaml"), *REPO.glob("examples/**/*.yaml"),
                    *REPO.glob("tests/data/**/*.yaml")])
    return [(str(f.relative_to(REPO)), f.read_text(encoding="utf-8", errors="replace"))
            for f in files]


def _read(text: str, reference: bool) -> object:
    try:
        doc = load_text(text, "f.yaml", reference=reference)
    except CaseFileError as exc:
        return ("error", str(exc))
    return (repr(doc.data), doc.positions, doc.key_positions)


def test_libyaml_and_pyyaml_read_every_committed_file_alike() -> None:
    """Collection reads most case files with libyaml's parser; every YAML file in the
    repository (the bundled suite, examples, the tests' hostile files) gives the same values,
    positions and errors as PyYAML's pure-Python parser, the reference."""
    texts = _yaml_texts()
    assert len(texts) > 100
    for name, text in texts:
        assert _read(text, False) == _read(text, True), name


@pytest.mark.parametrize("text", [
    "cases: [a ?b]\n",                        # libyaml reads "a ?b" as one scalar
    "cases:\n  - {name:\tx}\n",               # libyaml takes a tab as a separator
    "cases: [{name: , shape: [4]}]\n",        # an empty value placed one column further
    "--- \n",                                 # an empty document's null placed elsewhere
    "a: |# x\n  y\n",                          # a block scalar header and a comment
    # libyaml meets the depth limit before a control character beyond its first buffer
    "a: " + "[" * 70 + "]" * 70 + "\n" + "# padding\n" * 2000 + "b: \x07\n",
])
def test_texts_the_parsers_read_differently_are_read_by_pyyaml(text: str) -> None:
    assert _read(text, False) == _read(text, True)


def test_the_node_budget_and_depth_limit_hold_on_the_libyaml_path() -> None:
    deep = "a: " + "[" * 100 + "]" * 100 + "\n"
    assert deep.isascii()
    with pytest.raises(CaseFileError, match="nested more than 64 levels"):
        load_text(deep, "f.yaml")
    wide = "a: [" + ", ".join(["1"] * 300) + "]\n"
    from harness.casefile.limits import Limits
    with pytest.raises(CaseFileError, match="more than 200 YAML values"):
        load_text(wide, "f.yaml", Limits(nodes=200))


def test_an_ascii_case_file_is_read_by_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed this buys is real only if the libyaml path is taken: with PyYAML's parser
    made to fail, a plain case file still loads (and one with a tab does not)."""
    from harness.casefile import load

    def refuse(*_a: object) -> None:
        raise AssertionError("read by PyYAML's parser")
    monkeypatch.setattr(load, "_python_compose", refuse)
    assert load_text("cases:\n  - {name: x, shape: [4]}\n", "f.yaml").data == {
        "cases": [{"name": "x", "shape": [4]}]}
    with pytest.raises(AssertionError, match="PyYAML"):
        load_text("cases:\n  - {name:\tx}\n", "f.yaml")


def test_mutated_case_files_are_read_alike() -> None:
    """Broken files too: characters inserted, deleted and replaced at random (seeded) in the
    bundled case files give the same values, positions and errors on both paths (how the
    differences gated above were found: 20,000 mutations, none left)."""
    import random
    texts = [t for _, t in _yaml_texts() if len(t) < 20_000]
    rng = random.Random(20261127)
    alphabet = [*":-[]{},&*!|>'\"#%@`\t \n\x07?0aZ\\", "\u00e9", "- ", ": ", "\n  ", "&a x", "*a",
                "--- \n"]
    for _ in range(400):
        chars = list(rng.choice(texts))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(chars) + 1)
            if rng.random() < 0.6:
                chars[at:at] = list(rng.choice(alphabet))
            elif chars:
                del chars[min(at, len(chars) - 1)]
        text = "".join(chars)
        assert _read(text, False) == _read(text, True), text[:200]
