"""Shared fixtures for the harness's own tests."""

from __future__ import annotations

# Case files used as test inputs are data, not part of this test run.
collect_ignore_glob = ["data/*"]
