"""Golden text files under tests/golden/hierarchy/ (one implementation: tests.helpers)."""

from __future__ import annotations

from tests.helpers import assert_golden


def check_golden(name: str, text: str) -> None:
    """``tests/golden/hierarchy/<name>`` holds ``text`` plus a final newline."""
    assert_golden(text + "\n", f"hierarchy/{name}")
