"""Rank tracebacks without the harness's own frames (issue 22, point 8): what is cut, what
stays, and the line that says how much was cut."""

from __future__ import annotations

import os

from harness.errors import HARNESS_DIR, harness_frame, trim_traceback

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _tb(*paths: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for k, path in enumerate(paths):
        lines += [f'  File "{path}", line {10 + k}, in f{k}',
                  f"    call_{k}()", "    ^^^^^^^^"]
    return "\n".join([*lines, "ValueError: Rank 5 is out of range"])


def test_local_harness_frames_are_cut_and_counted() -> None:
    text = _tb(os.path.join(HARNESS_DIR, "program", "interpreter.py"),
               os.path.join(HARNESS_DIR, "program", "groups.py"), TORCH)
    out = trim_traceback(text)
    assert out.splitlines()[:2] == ["Traceback (most recent call last):",
                                    "  (2 harness frame(s) left out)"]
    assert "interpreter.py" not in out and "groups.py" not in out
    assert "call_0" not in out and "call_1" not in out  # their source lines go with them
    assert TORCH in out and "call_2()" in out and out.endswith("out of range")


def test_frames_of_a_harness_installed_elsewhere_are_cut() -> None:
    """External-ranks mode: a rank on another node ran the harness from another path."""
    other = "/home/ci/venv/lib/python3.12/site-packages/harness/"
    text = _tb(other + "program/interpreter.py", other + "run/rank.py", TORCH)
    out = trim_traceback(text)
    assert "(2 harness frame(s) left out)" in out and other not in out and TORCH in out


def test_a_users_own_harness_folder_is_not_the_harness() -> None:
    assert not harness_frame("/home/me/harness/my_backend.py")
    assert not harness_frame("/home/me/harness.py")
    assert harness_frame("/anywhere/harness/program/groups.py")
    text = _tb("/home/me/harness/my_backend.py", TORCH)
    assert trim_traceback(text) == text  # nothing cut, no count line
