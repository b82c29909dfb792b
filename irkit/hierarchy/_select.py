"""Which module calls become functions: the ``functions=`` option of :func:`irkit.outline`.

The rule is simple and unambiguous:

* ``True`` / ``False``: every module call / none.
* A :class:`ModuleSelector`: classes and/or path globs, explicitly named.
* A callable ``(path, qualified_class) -> bool``.
* Any other iterable: *classes only* — Python types (matched by their qualified name
  ``cls.__module__ + "." + cls.__qualname__``) or strings. A string with a dot is a qualified
  class name (``"transformers.models.llama.modeling_llama.LlamaDecoderLayer"``), a string without
  one is a bare class name (``"LlamaDecoderLayer"``). Strings are never path globs here: module
  paths and qualified class names both contain dots, so one string cannot say which it is. Path
  globs go through ``ModuleSelector(paths=[...])``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Iterable

from irkit.errors import OutlineError
from irkit.metadata import Frame

__all__ = ["ModuleSelector", "FunctionsOption", "make_predicate", "qualified_name"]


def qualified_name(cls: type) -> str:
    """``cls.__module__ + "." + cls.__qualname__`` — the spelling used in scope metadata."""
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclasses.dataclass(frozen=True)
class ModuleSelector:
    """Select module calls by class and/or by module path glob (a call matching either is chosen).

    Attributes:
        classes: Python types, qualified class names (with a dot) or bare class names.
        paths: ``fnmatch`` globs over module paths (``"layers.*"``, ``"*.attn"``). ``*`` also
            matches dots, so ``"layers.*"`` selects ``layers.0`` and ``layers.0.attn``. A second
            call of a module has the same path as the first (the call index is not part of it).

    Example:
        >>> sel = ModuleSelector(classes=["Linear"], paths=["layers.*.attn"])
        >>> pred = make_predicate(sel)
        >>> pred(Frame("layers.3.attn", 0, "m.Attention")), pred(Frame("fc", 0, "torch.nn.Linear"))
        (True, True)
        >>> pred(Frame("layers.3", 0, "m.Block"))
        False
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
"""What ``functions=`` accepts (see the module docstring)."""


def _class_matcher(classes: Iterable[type | str]) -> Callable[[str], bool]:
    qualified: set[str] = set()
    bare: set[str] = set()
    for c in classes:
        if isinstance(c, type):
            qualified.add(qualified_name(c))
        elif isinstance(c, str) and c:
            (qualified if "." in c else bare).add(c)
        else:
            raise OutlineError(
                f"functions=...: {c!r} is neither a class nor a class name. Pass types, "
                "class names, ModuleSelector(paths=[...]) for path globs, or a predicate."
            )

    def match(cls: str) -> bool:
        return cls in qualified or cls.rsplit(".", 1)[-1] in bare

    return match


def make_predicate(functions: FunctionsOption) -> Callable[[Frame], bool]:
    """Normalize the ``functions=`` option into a predicate over a call's :class:`Frame`.

    Raises:
        OutlineError: The option has an unsupported type or element.
    """
    if functions is True:
        return lambda frame: True
    if functions is False or functions is None:
        return lambda frame: False
    if isinstance(functions, ModuleSelector):
        by_class = _class_matcher(functions.classes)
        globs = functions.paths
        return lambda f: by_class(f.cls) or any(fnmatch.fnmatchcase(f.path, g) for g in globs)
    if isinstance(functions, str):
        raise OutlineError(
            f"functions={functions!r}: a single string is ambiguous. Pass a list of class "
            f"names ([{functions!r}]) or ModuleSelector(paths=[{functions!r}]) for a path glob."
        )
    if callable(functions) and not isinstance(functions, type):
        user = functions
        return lambda f: bool(user(f.path, f.cls))
    if isinstance(functions, type):
        functions = [functions]
    if isinstance(functions, Iterable):
        match = _class_matcher(list(functions))
        return lambda f: match(f.cls)
    raise OutlineError(
        f"functions={functions!r} ({type(functions).__name__}) is not supported: pass True, "
        "False, classes / class names, a ModuleSelector or a predicate (path, class) -> bool."
    )
