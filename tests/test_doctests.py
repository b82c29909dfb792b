"""Every docstring example in the library runs (the ``>>>`` lines of every ``irkit`` module)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import irkit

MODULES = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(irkit.__path__, "irkit.")
    if name != "irkit.demo"  # a script (argparse main), no examples
)


def _examples(name: str) -> int:
    finder = doctest.DocTestFinder(exclude_empty=True)
    return sum(len(t.examples) for t in finder.find(importlib.import_module(name)))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0


def test_the_modules_with_examples_are_the_ones_that_have_them():
    """A guard that the walk finds the library: most modules carry runnable examples."""
    with_examples = [name for name in MODULES if _examples(name)]
    assert len(with_examples) >= 25, with_examples
    assert {"irkit.rewriting._rule", "irkit.rules", "irkit._lint", "irkit.metadata"} <= set(
        with_examples
    )
