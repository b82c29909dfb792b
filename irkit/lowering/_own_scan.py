"""irkit's own lowerings of the running extrema ``cummax`` / ``cummin`` (torchlib lacks them).

Identity along ``dim`` (moved last, ``n`` its length; ``j ≤ i`` the lower triangle)::

    values[i]  = max_{j ≤ i} x[j]                                   (NaN once a NaN was seen)
    indices[i] = max { j ≤ i : x[j] = values[i] }                  (the last such index, as
                                                                    torch's ``>=`` scan keeps)

computed with one ``(…, n, n)`` masked reduction — ``O(n²)`` memory along ``dim``, plain ops of
every dtype. NaN: torch's scan moves to each NaN it meets and stays on the last one, so after the
first NaN the value is NaN and the index is the last NaN's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._own_common import extreme, ints
from irkit.lowering._registration import own

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)

aten = torch.ops.aten


def _running(largest: bool) -> Callable[..., Any]:
    reduce = op.ReduceMax if largest else op.ReduceMin

    def lower(self, dim):
        rank = len(self.shape)
        dim = dim % rank
        perm = [a for a in range(rank) if a != dim] + [dim]
        back = [perm.index(a) for a in range(rank)]
        is_bool = self.dtype == ir.DataType.BOOL
        x = op.Cast(self, to=int(ir.DataType.INT32)) if is_bool else self
        dtype = ir.DataType.INT32 if is_bool else self.dtype
        x = op.Transpose(x, perm=perm)  # (…, n)
        n = op.Shape(x, start=-1)
        positions = op.Range(op.Constant(value_int=0), op.Squeeze(n), op.Constant(value_int=1))
        rows = op.Unsqueeze(positions, ints(1))  # i, (n, 1)
        seen = op.LessOrEqual(positions, rows)  # j ≤ i, (n, n)
        xj = op.Unsqueeze(x, ints(-2))  # (…, 1, n)
        values = reduce(
            op.Where(seen, xj, op.Constant(value=ir.tensor(np.array(extreme(dtype, largest))))),
            ints(-1),
            keepdims=0,
        )
        index = op.Where(seen, positions, ints(-1))  # (n, n): j where j ≤ i, else −1
        hit = op.Equal(xj, op.Unsqueeze(values, ints(-1)))
        if np.issubdtype(dtype.numpy(), np.floating):
            nan = op.IsNaN(xj)  # (…, 1, n)
            nan_seen = op.ReduceMax(
                op.Cast(op.And(seen, nan), to=int(ir.DataType.INT32)), ints(-1), keepdims=0
            )
            nan_seen = op.Cast(nan_seen, to=int(ir.DataType.BOOL))
            values = op.Where(nan_seen, op.CastLike(np.nan, values), values)
            hit = op.Where(op.Unsqueeze(nan_seen, ints(-1)), nan, hit)
        indices = op.ReduceMax(op.Where(hit, index, ints(-1)), ints(-1), keepdims=0)
        values = op.Transpose(values, perm=back)
        if is_bool:
            values = op.Cast(values, to=int(ir.DataType.BOOL))
        return values, op.Transpose(indices, perm=back)

    return lower


def _applies(node: torch.fx.Node) -> bool:
    """A static ``dim`` (a 0-d input is lowered as one element: ``_rank0``)."""
    value = node.args[0].meta.get("val")
    return isinstance(value, torch.Tensor) and isinstance(node.args[1], int)


_cummax = own(aten.cummax.default, applies=_applies)(_running(largest=True))
_cummin = own(aten.cummin.default, applies=_applies)(_running(largest=False))
