"""Python subprocesses of the test suite see the torchvision the tests see.

``tests/conftest.py`` puts this folder on ``PYTHONPATH``, so every Python the suite starts (the
demo, the command line, tools) imports this module at start-up. It adds one import hook and
nothing else: when, and only when, ``torchvision`` is first imported, the stand-in of
``tests/torchvision_ops.py`` is applied (itself a no-op where torchvision's own C++ ops load).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _OnTorchvision(importlib.abc.MetaPathFinder):
    """Applies the stand-in once, before torchvision's own code runs."""

    def __init__(self) -> None:
        self._pending = True

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torchvision" and self._pending:
            self._pending = False
            spec = importlib.machinery.PathFinder.find_spec(name)
            if spec is not None and spec.origin is not None:
                if _ROOT not in sys.path:
                    sys.path.append(_ROOT)
                from tests import torchvision_ops

                torchvision_ops.fall_back_on_failure(os.path.dirname(spec.origin))
        return None  # the ordinary finders import it


sys.meta_path.insert(0, _OnTorchvision())
