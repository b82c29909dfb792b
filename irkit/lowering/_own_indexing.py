"""irkit's own lowerings of flat-indexing and allocation ops torchlib lacks.

Each is a composition of standard ONNX ops with torch's semantics:

- ``take(x, index)``: ``Gather`` of the flattened ``x`` (negative indices count from the end,
  as ONNX ``Gather`` does);
- ``put(x, index, source, accumulate)``: ``ScatterElements`` into the flattened ``x``
  (``reduction="add"`` when accumulating), reshaped back; negative indices wrapped first;
- ``nonzero`` of a scalar: ``(1, 0)`` or ``(0, 0)`` (``NonZero`` would give ``(n, 1)``);
- ``nonzero_static(x, size, fill_value)``: ``NonZero``, transposed to ``(n, rank)``, padded
  with ``fill_value`` rows and cut to ``size`` rows;
- ``pad(x, pad, mode="circular")``: slices and ``Concat`` (onnxruntime's CPU ``Pad`` has no
  ``wrap`` mode), negative pads cutting first as torch does;
- ``unique_consecutive`` (``dim=None``, any dtype): ``Compress`` of each run's first element,
  the inverse a ``CumSum`` of run starts, the counts the gaps between them;
- ``scatter_reduce`` ``amax``/``amin`` of bool: torchlib's, computed on int32 (onnxruntime's
  ``ScatterElements`` has no bool max/min);
- ``empty_permuted(size, physical_layout, dtype)``: ``empty(size)`` (the physical layout is a
  memory-format hint ONNX has no notion of; the values are unspecified in torch);
- ``index_reduce(x, dim, index, source, reduce, include_self)``: ``ScatterElements`` along
  ``dim`` with ``reduction`` ``mul``/``max``/``min`` (``prod``/``amax``/``amin``), the index
  expanded to ``source``'s shape; without ``include_self`` the indexed slots first get the
  reduction's identity. ``mean`` is a scattered sum over a scattered count (floor division for
  integers, as torch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit._irutil import SLICE_END
from irkit.lowering._own_common import INT64, extreme, ints
from irkit.lowering._registration import own, torchlib

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)

aten = torch.ops.aten


def _flat(x: ir.Value) -> ir.Value:
    return op.Reshape(x, ints(-1))


@own(aten.take.default)
def _take(self, index):
    return op.Gather(_flat(self), index, axis=0)


@own(aten.put.default)
def _put(self, index, source, accumulate=False):
    flat = _flat(self)
    where = _flat(index)
    size = op.Size(flat)
    where = op.Where(op.Less(where, ints(0)), op.Add(where, size), where)
    updates = _flat(source)
    reduction = "add" if accumulate else "none"
    put = op.ScatterElements(flat, where, updates, axis=0, reduction=reduction)
    return op.Reshape(put, op.Shape(self))


def _nonzero_static_applies(node: torch.fx.Node) -> bool:
    value = node.args[0].meta.get("val")
    size = node.kwargs.get("size", node.args[1] if len(node.args) > 1 else None)
    return isinstance(value, torch.Tensor) and isinstance(size, int)


@own(aten.nonzero_static.default, applies=_nonzero_static_applies)
def _nonzero_static(self, *, size, fill_value=-1):
    rank = len(self.shape)
    if rank == 0:  # a scalar's indices have no coordinates: (size, 0)
        return op.ConstantOfShape(ints(size, 0), value=ir.tensor([0], dtype=ir.DataType.INT64))
    rows = op.Transpose(op.NonZero(self), perm=[1, 0])  # (n, rank)
    fill = op.Expand(op.CastLike(fill_value, rows), ints(size, rank))
    return op.Slice(op.Concat(rows, fill, axis=0), ints(0), ints(size), ints(0))


def _is_scalar(node: torch.fx.Node) -> bool:
    value = node.args[0].meta.get("val")
    return isinstance(value, torch.Tensor) and value.dim() == 0


@own(aten.nonzero.default, applies=_is_scalar)
def _nonzero_scalar(self):
    """A scalar's nonzero indices have no coordinates: ``(1, 0)`` if it is nonzero, else
    ``(0, 0)`` (ONNX ``NonZero`` treats a scalar as a vector: ``(n, 1)``)."""
    count = op.Cast(op.Cast(op.Reshape(self, ints(1)), to=int(ir.DataType.BOOL)), to=int(INT64))
    return op.ConstantOfShape(op.Concat(count, ints(0), axis=0), value=ir.tensor([0], dtype=INT64))


def _unique_consecutive_applies(node: torch.fx.Node) -> bool:
    dim = node.args[3] if len(node.args) > 3 else node.kwargs.get("dim")
    return dim is None


@own(aten.unique_consecutive.default, applies=_unique_consecutive_applies)
def _unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    """Runs of equal neighbours in the flattened tensor (any dtype; NaNs are all distinct):
    ``keep`` marks each run's first element; the inverse is ``CumSum(keep) - 1``; the counts are
    the gaps between the runs' start positions."""
    flat = _flat(self)
    axis = ints(0)
    later = op.Slice(flat, ints(1), ints(SLICE_END), axis)
    earlier = op.Slice(flat, ints(0), ints(-1), axis)
    first = op.Expand(
        op.Constant(value=ir.tensor([True])), op.Shape(op.Slice(flat, axis, ints(1), axis))
    )
    keep = op.Concat(first, op.Not(op.Equal(later, earlier)), axis=0)
    values = op.Compress(flat, keep, axis=0)
    empty = op.Constant(value=ir.tensor(np.zeros(0, dtype=np.int64)))
    inverse, counts = empty, empty
    if return_inverse:
        runs = op.CumSum(op.Cast(keep, to=int(INT64)), axis)
        inverse = op.Reshape(op.Sub(runs, ints(1)), op.Shape(self))
    if return_counts:
        size = op.Size(flat)
        index = op.Range(op.Constant(value_int=0), size, op.Constant(value_int=1))
        starts = op.Compress(index, keep, axis=0)
        ends = op.Concat(
            op.Slice(starts, ints(1), ints(SLICE_END), axis), op.Reshape(size, ints(1)), axis=0
        )
        counts = op.Sub(ends, starts)
    return values, inverse, counts


