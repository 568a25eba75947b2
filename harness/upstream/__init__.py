"""The upstream-parity table: PyTorch's own collective tests mapped to bundled cases, kept as
data (docs/upstream/behaviours.yaml) and rendered to docs/upstream.md by ci/upstream_table.py."""
