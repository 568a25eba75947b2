"""Report writers: JSON (with a shipped schema), Markdown and HTML conformance matrices."""
