"""Golden text files under tests/golden/hierarchy/ (regenerate with IRKIT_REGEN_GOLDEN=1)."""

from __future__ import annotations

import os
import pathlib

GOLDEN_DIR = pathlib.Path(__file__).resolve().parent.parent / "golden" / "hierarchy"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / name
    if os.environ.get("IRKIT_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        return
    assert path.exists(), f"missing golden {path}; run with IRKIT_REGEN_GOLDEN=1 to create it"
    expected = path.read_text().rstrip("\n")
    assert text == expected, f"{path} differs (IRKIT_REGEN_GOLDEN=1 to update):\n{text}"
