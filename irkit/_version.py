"""irkit's version: the one home below every stage (``pyproject.toml``'s ``version`` is checked
against it by ``tests/test_conventions.py``)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
