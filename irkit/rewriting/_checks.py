"""Small helpers for rule checks: ranks, shapes, dtypes, constants. All return plain values.

>>> import onnx_ir as ir
>>> v = ir.val("v", ir.DataType.FLOAT, [2, "n"])
>>> rank(v), static_shape(v), is_float(v)
(2, None, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from irkit._shapes import known_dims, value_dims
from irkit.rewriting._match import MatchFailure, const_value, fail

__all__ = [
    "Verdict",
    "rank",
    "static_shape",
    "dims",
    "is_float",
    "FLOAT_TYPES",
    "scalar",
    "const_ints",
    "same_dims",
    "reduced_axis",
]

Verdict = bool | MatchFailure | Mapping[str, Any]
"""What a rule's check returns: ``True`` (fire), ``False`` or a :class:`MatchFailure` (why not),
or a dict of *findings* (fire, and pass these to the rewrite by parameter name)."""

FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)


def rank(value: ir.Value | None) -> int | None:
    """The rank of ``value`` if its shape is known."""
    if value is None or value.shape is None:
        return None
    return len(value.shape)


def dims(value: ir.Value | None) -> tuple[int | str | None, ...] | None:
    """The dims of ``value`` (ints, symbolic names or None) if its shape is known."""
    return value_dims(value)


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The shape if fully static."""
    d = dims(value)
    if d is None or not all(isinstance(x, int) for x in d):
        return None
    return d  # type: ignore[return-value]


def is_float(value: ir.Value | None) -> bool:
    """Whether ``value`` has a known floating-point dtype."""
    return value is not None and value.dtype in FLOAT_TYPES


def scalar(value: ir.Value | None) -> float | None:
    """The value of a constant with exactly one element, as a Python float."""
    arr = const_value(value)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "biuf":
        return None
    return float(arr.reshape(()))


def const_ints(value: ir.Value | None) -> list[int] | None:
    """A constant integer tensor (an ``axes`` / ``shape`` input) as a list of ints."""
    arr = const_value(value)
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim > 1:
        return None
    return [int(x) for x in np.atleast_1d(arr)]


def same_dims(a: Sequence[int | str | None], b: Sequence[int | str | None]) -> bool:
    """Equal dims, where symbolic dims are equal only by name and None equals nothing."""
    return len(a) == len(b) and all(x is not None and x == y for x, y in zip(a, b, strict=True))


def reduced_axis(
    x: ir.Value, axes_in: ir.Value | None, axes_attr: Sequence[int] | None
) -> int | MatchFailure:
    """The first reduced axis if the ``axes`` of a reduction are exactly the trailing axes of ``x``.

    Args:
        x: The reduced value (its rank must be known).
        axes_in: The ``axes`` input (opset ≥ 18), or ``None``.
        axes_attr: The ``axes`` attribute (older opsets), or ``None``.

    Returns:
        The first (non-negative) reduced axis, or a :class:`MatchFailure` saying why not.

    Example:
        >>> v = ir.val("v", ir.DataType.FLOAT, [2, 3, 4])
        >>> reduced_axis(v, None, [-2, -1]), reduced_axis(v, None, [0]).reason
        (1, 'axes [0] are not the trailing axes of a rank-3 input')
    """
    if axes_in is not None:
        axes = const_ints(axes_in)
    else:
        axes = list(axes_attr) if axes_attr is not None else None
    if axes is None:
        return fail("reduction axes are not constant", axes_in)
    r = rank(x)
    if r is None:
        return fail("input rank unknown", x)
    norm = sorted(a % r for a in axes)
    if not norm or norm != list(range(norm[0], r)):
        return fail(f"axes {axes} are not the trailing axes of a rank-{r} input", axes_in)
    return norm[0]


def _outer(
    value: ir.Value,
    body: ir.Graph | ir.Function,
    model: ir.Model,
    read: Callable[[ir.Value], Any],
    depth: int,
) -> Any:
    """``read(value)``, or — a function input that carries none (a model read from a file, or a
    parameter the lowering left untyped) — ``read`` of the argument every call site passes,
    through nested calls (``None`` unless all agree)."""
    found = read(value)
    if found is not None or depth == 0 or not isinstance(body, ir.Function):
        return found
    if value not in body.inputs:
        return None
    index = list(body.inputs).index(value)
    answers: set[Any] = set()
    owners: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for owner in owners:
        for node in owner:
            if (node.domain, node.op_type, node.overload) == body.identifier():
                arg = node.inputs[index] if index < len(node.inputs) else None
                answers.add(None if arg is None else _outer(arg, owner, model, read, depth - 1))
    return answers.pop() if len(answers) == 1 else None


def outer_dims(
    value: ir.Value, body: ir.Graph | ir.Function, model: ir.Model, depth: int = 8
) -> tuple[Any, ...] | None:
    """``value``'s known dims, or those of the argument every call of the function ``body``
    passes for it (see ``_outer``)."""
    return _outer(value, body, model, known_dims, depth)  # type: ignore[no-any-return]


def outer_dtype(
    value: ir.Value, body: ir.Graph | ir.Function, model: ir.Model, depth: int = 8
) -> ir.DataType | None:
    """``value``'s dtype, or that of the argument every call of the function ``body`` passes for
    it (see ``_outer``)."""
    return _outer(value, body, model, lambda v: v.dtype, depth)  # type: ignore[no-any-return]
