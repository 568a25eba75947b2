"""Write the generated reference pages of the docs site from the code (issue 27).

    python ci/docs/gen_reference.py           # (re)write docs/reference/generated/*.md
    python ci/docs/gen_reference.py --check   # exit 1 naming each page that is not current

The pages are never edited by hand: the case format and the report format come from the JSON
schemas in harness/schemas/, the op table from harness/ops, the options from the plugin's own
option definitions, the outcomes from the report's palette. tests/test_docs.py runs --check.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.docsgen.reference import PAGES, render_all  # noqa: E402

OUT = ROOT / "docs" / "reference" / "generated"


def main(argv: list[str]) -> int:
    """Write the pages, or with ``--check`` compare them; 1 when one is stale."""
    pages = render_all()
    stale = [name for name in PAGES
             if not (OUT / name).is_file() or (OUT / name).read_text("utf-8") != pages[name]]
    if "--check" in argv:
        for name in stale:
            print(f"gen_reference: docs/reference/generated/{name} is not current; "
                  "run python ci/docs/gen_reference.py", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        (OUT / name).write_text(text, "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
