"""Registration of irkit's own lowerings, next to their code: ``@own(aten.x.default, ...)``.

An own lowering is one :class:`OwnLowering` record, made where the lowering is defined:

* ``@own(target, applies=..., identity=...)`` above the function (several for one function that
  serves several overloads);
* ``own(target)(factory(...))`` for a lowering built by a factory, assigned to a module name;
* ``OwnLowering(target, torchlib("aten::all"))`` at module level, for a
  delegation to torchlib's function of another op, looked up lazily;
* ``@torchlib_gap(target)`` above a predicate telling when *torchlib's* lowering of ``target``
  does not cover a node (the node then takes the next way, torch's decompositions).

The target is an op overload, a ``torch.sym_*`` function, or a library op's registered name
(``"torchvision::roi_align"``, resolved when the table is built: absent while not registered).
:func:`collect` reads the records off the modules' names: no global table to keep in step.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator
from types import FunctionType, ModuleType
from typing import Any, TypeVar

import torch

from irkit.errors import LoweringError
from irkit.lowering._source import op_name, resolve_op

__all__ = ["OwnLowering", "Torchlib", "own", "torchlib", "torchlib_gap", "collect"]

_RECORDS = "__irkit_own__"
"""The attribute of a decorated function holding its records."""

F = TypeVar("F", bound=Callable[..., Any])
Applies = Callable[[torch.fx.Node], bool]


@dataclasses.dataclass(frozen=True)
class Torchlib:
    """torchlib's function registered under ``name`` (``"aten::sort"``), looked up when used."""

    name: str

    def resolve(self) -> Callable[..., Any]:
        """The torchlib function (its real-valued overload)."""
        return _torchlib_function(self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


def torchlib(name: str) -> Torchlib:
    """A lazy reference to torchlib's function for the registered aten name ``name``."""
    return Torchlib(name)


@functools.cache
def _torchlib_function(name: str) -> Callable[..., Any]:
    # Importing the ops module registers every torchlib function in the default registry.
    from onnxscript.function_libs.torch_lib import ops  # noqa: F401
    from onnxscript.function_libs.torch_lib.registration import default_registry

    if name not in default_registry or not default_registry[name].overloads:
        raise LoweringError(
            f"irkit's own lowerings delegate to torchlib's {name!r}, which this onnxscript does "
            "not register. Fix: install the onnxscript version irkit is tested with "
            "(pyproject.toml).",
            fx_node="",
            target=name,
        )
    return default_registry[name].overloads[0]  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class OwnLowering:
    """One op irkit lowers itself, or whose torchlib lowering it restricts.

    Attributes:
        target: The op overload, ``torch.sym_*`` function or library op name (``"ns::op"``).
        fn: The lowering (a :class:`Torchlib` reference: torchlib's function of another op);
            None for a record that only carries ``torchlib_gap``.
        applies: A plan-time test of an FX node; when false the node takes the next way
            (torchlib, then torch's decompositions). None: always.
        identity: The lowering returns its input unchanged (eval-mode dropout): as an in-place
            op's counterpart it mutates nothing, so aliasing never forces functionalization.
        torchlib_gap: When true for a node, torchlib's lowering of ``target`` does not cover
            it (wrong numbers, or a file no runtime loads): torch's decompositions instead.
        complex: The lowering is also right for complex inputs (torchlib's representation: a
            trailing dim of 2). Without it a node with a complex input takes the next way
            (``irkit/lowering/_complex.py``, torchlib's complex overload, decompositions).
    """

    target: Any
    fn: Callable[..., Any] | None = None
    applies: Applies | None = None
    identity: bool = False
    torchlib_gap: Applies | None = None
    complex: bool = False


def own(
    target: Any,
    *,
    applies: Applies | None = None,
    identity: bool = False,
    complex: bool = False,
) -> Callable[[F], F]:
    """Register the decorated function as irkit's lowering of ``target`` (see the module doc)."""

    def register(fn: F) -> F:
        record = OwnLowering(target, fn, applies, identity, complex=complex)
        records = (*getattr(fn, _RECORDS, ()), record)
        setattr(fn, _RECORDS, records)
        return fn

    return register


def torchlib_gap(target: Any) -> Callable[[Applies], Applies]:
    """Register the decorated predicate as where torchlib's lowering of ``target`` falls short."""

    def register(predicate: Applies) -> Applies:
        records = (*getattr(predicate, _RECORDS, ()), OwnLowering(target, torchlib_gap=predicate))
        setattr(predicate, _RECORDS, records)
        return predicate

    return register


def _records(modules: Iterable[ModuleType]) -> Iterator[OwnLowering]:
    seen: set[int] = set()
    for module in modules:
        for value in vars(module).values():
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, OwnLowering):
                yield value
            elif isinstance(value, FunctionType):
                yield from getattr(value, _RECORDS, ())


def collect(modules: Iterable[ModuleType]) -> dict[Any, OwnLowering]:
    """Target → record for every record in ``modules``; library ops not registered are absent
    and torchlib references are resolved to torchlib's functions.

    Raises:
        LoweringError: Two records for one target (a bug in irkit).
    """
    table: dict[Any, OwnLowering] = {}
    for record in _records(modules):
        target = resolve_op(record.target) if isinstance(record.target, str) else record.target
        if target is None:
            continue
        if target in table:
            raise LoweringError(
                f"two own lowerings of {op_name(target)}. This is a bug in irkit; please report it.",
                fx_node="",
                target=op_name(target),
            )
        fn = record.fn.resolve() if isinstance(record.fn, Torchlib) else record.fn
        table[target] = dataclasses.replace(record, target=target, fn=fn)
    return table
