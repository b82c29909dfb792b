"""Which module calls become functions: the ``functions=`` option of :func:`irkit.outline`.

The selector language is shared with ``irkit.inline(modules=...)`` and
``irkit.rewriting.ModuleRule`` and lives one layer down, in :mod:`irkit._select` (the rewrite
engine must not import this package). Its rules, in short:

* ``True`` / ``False``: every module call / none.
* A :class:`ModuleSelector`: classes and/or path globs, explicitly named.
* A callable ``(path, qualified_class) -> bool``.
* Any other iterable: *classes only* — Python types, qualified class names (with a dot), bare
  class names, or globs over either. Strings are never path globs here; path globs go through
  ``ModuleSelector(paths=[...])``.

Example:
    >>> from irkit.metadata import Frame
    >>> make_predicate(["Linear"])(Frame("fc", 0, "torch.nn.Linear"))
    True
"""

from __future__ import annotations

from irkit._select import FunctionsOption, ModuleSelector, make_predicate, qualified_name

__all__ = ["ModuleSelector", "FunctionsOption", "make_predicate", "qualified_name"]
