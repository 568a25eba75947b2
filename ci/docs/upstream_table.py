#!/usr/bin/env python3
"""Validate docs/upstream/behaviours.yaml against the bundled cases and render
docs/reference/upstream.md.

Usage: python ci/docs/upstream_table.py [--check]
The logic lives in harness.docsgen.upstream_page; this file only makes it runnable from a
checkout whether or not the package is installed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from harness.docsgen.upstream_page import main

if __name__ == "__main__":
    sys.exit(main())
