"""ALiBi's bias as a model holds it: a step-1 slice of a constant table, linear per head.

transformers' mpt builds ``slope_h · (c + 1 - M)`` for the columns ``c < M`` of a constant
``(heads, 1, M)`` table and slices the last ``T`` columns (the keys) for each step. Softmax drops a
per-row constant, so only the slopes (the table's step along its last axis, one per head) carry
meaning; :func:`alibi_slopes` finds them, or says why the value is no such bias. Shared by the
``"ort"`` target's :mod:`~irkit.rules.ort.attention.alibi` and the shared KV buffer
(:mod:`irkit.rules.kv_buffer`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from irkit.rewriting import MatchFailure, dims, fail
from irkit.rewriting import const_value as _const_value

__all__ = ["alibi_slopes"]


def _table(bias: ir.Value, bound: Callable[[ir.Value], ir.Value]) -> ir.Value | MatchFailure:
    """The root of ``bias``'s chain of step-1 ``Slice`` s on the last axis (``bound``: see
    :func:`alibi_slopes`)."""

    def const_value(value: ir.Value) -> np.ndarray | None:
        return _const_value(bound(value))

    v = bias
    while (p := v.producer()) is not None and p.op_type == "Slice" and p.domain == "":
        if p.inputs[0] is None or len(p.inputs) < 4 or p.inputs[3] is None:
            return fail("a Slice without axes in the bias", v)
        table = const_value(p.inputs[0])
        sizes = dims(p.inputs[0]) or (() if table is None else table.shape)
        rank = len(sizes)
        if rank == 0:
            return fail("a Slice of unknown rank in the bias", v)
        axes = const_value(p.inputs[3])
        steps = const_value(p.inputs[4]) if len(p.inputs) > 4 and p.inputs[4] else None
        sliced = [] if axes is None else [int(a) % rank for a in axes.ravel()]
        # (an axis of size 1, the query's in (heads, 1, M), keeps its one row or none)
        if axes is None or any(a != rank - 1 and sizes[a] != 1 for a in sliced):
            return fail("the bias slices another axis than the keys'", v)
        if steps is not None and any(int(x) != 1 for x in steps.ravel()):
            return fail("the bias slices with a step other than 1", v)
        v = p.inputs[0]
    return v


def alibi_slopes(
    bias: ir.Value,
    heads: int | None = None,
    bound: Callable[[ir.Value], ir.Value] | None = None,
) -> np.ndarray | MatchFailure:
    """ALiBi's per-head slopes (float64, one per head) when ``bias`` is a chain of step-1
    slices, on the last axis, of a constant ``(heads, 1, M)`` or ``(1, heads, 1, M)`` table
    linear along that axis; otherwise why not.

    Args:
        bias: The value added to the attention scores.
        heads: The number of heads the table must have (None: any).
        bound: Maps a value of the chain (its root, the slices' axes and steps) to the value
            it stands for (a function input to the value every call passes,
            :class:`irkit.rules.hoist.Threader`); None: itself.

    Returns:
        The slopes, or a :class:`~irkit.rewriting.MatchFailure` naming the failed check.
    """
    if (dims(bias) or (None,))[-1] == 1:
        return fail("the bias is one column broadcast over the keys", bias)
    resolve = bound or (lambda value: value)
    root = _table(bias, resolve)
    if isinstance(root, MatchFailure):
        return root
    table = _const_value(resolve(root))
    if table is None:
        return fail("the bias is not a slice of a constant table (ALiBi)", bias)
    shape = table.shape
    count = heads if heads is not None else (shape[-3] if len(shape) >= 3 else -1)
    if len(shape) not in (3, 4) or shape[-2] != 1 or shape[-1] < 2 or shape[-3] != count:
        return fail(f"bias table of shape {shape}, not ({count}, 1, M) or (1, {count}, 1, M)", root)
    if len(shape) == 4 and shape[0] != 1:
        return fail(f"bias table of shape {shape}: one per batch row", root)
    rows = table.reshape(count, shape[-1]).astype(np.float64)
    steps = np.diff(rows, axis=1)
    if not np.allclose(steps, steps[:, :1], rtol=1e-5, atol=1e-6):
        return fail("the bias table is not linear along the keys (not ALiBi)", root)
    return steps[:, 0]
