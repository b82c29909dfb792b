"""Selecting module calls: one language for every stage that picks module calls.

``irkit.outline(functions=...)``, ``irkit.inline(modules=...)`` and
``irkit.rewriting.ModuleRule(modules=...)`` (whose ``cls=`` / ``path=`` keywords are sugar for
it) all take the same option, normalized here by :func:`make_predicate` into one predicate over
a call's :class:`~irkit.metadata.Frame`:

* ``True`` / ``False``: every module call / none.
* A :class:`ModuleSelector`: classes and/or path globs, explicitly named.
* A callable ``(path, qualified_class) -> bool``.
* Any other iterable: *classes only* — Python types (matched by their qualified name
  ``cls.__module__ + "." + cls.__qualname__``) or strings. A string with a dot is a qualified
  class name (``"transformers.models.llama.modeling_llama.LlamaDecoderLayer"``), a string without
  one is a bare class name (``"LlamaDecoderLayer"``); a string with a glob character (``*?[``)
  is an ``fnmatch`` glob over either (``"*.LlamaRMSNorm"``, ``"Llama*"``). Strings are never path
  globs here: module paths and qualified class names both contain dots, so one string cannot say
  which it is. Path globs go through ``ModuleSelector(paths=[...])``.

This module sits below the stages (it imports only :mod:`irkit.metadata` and
:mod:`irkit.errors`), so outlining and the rewrite engine share it without importing each other.
``ModuleSelector`` is public as ``irkit.ModuleSelector`` and ``irkit.hierarchy.ModuleSelector``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Iterable

from irkit.errors import IrkitError, OutlineError
from irkit.metadata import Frame

__all__ = ["ModuleSelector", "FunctionsOption", "make_predicate", "qualified_name", "is_glob"]


def qualified_name(cls: type) -> str:
    """``cls.__module__ + "." + cls.__qualname__`` — the spelling used in scope metadata."""
    return f"{cls.__module__}.{cls.__qualname__}"


def is_glob(text: str) -> bool:
    """Whether ``text`` has an ``fnmatch`` wildcard (``*``, ``?`` or ``[``)."""
    return any(c in text for c in "*?[")


@dataclasses.dataclass(frozen=True)
class ModuleSelector:
    """Select module calls by class and/or by module path glob (a call matching either is chosen).

    Attributes:
        classes: Python types, qualified class names (with a dot), bare class names, or globs
            over either (``"*.LlamaRMSNorm"``).
        paths: ``fnmatch`` globs over module paths (``"layers.*"``, ``"*.attn"``). ``*`` also
            matches dots, so ``"layers.*"`` selects ``layers.0`` and ``layers.0.attn``. A second
            call of a module has the same path as the first (the call index is not part of it).

    Raises:
        OutlineError: A path is not a string.

    Example:
        >>> sel = ModuleSelector(classes=["Linear"], paths=["layers.*.attn"])
        >>> pred = make_predicate(sel)
        >>> pred(Frame("layers.3.attn", 0, "m.Attention")), pred(Frame("fc", 0, "torch.nn.Linear"))
        (True, True)
        >>> pred(Frame("layers.3", 0, "m.Block"))
        False
        >>> make_predicate(ModuleSelector(classes=["*.Llama*Norm"]))(Frame("n", 0, "t.m.LlamaRMSNorm"))
        True
    """

    classes: Iterable[type | str] = ()
    paths: Iterable[str] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))
        object.__setattr__(self, "paths", tuple(self.paths))
        for p in self.paths:
            if not isinstance(p, str):
                raise OutlineError(f"ModuleSelector(paths=...): {p!r} is not a string glob.")


FunctionsOption = bool | ModuleSelector | Callable[[str, str], bool] | Iterable[type | str]
"""What ``functions=`` / ``modules=`` accept (see the module docstring)."""


def _class_matcher(
    classes: Iterable[type | str], error: type[IrkitError], option: str
) -> Callable[[str], bool]:
    qualified: set[str] = set()
    bare: set[str] = set()
    globs: list[str] = []
    for c in classes:
        if isinstance(c, type):
            qualified.add(qualified_name(c))
        elif isinstance(c, str) and c:
            if is_glob(c):
                globs.append(c)
            else:
                (qualified if "." in c else bare).add(c)
        else:
            raise error(
                f"{option}=...: {c!r} is neither a class nor a class name. Pass types, "
                "class names, ModuleSelector(paths=[...]) for path globs, or a predicate."
            )

    def match(cls: str) -> bool:
        name = cls.rsplit(".", 1)[-1]
        if cls in qualified or name in bare:
            return True
        return any(fnmatch.fnmatchcase(cls, g) or fnmatch.fnmatchcase(name, g) for g in globs)

    return match


def make_predicate(
    functions: FunctionsOption | None,
    *,
    error: type[IrkitError] = OutlineError,
    option: str = "functions",
) -> Callable[[Frame], bool]:
    """Normalize a module selection into a predicate over a call's :class:`Frame`.

    Args:
        functions: The selection (see the module docstring); ``None`` selects nothing.
        error: The error class raised for a malformed selection (the caller's stage's).
        option: The option's name in error messages (``"functions"``, ``"modules"``).

    Raises:
        IrkitError: (``error``) The option has an unsupported type or element.
    """
    if functions is True:
        return lambda frame: True
    if functions is False or functions is None:
        return lambda frame: False
    if isinstance(functions, ModuleSelector):
        by_class = _class_matcher(functions.classes, error, option)
        globs = functions.paths
        return lambda f: by_class(f.cls) or any(fnmatch.fnmatchcase(f.path, g) for g in globs)
    if isinstance(functions, str):
        raise error(
            f"{option}={functions!r}: a single string is ambiguous. Pass a list of class "
            f"names ([{functions!r}]) or ModuleSelector(paths=[{functions!r}]) for a path glob."
        )
    if callable(functions) and not isinstance(functions, type):
        user = functions
        return lambda f: bool(user(f.path, f.cls))
    if isinstance(functions, type):
        functions = [functions]
    if isinstance(functions, Iterable):
        match = _class_matcher(list(functions), error, option)
        return lambda f: match(f.cls)
    raise error(
        f"{option}={functions!r} ({type(functions).__name__}) is not supported: pass True, "
        "False, classes / class names, a ModuleSelector or a predicate (path, class) -> bool."
    )
