"""irkit's own lowerings of ordering and selection ops torchlib lacks.

Each is a composition of standard ONNX ops with torch's semantics:

- ``sort.stable`` / (through its decomposition) ``argsort.stable``: ``TopK`` over the whole axis
  (ONNX breaks ties by the lower index, which *is* a stable sort in both directions);
- ``kthvalue``, ``median`` (the lower median, NaN if any element is NaN), ``median.dim``:
  ``TopK`` of the smallest ``k`` and its last element;
- ``nanmedian`` (``.dim``): NaNs become +∞ (sorted last), the lower median of each slice's
  non-NaN count is gathered from the full ``TopK``; an all-NaN slice is NaN at index 0;
- ``searchsorted`` / ``bucketize``: the insertion index counts the boundaries below the value
  (``<`` for the left side, ``<=`` for the right);
- ``masked_select``: ``Compress`` of the broadcast, flattened tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._own_common import INT64, ints
from irkit.lowering._registration import own, torchlib

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)

aten = torch.ops.aten
_INT32 = int(ir.DataType.INT32)


def _static_int_args(*positions: int) -> Callable[[torch.fx.Node], bool]:
    def applies(node: torch.fx.Node) -> bool:
        return all(isinstance(node.args[p], int) for p in positions if p < len(node.args))

    return applies


@own(aten.sort.stable)
def _sort_stable(self, *, stable=None, dim=-1, descending=False):
    return torchlib("aten::sort")(self, dim, descending)


def _smallest(x: ir.Value, k: ir.Value, dim: int) -> tuple[ir.Value, ir.Value]:
    """The ``k``-th smallest (1-based, ``k`` a 1-element tensor) along ``dim``, keeping ``dim``."""
    values, indices = op.TopK(x, k, axis=dim, largest=0, sorted=1)
    last = op.Sub(k, ints(1))
    return op.Gather(values, last, axis=dim), op.Gather(indices, last, axis=dim)


def _squeeze_unless(keepdim: bool, dim: int, *values: ir.Value) -> tuple[ir.Value, ...]:
    return values if keepdim else tuple(op.Squeeze(v, ints(dim)) for v in values)


@own(aten.kthvalue.default, applies=_static_int_args(1, 2))
def _kthvalue(self, k, dim=-1, keepdim=False):
    if len(self.shape) == 0:  # a 0-d tensor is its own (only) value, at index 0
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    values, indices = _smallest(self, ints(k), dim)
    return _squeeze_unless(keepdim, dim, values, indices)


def _lower_median_k(size: ir.Value) -> ir.Value:
    """``(n - 1) // 2 + 1``: the lower median's 1-based rank among ``n`` elements."""
    return op.Add(op.Div(op.Sub(size, ints(1)), ints(2)), ints(1))


def _nan_if_any_nan(self: ir.Value, result: ir.Value, dim: int | None, keepdim: bool) -> ir.Value:
    if not self.dtype.is_floating_point():
        return result
    axes = None if dim is None else ints(dim)
    has_nan = op.Cast(
        op.ReduceMax(op.Cast(op.IsNaN(self), to=_INT32), axes, keepdims=int(keepdim)),
        to=int(ir.DataType.BOOL),
    )
    return op.Where(has_nan, op.CastLike(float("nan"), self), result)


@own(aten.median.default)
def _median(self):
    flat = op.Reshape(self, ints(-1))
    values, _ = _smallest(flat, _lower_median_k(op.Shape(flat)), 0)
    return _nan_if_any_nan(self, op.Squeeze(values, ints(0)), None, False)


@own(aten.median.dim, applies=_static_int_args(1))
def _median_dim(self, dim, keepdim=False):
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    size = op.Shape(self, start=dim, end=dim + 1 if dim != -1 else None)
    values, indices = _smallest(self, _lower_median_k(size), dim)
    values, indices = _squeeze_unless(keepdim, dim, values, indices)
    return _nan_if_any_nan(self, values, dim, keepdim), indices


def _nanmedian_along(self: ir.Value, dim: int) -> tuple[ir.Value, ir.Value]:
    """The lower median of the non-NaN values along ``dim`` (kept), and its index; NaN (index
    0) where a slice is all NaN."""
    if not self.dtype.is_floating_point():
        size = op.Shape(self, start=dim, end=dim + 1 if dim != -1 else None)
        return _smallest(self, _lower_median_k(size), dim)
    nan = op.IsNaN(self)
    filled = op.Where(nan, op.CastLike(float("inf"), self), self)  # NaNs sort last
    count = op.ReduceSum(op.Cast(op.Not(nan), to=int(INT64)), ints(dim), keepdims=1)
    rank = op.Max(op.Div(op.Sub(count, ints(1)), ints(2)), ints(0))  # 0-based lower median
    size = op.Shape(self, start=dim, end=dim + 1 if dim != -1 else None)
    values, indices = op.TopK(filled, size, axis=dim, largest=0, sorted=1)
    value = op.GatherElements(values, rank, axis=dim)
    index = op.GatherElements(indices, rank, axis=dim)
    empty = op.Equal(count, ints(0))
    return op.Where(empty, op.CastLike(float("nan"), self), value), index


@own(aten.nanmedian.default)
def _nanmedian(self):
    if len(self.shape) == 0:
        return op.Identity(self)
    value, _ = _nanmedian_along(op.Reshape(self, ints(-1)), 0)
    return op.Squeeze(value, ints(0))


@own(aten.nanmedian.dim, applies=_static_int_args(1))
def _nanmedian_dim(self, dim, keepdim=False):
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    values, indices = _nanmedian_along(self, dim)
    return _squeeze_unless(keepdim, dim, values, indices)


def _searchsorted_applies(node: torch.fx.Node) -> bool:
    """One boundary row (1-D) or batched rows whose leading dims match the values'."""
    seq, values = (a.meta["val"] for a in node.args[:2])
    return seq.dim() == 1 or tuple(seq.shape[:-1]) == tuple(values.shape[:-1])


def _bucketize_applies(node: torch.fx.Node) -> bool:
    return node.args[1].meta["val"].dim() == 1


@own(aten.searchsorted.Tensor, applies=_searchsorted_applies)
def _searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    seq = sorted_sequence
    rank = len(sorted_sequence.shape)  # (the gathered value below has no shape yet)
    if sorter is not None:
        seq = op.GatherElements(seq, sorter, axis=-1)
    values = op.Unsqueeze(self, ints(-1))  # (..., K, 1) against the boundaries (..., 1, M)
    if rank > 1:
        seq = op.Unsqueeze(seq, ints(-2))
    below = op.LessOrEqual(seq, values) if right or side == "right" else op.Less(seq, values)
    count = op.ReduceSum(op.Cast(below, to=int(INT64)), ints(-1), keepdims=0)
    return op.Cast(count, to=_INT32) if out_int32 else count


@own(aten.bucketize.Tensor, applies=_bucketize_applies)
def _bucketize(self, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, self, out_int32=out_int32, right=right)


@own(aten.masked_select.default)
def _masked_select(self, mask):
    both = op.Where(mask, self, self)  # self broadcast against mask
    flat_mask = op.Reshape(op.Expand(mask, op.Shape(both)), ints(-1))
    return op.Compress(op.Reshape(both, ints(-1)), flat_mask, axis=0)
