"""``python -m harness.guard``: the same as ``collective-guard``."""

import sys

from harness.guard.cli import main

sys.exit(main())
