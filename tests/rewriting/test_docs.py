"""The code in docs/rules.md runs as written (one namespace, blocks in order), as a user who
installed the wheel runs it: from another directory, with no ``tests`` package to import.

A wheel holds ``irkit`` only; a docs example that imports the repository's ``tests`` helpers
(or reads files of the checkout) works here and nowhere else.
"""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "rules.md"
# Every page with code a user may copy: the README and docs/*.md.
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
_BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)
_IMPORTS_TESTS = re.compile(r"^\s*(?:from\s+tests[.\s]|import\s+tests\b)", flags=re.M)


def _blocks(page: pathlib.Path) -> list[str]:
    return _BLOCK.findall(page.read_text(encoding="utf-8"))


@pytest.fixture
def like_a_wheel(tmp_path, monkeypatch):
    """Run from an empty directory, with ``tests`` (and what it imported) unimportable."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "tests", None)


def test_rules_md_examples_run(like_a_wheel, capsys):
    blocks = _blocks(DOC)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/rules.md[block {i}]", "exec"), namespace)
    out = capsys.readouterr().out
    assert "SiLU: Mul(x, Sigmoid(x)) ⇒ Swish(x)" in out
    assert "HardSwish: Mul(x, HardSigmoid(x, alpha=?alpha, beta=?beta)) ⇒ HardSwish(x)" in out


def test_a_page_that_imports_tests_cannot_run(like_a_wheel):
    """The guard above is real: the import the page once had fails under it."""
    with pytest.raises(ImportError):
        exec("from tests.helpers import run_ort", {})


def test_no_docs_example_imports_the_test_suite():
    """No Python block of the README or docs/*.md imports ``tests`` (it is not in the wheel)."""
    assert len(PAGES) >= 10
    offenders = [
        f"{page.relative_to(ROOT)} block {i}"
        for page in PAGES
        for i, code in enumerate(_blocks(page))
        if _IMPORTS_TESTS.search(code)
    ]
    assert offenders == []
    assert _IMPORTS_TESTS.search("x = 1\nfrom tests.helpers import run_ort\n")
