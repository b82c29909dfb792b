"""The conventions run: lint, formatting and types are part of the test suite (and so of CI).

Why here and not only in ``.ci/run``: ``python -m pytest`` is the README's one test command, so
a contributor running it locally sees exactly what CI sees, failures are reported next to the
other tests, and the fast lane can skip the slow type check. The tools come from the ``test``
extra (``pip install -e ".[test]"``); a missing tool fails the test instead of skipping it.

What each check covers is configured in ``pyproject.toml`` (``[tool.ruff]``, the per-package
``ruff.toml`` layering bans, ``[tool.ruff.format] exclude``, ``[tool.mypy]``), not here.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_ruff_check_is_clean():
    """pycodestyle/pyflakes/isort/bugbear/pyupgrade/simplify, unused noqa, the layering bans."""
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_check_is_clean():
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_on_the_torch_free_packages():
    result = _run("mypy", "--cache-dir", str(ROOT / ".mypy_cache"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found")


@pytest.mark.slow
def test_a_normal_install_ships_the_rule_library_and_the_type_marker(tmp_path):
    """A non-editable wheel: ``irkit.rules`` and ``py.typed`` are in it, no top-level package."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "irkit", source / "irkit", ignore=shutil.ignore_patterns("__pycache__"))
    result = _run(
        "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", "dist", ".", cwd=source
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (source / "dist").glob("irkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"irkit/py.typed", "irkit/rules/__init__.py", "irkit/rules/layer_norm.py"} <= set(names)
    top = {n.split("/")[0] for n in names}
    assert {n for n in top if not n.endswith(".dist-info")} == {"irkit"}
