"""The pytest plugin: YAML case files become parametrized tests run on real process groups.

Registered through the ``pytest11`` entry point ``collective_harness`` (this module: pytest
finds the hooks below on it). One module per phase of a pytest session:

- :mod:`~harness.plugin.options`: command-line and ini options, checked into values;
- :mod:`~harness.plugin.state`: the per-process session state (pools, records, what was
  collected);
- :mod:`~harness.plugin.collection`: which files are case files, instances as items,
  selection and pool-grouped ordering;
- :mod:`~harness.plugin.items`: one instance set up, run and judged; its record;
- :mod:`~harness.plugin.session`: start-up, how the session ended, the reports, the gate;
- :mod:`~harness.plugin.terminal`: the terminal summary.

Takes: the options and the case files pytest collects. Gives: one record per collected
instance, the report set, the exit status. Must not: import torch at import or collection
time (only when the first case runs), or let an instance end without a record.
"""

from __future__ import annotations

from .collection import (
    pytest_collect_file,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_deselected,
    pytest_report_collectionfinish,
    pytest_xdist_node_collection_finished,
)
from .items import pytest_report_teststatus, pytest_runtest_logreport, pytest_runtest_makereport
from .options import pytest_addoption
from .session import (
    pytest_configure,
    pytest_internalerror,
    pytest_keyboard_interrupt,
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_unconfigure,
)
from .terminal import pytest_terminal_summary

__all__ = [
    "pytest_addoption", "pytest_collect_file", "pytest_collection_finish",
    "pytest_collection_modifyitems", "pytest_configure", "pytest_deselected",
    "pytest_internalerror", "pytest_keyboard_interrupt", "pytest_report_collectionfinish",
    "pytest_report_teststatus",
    "pytest_runtest_logreport", "pytest_runtest_makereport", "pytest_sessionfinish",
    "pytest_sessionstart", "pytest_terminal_summary", "pytest_unconfigure",
    "pytest_xdist_node_collection_finished",
]
