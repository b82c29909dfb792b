"""The runnable examples in the rewriting docstrings pass."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "irkit.rewriting.pattern", "irkit.rewriting.builder", "irkit.rewriting.rule",
    "irkit.rewriting.apply", "irkit.rewriting.module_rule", "irkit.rewriting.optimize",
    "irkit.rewriting.checks", "irkit.rewriting.report", "irkit.rules", "irkit._pipeline",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
