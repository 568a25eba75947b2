#!/usr/bin/env python3
"""Validate docs/upstream/behaviours.yaml against the bundled cases and render docs/upstream.md.

Usage: python ci/upstream_table.py [--check]
The logic lives in harness.upstream.cli; this file only makes it runnable from a checkout
whether or not the package is installed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.upstream.cli import main

if __name__ == "__main__":
    sys.exit(main())
