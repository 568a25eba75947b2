#!/usr/bin/env python3
"""Append the gate's verdict and the conformance matrix to $GITHUB_STEP_SUMMARY (1 MiB cap).

Usage (from the workflows): python ci/step_summary.py --gate reports/gate.md \
    --matrix reports/conformance.md [--out PATH]
The logic lives in harness.report.step_summary; this file only makes it runnable from a
checkout whether or not the package is installed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.report.step_summary import main

if __name__ == "__main__":
    sys.exit(main())
