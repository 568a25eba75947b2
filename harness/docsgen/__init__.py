"""Docs generation: the pages of the docs site that are rendered from code and data.

Takes: the JSON schemas, the op table, the plugin's option definitions and the outcome palette
(``reference``); docs/upstream/behaviours.yaml and the bundled case library, collected with
the harness's own loader (``upstream_table``).
Gives: docs/reference/generated/*.md (``reference.render_all``, written and checked by
``ci/docs/gen_reference.py``) and docs/reference/upstream.md (``upstream_page``, through
``ci/docs/upstream_table.py``); ``--check`` in the tests keeps both current.

Must not: hold a fact of its own beyond headings and one line of context per page; count an
upstream row as covered unless every assertion names an instance that exists, or let a page's
figures differ from its rows; be imported by any stage of the pipeline (nothing runs it at
collection or in a rank).
"""
