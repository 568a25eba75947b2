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
