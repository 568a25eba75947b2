"""Case-derived text made inert for Markdown (the report and ``$GITHUB_STEP_SUMMARY``).

Reasons, messages, ids and names come from case files, which may be hostile: written raw, a
reason could close a ``<details>`` block or forge a ``# ✅ Gate: PASS`` heading in a CI job
summary. Everything taken from a case goes through :func:`escape` or :func:`code`.
"""

from __future__ import annotations

import re
from typing import Any

TEXT_LIMIT = 500
# Characters that start Markdown (or HTML) constructs inside a line; escaped with a backslash.
_SPECIAL = re.compile(r"([\\`*\[\]|~#!])")  # not "_": op names read all_reduce


def escape(value: Any, limit: int = TEXT_LIMIT) -> str:
    """Case-derived text as inert Markdown on one line: no HTML (``</details>``), no heading,
    no table cell break, no emphasis or link, at most ``limit`` characters."""
    text = " ".join(str(value).split())  # newlines would start a heading or a new block
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", text)


def code(value: Any, limit: int = 300) -> str:
    """Case-derived text as an inline code span (the content is shown literally)."""
    text = " ".join(str(value).split()).replace("`", "'")
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    return f"`{text}`"
