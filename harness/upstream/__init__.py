"""The upstream-parity table: PyTorch's own collective tests mapped to bundled cases.

Takes: docs/upstream/behaviours.yaml (one row per upstream behaviour, its assertions, and the
case and instance that checks each) and the bundled case library, loaded with the harness's
own collection code. Gives: the validated table and docs/upstream.md, counts included,
through ``ci/upstream_table.py`` (``--check`` in the tests).

Must not: count a row as covered unless every assertion names an instance that exists, or
let the page's figures differ from its rows.
"""
