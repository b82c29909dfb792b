"""Suite-wide test configuration: the fast lane.

``python -m pytest -m "not slow"`` is the fast lane (torch-free stages, small exports; under a
minute); ``python -m pytest`` (what CI runs) runs everything. Tests in the files under
directories owned by other work streams are marked here by module instead of by decorator;
move the mark into those files (``@pytest.mark.slow``) when convenient and shorten this list.
"""

from __future__ import annotations

import pytest

# Each test in these modules takes seconds: transformers models through torch.export, the CLI
# in a subprocess per test, or a real Chromium.
SLOW_MODULES = frozenset(
    {
        "tests/lowering/test_more_models.py",
        "tests/lowering/test_zoo.py",
        "tests/lowering/test_golden_and_metadata.py",
        "tests/viz/test_browser.py",
        "tests/viz/test_cli_errors.py",
        "tests/viz/test_lowered.py",
        "tests/viz/test_outlined.py",
        "tests/viz/test_svg_diff.py",
        "tests/viz/test_text.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        if item.path.relative_to(root).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
