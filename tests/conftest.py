"""Shared setup for the harness's own tests."""

from __future__ import annotations

# pytester's in-process runs restore sys.modules afterwards; a module first imported inside a
# run is dropped and imported again by the next one, which crashes for torch's C extension.
# Load everything a run imports lazily before any run starts.
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.heap
import multiprocessing.popen_forkserver
import multiprocessing.resource_sharer
import multiprocessing.resource_tracker
import multiprocessing.sharedctypes  # noqa: F401

import torch
import torch.distributed  # noqa: F401

import harness.capabilities
import harness.expand
import harness.pool
import harness.report.markdown
import harness.report.records
import harness.verdict  # noqa: F401

# Case files used as test inputs are data, not part of this test run.
collect_ignore_glob = ["data/*"]