def _bool_scatter_extremum_applies(node: torch.fx.Node) -> bool:
    value = node.args[0].meta.get("val")
    reduce = node.args[4] if len(node.args) > 4 else node.kwargs.get("reduce")
    return (
        isinstance(value, torch.Tensor) and value.dtype == torch.bool and reduce in ("amax", "amin")
    )


def _as_int32(value: ir.Value) -> ir.Value:
    cast = op.Cast(value, to=int(ir.DataType.INT32))
    cast.dtype, cast.shape = ir.DataType.INT32, value.shape  # (torchlib reads the dtype)
    return cast


@own(aten.scatter_reduce.two, applies=_bool_scatter_extremum_applies)
def _bool_scatter_extremum(self, dim, index, src, reduce, *, include_self=True):
    """``scatter_reduce`` ``amax``/``amin`` of booleans (OR / AND) computed on int32:
    onnxruntime's ``ScatterElements`` has no bool kernel for ``reduction="max"``/``"min"``."""
    scatter_reduce = torchlib("aten::scatter_reduce.two")
    out = scatter_reduce(
        _as_int32(self), dim, index, _as_int32(src), reduce, include_self=include_self
    )
    return op.Cast(out, to=int(ir.DataType.BOOL))


def _pad_circular_applies(node: torch.fx.Node) -> bool:
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    pad = node.args[1]
    return mode == "circular" and all(isinstance(p, int) for p in pad)


@own(aten.pad.default, applies=_pad_circular_applies)
def _pad_circular(self, pad, mode="constant", value=None):
    """Circular padding as slices: each dim (last first) is cut by its negative pads, then the
    cut tensor's last ``left`` and first ``right`` elements wrap around it — torch's order."""
    out = self
    for i in range(len(pad) // 2):
        left, right = pad[2 * i], pad[2 * i + 1]
        axis = ints(-1 - i)
        out = op.Slice(out, ints(max(-left, 0)), ints(-max(-right, 0) or SLICE_END), axis)
        parts = [out]
        if left > 0:
            parts.insert(0, op.Slice(out, ints(-left), ints(SLICE_END), axis))
        if right > 0:
            parts.append(op.Slice(out, ints(0), ints(right), axis))
        if len(parts) > 1:
            out = op.Concat(*parts, axis=-1 - i)
    return out


@own(aten.empty_permuted.default)
def _empty_permuted(
    size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None
):
    empty = torchlib("aten::empty.memory_format")
    return empty(size, dtype=int(ir.DataType.FLOAT) if dtype is None else dtype)


_REDUCTIONS = {"prod": "mul", "amax": "max", "amin": "min", "mean": "add"}


def _identity(reduce: str, dtype: ir.DataType) -> Any:
    """The value that leaves a slot's reduction unchanged (what ``include_self=False`` puts)."""
    if reduce == "prod":
        return 1
    if reduce == "mean":
        return 0
    return extreme(dtype, largest=reduce == "amax").item()


def _index_reduce_applies(node: torch.fx.Node) -> bool:
    reduce = node.args[4] if len(node.args) > 4 else node.kwargs.get("reduce")
    return reduce in _REDUCTIONS and isinstance(node.args[1], int)


@own(aten.index_reduce.default, applies=_index_reduce_applies)
def _index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if len(self.shape) == 0:  # a scalar is a one-element vector along dim 0
        flat = _index_reduce_nd(_flat(self), 1, 0, index, _flat(source), reduce, include_self)
        return op.Reshape(flat, op.Shape(self))
    rank = len(self.shape)
    return _index_reduce_nd(self, rank, dim % rank, index, source, reduce, include_self)


def _index_reduce_nd(self, rank, dim, index, source, reduce, include_self):
    shape = [1] * rank
    shape[dim] = -1
    where = op.Reshape(index, ints(*shape))
    where = op.Where(
        op.Less(where, ints(0)), op.Add(where, op.Shape(self, start=dim, end=dim + 1)), where
    )
    where = op.Expand(where, op.Shape(source))

    def fill(base: ir.Value, value: Any) -> ir.Value:
        """``base`` with every indexed slot set to ``value``."""
        updates = op.Expand(op.CastLike(value, base), op.Shape(source))
        return op.ScatterElements(base, where, updates, axis=dim)

    dtype = ir.DataType(self.dtype) if self.dtype is not None else ir.DataType.FLOAT
    base = self if include_self else fill(self, _identity(reduce, dtype))
    out = op.ScatterElements(base, where, source, axis=dim, reduction=_REDUCTIONS[reduce])
    if reduce != "mean":
        return out
    ones = op.Expand(op.CastLike(1, self), op.Shape(self))
    counts = ones if include_self else fill(ones, 0)
    counts = op.ScatterElements(
        counts, where, op.Expand(op.CastLike(1, self), op.Shape(source)), axis=dim, reduction="add"
    )
    if np.issubdtype(dtype.numpy(), np.floating):
        return op.Div(out, counts)
    return op.Div(op.Sub(out, op.Mod(out, counts)), counts)  # floor division (counts > 0)
