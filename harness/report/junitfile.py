"""A session-level verdict in pytest's JUnit XML, where CI test views look.

pytest writes ``--junitxml`` itself, one test case per item. A session in which no instance
ran reads there as all skipped, or as no tests at all: green in most CI views. The harness adds
one test case in error (``collective-harness.session``) whose message is the report's
headline, as the INCOMPLETE file written at the start of a session does.
"""

from __future__ import annotations

import contextlib
import xml.etree.ElementTree as ET

from .records import write_atomic


def add_session_error(path: str, message: str) -> bool:
    """Add a ``session`` test case in error saying ``message`` to the first test suite of the
    JUnit file at ``path``, and count it in the suite's ``tests`` and ``errors``. False (the
    file left as it is) when it cannot be read as JUnit XML or cannot be rewritten."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return False
    root = tree.getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return False
    case = ET.SubElement(suite, "testcase", {"classname": "collective-harness",
                                              "name": "session", "time": "0"})
    ET.SubElement(case, "error", {"message": message})
    for attr in ("tests", "errors"):
        with contextlib.suppress(ValueError):
            suite.set(attr, str(int(suite.get(attr, "0")) + 1))
    try:
        write_atomic(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    except OSError:
        return False
    return True
