"""irkit's own lowerings of the pooling ops neither torchlib nor torch's decompositions cover.

* ``adaptive_max_pool2d`` / ``adaptive_max_pool3d`` (``adaptive_max_pool1d`` decomposes into the
  2-D one) when an input size is not a multiple of the output size — torch's decompositions stop
  at the evenly dividing case — and ``_adaptive_avg_pool3d`` (no decomposition at all). Torch's
  bin ``i`` of ``out`` over ``n`` inputs is ``[floor(i·n/out), ceil((i+1)·n/out))``.
* ``fractional_max_pool2d`` / ``fractional_max_pool3d`` with the ``random_samples`` input (one
  sample in ``[0, 1)`` per batch, channel and spatial dim; the module's ``_random_samples``
  buffer, or torch's own draw — either way an input of the op, so the lowering is exact). Window
  ``i`` of ``out`` windows of size ``k`` over ``n`` starts at ``int((i + u)·α) − int(u·α)`` with
  ``α = (n − k) / (out − 1)`` in the input's dtype, the last at ``n − k`` (torch's
  ``generate_intervals``).
* ``avg_pool2d`` / ``avg_pool3d`` with ``divisor_override`` (torchlib ignores it: wrong numbers):
  the window sum — a ``Conv`` of each plane with a ones kernel; zero padding adds nothing — over
  the divisor.

A box max (or mean) is separable: each spatial dim is reduced in turn, last to first, by
gathering its windows as a new trailing axis ``(…, out, k)`` and reducing that axis. Bins of
unequal length are padded to the longest by repeating their last element (max) or weighted by
``1/length`` and zero (mean). The indices torch returns are flat positions in the input's
spatial plane (``h·W + w``); reducing last dim first, the first maximum along each dim, gives
torch's row-major first maximum. A NaN in a window does not propagate as in torch (whose kernel
takes every NaN it meets): onnxruntime's ``ArgMax`` has no NaN rule.

Input sizes of the pooled dims must be static (the bins are constants); otherwise the planner
falls back to torch's decompositions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._own_common import INT64, ints
from irkit.lowering._registration import own

__all__: list[str] = []  # (lowerings registered with @own, collected by _own.own_lowerings)

aten = torch.ops.aten


def _const(array: np.ndarray) -> ir.Value:
    return op.Constant(value=ir.tensor(array))


def _perm_to_last(rank: int, axis: int) -> tuple[list[int], list[int]]:
    perm = [a for a in range(rank) if a != axis] + [axis]
    return perm, [perm.index(a) for a in range(rank)]


def _take_max(
    windows: Callable[[ir.Value], ir.Value], values: ir.Value, flat: ir.Value | None
) -> tuple[ir.Value, ir.Value, ir.Value | None]:
    """Max over the windows of the last axis: ``(values, k, flat at k)``, each ``(…, out)``, with
    ``k`` the first maximum's offset in its window (``ArgMax`` keeps the first)."""
    win = windows(values)  # (…, out, k)
    k = op.ArgMax(win, axis=-1, keepdims=1)
    best = op.Squeeze(op.GatherElements(win, k, axis=-1), ints(-1))
    inner = (
        None if flat is None else op.Squeeze(op.GatherElements(windows(flat), k, axis=-1), ints(-1))
    )
    return best, op.Squeeze(k, ints(-1)), inner


def _max_pool_separable(
    x: ir.Value,
    rank: int,
    axes: Sequence[int],
    sizes: Sequence[int],
    windows_for: Callable[[int, ir.Value], Callable[[ir.Value], ir.Value]],
    starts_for: Callable[[int, ir.Value], ir.Value],
) -> tuple[ir.Value, ir.Value]:
    """Window max over ``axes`` (last first) and the flat spatial index of each maximum.

    ``windows_for(i, v)`` gives a function gathering the windows of dim ``axes[i]`` (moved last
    in ``v``), ``starts_for(i, v)`` the windows' start positions, broadcastable to ``(…, out)``.
    """
    values: ir.Value = x
    flat: ir.Value | None = None  # flat positions over the dims reduced so far
    stride = 1
    for i in reversed(range(len(axes))):
        perm, back = _perm_to_last(rank, axes[i])
        v = op.Transpose(values, perm=perm)
        f = None if flat is None else op.Transpose(flat, perm=perm)
        best, k, inner = _take_max(windows_for(i, v), v, f)
        position = op.Add(k, starts_for(i, v))
        here = position if stride == 1 else op.Mul(position, ints(stride))
        values = op.Transpose(best, perm=back)
        flat = op.Transpose(here if inner is None else op.Add(inner, here), perm=back)
        stride *= sizes[i]
    if flat is None:
        raise ValueError("no pooled dims")
    return values, flat


# ----------------------------------------------------------------------------------------------
# Adaptive pooling: bins shared by every batch and channel (constants)


def _bins(n: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Torch's adaptive bins ``[floor(i·n/out), ceil((i+1)·n/out))``: starts and lengths."""
    starts = np.array([(i * n) // out for i in range(out)], dtype=np.int64)
    ends = np.array([-((-(i + 1) * n) // out) for i in range(out)], dtype=np.int64)
    return starts, ends - starts


def _bin_index(n: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """``(out, k)`` positions of each bin padded by repeating its last one, and the valid mask."""
    starts, lengths = _bins(n, out)
    k = int(lengths.max())
    offsets = np.arange(k, dtype=np.int64)
    index = starts[:, None] + np.minimum(offsets[None, :], lengths[:, None] - 1)
    return index, offsets[None, :] < lengths[:, None]


def _adaptive_max(spatial: int) -> Callable[..., Any]:
    def lower(self, output_size):
        rank = len(self.shape)
        axes = list(range(rank - spatial, rank))
        sizes = [int(self.shape[a]) for a in axes]
        index = [_bin_index(n, out)[0] for n, out in zip(sizes, output_size, strict=True)]
        starts = [_bins(n, out)[0] for n, out in zip(sizes, output_size, strict=True)]
        return _max_pool_separable(
            self,
            rank,
            axes,
            sizes,
            lambda i, _v: lambda t: op.Gather(t, _const(index[i]), axis=-1),
            lambda i, _v: _const(starts[i]),
        )

    return lower


def _adaptive_avg(spatial: int) -> Callable[..., Any]:
    def lower(self, output_size):
        rank = len(self.shape)
        sizes = [int(self.shape[a]) for a in range(rank - spatial, rank)]
        if all(n % out == 0 for n, out in zip(sizes, output_size, strict=True)):
            kernel = [n // out for n, out in zip(sizes, output_size, strict=True)]
            return op.AveragePool(self, kernel_shape=kernel, strides=kernel)
        values = self
        for axis, n, out in zip(range(rank - spatial, rank), sizes, output_size, strict=True):
            index, valid = _bin_index(n, out)
            weights = valid / valid.sum(axis=1, keepdims=True)
            perm, back = _perm_to_last(rank, axis)
            win = op.Gather(op.Transpose(values, perm=perm), _const(index), axis=-1)
            weight = op.CastLike(_const(weights), win)
            mean = op.ReduceSum(op.Mul(win, weight), ints(-1), keepdims=0)
            values = op.Transpose(mean, perm=back)
        return values

    return lower


def _static_spatial(spatial: int) -> Callable[[torch.fx.Node], bool]:
    def applies(node: torch.fx.Node) -> bool:
        shape = node.args[0].meta["val"].shape
        out = list(node.args[1])
        return len(shape) > spatial and all(
            isinstance(n, int) and isinstance(o, int) and n > 0 and o > 0
            for n, o in zip(shape[-spatial:], out, strict=True)
        )

    return applies


def _uneven_max(spatial: int) -> Callable[[torch.fx.Node], bool]:
    """Static sizes, some not a multiple of the output (torch decomposes the rest)."""
    static = _static_spatial(spatial)

    def applies(node: torch.fx.Node) -> bool:
        if not static(node):
            return False
        shape, out = node.args[0].meta["val"].shape[-spatial:], list(node.args[1])
        return any(n % o for n, o in zip(shape, out, strict=True)) and math.prod(out) > 1

    return applies


_adaptive_max_pool2d = own(aten.adaptive_max_pool2d.default, applies=_uneven_max(2))(
    _adaptive_max(2)
)
_adaptive_max_pool3d = own(aten.adaptive_max_pool3d.default, applies=_uneven_max(3))(
    _adaptive_max(3)
)
_adaptive_avg_pool3d = own(aten._adaptive_avg_pool3d.default, applies=_static_spatial(3))(
    _adaptive_avg(3)
)


# ----------------------------------------------------------------------------------------------
# Fractional max pooling: window starts per batch and channel, from the random samples


def _fractional_starts(u: ir.Value, n: int, out: int, k: int) -> ir.Value:
    """``(…, out)`` window starts for samples ``u`` of shape ``(…, 1)`` (torch's
    ``generate_intervals``, in the samples' dtype)."""
    if out == 1:
        return op.Expand(ints(n - k), op.Shape(u))
    dtype = u.dtype.numpy()
    alpha = np.asarray(dtype.type(n - k) / dtype.type(out - 1), dtype=dtype)
    steps = _const(np.arange(out - 1, dtype=dtype))
    scaled = op.Floor(op.Mul(op.Add(steps, u), _const(alpha)))
    first = op.Floor(op.Mul(u, _const(alpha)))
    starts = op.Cast(op.Sub(scaled, first), to=int(INT64))
    last = op.Expand(ints(n - k), op.Shape(u))
    return op.Concat(starts, last, axis=-1)


def _fractional(spatial: int) -> Callable[..., Any]:
    def lower(self, kernel_size, output_size, random_samples):
        batched = len(self.shape) == spatial + 2
        x = self if batched else op.Unsqueeze(self, ints(0))
        rank = spatial + 2
        axes = list(range(2, rank))
        sizes = [int(self.shape[a - rank]) for a in axes]
        kernel = list(kernel_size) if len(kernel_size) == spatial else list(kernel_size) * spatial
        # random_samples: (N, C, spatial), sample j for spatial dim j (torch: [W, H] in 2-D,
        # [T, H, W] in 3-D).
        order = [1, 0] if spatial == 2 else [0, 1, 2]
        middle = list(range(2, spatial + 1))  # the other spatial dims, between (N, C) and last
        # torch reads the first N rows of the samples (N = 1 without a batch dim).
        random_samples = op.Slice(random_samples, ints(0), op.Shape(x, start=0, end=1), ints(0))
        starts = []
        for i, (n, out, k) in enumerate(zip(sizes, output_size, kernel, strict=True)):
            j = order[i]
            u = op.Slice(random_samples, ints(j), ints(j + 1), ints(2))  # (N, C, 1)
            s = _fractional_starts(u, n, out, k)  # (N, C, out)
            starts.append(op.Unsqueeze(s, ints(*middle)) if middle else s)

        def windows_for(i: int, v: ir.Value) -> Callable[[ir.Value], ir.Value]:
            out, k = output_size[i], kernel[i]
            positions = op.Add(
                op.Unsqueeze(starts[i], ints(-1)), _const(np.arange(k, dtype=np.int64))
            )  # (N, C, 1…, out, k)
            flat_positions = op.Reshape(positions, ints(*([0] * (rank - 1)), out * k))
            target = op.Concat(op.Shape(v, end=-1), ints(out * k), axis=0)
            index = op.Expand(flat_positions, target)

            def gather(t: ir.Value) -> ir.Value:
                picked = op.GatherElements(t, index, axis=-1)
                return op.Reshape(picked, ints(*([0] * (rank - 1)), out, k))

            return gather

        values, indices = _max_pool_separable(
            x, rank, axes, sizes, windows_for, lambda i, _v: starts[i]
        )
        if not batched:
            values, indices = op.Squeeze(values, ints(0)), op.Squeeze(indices, ints(0))
        return values, indices

    return lower


def _fractional_applies(spatial: int) -> Callable[[torch.fx.Node], bool]:
    def applies(node: torch.fx.Node) -> bool:
        shape = node.args[0].meta["val"].shape
        return len(shape) in (spatial + 1, spatial + 2) and all(
            isinstance(n, int) for n in shape[-spatial:]
        )

    return applies


_fractional_max_pool2d = own(aten.fractional_max_pool2d.default, applies=_fractional_applies(2))(
    _fractional(2)
)
_fractional_max_pool3d = own(aten.fractional_max_pool3d.default, applies=_fractional_applies(3))(
    _fractional(3)
)


# ----------------------------------------------------------------------------------------------
# Average pooling with divisor_override: a window sum (a Conv with a ones kernel) / the divisor


def _pool_output_size(n: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    """torch's ``pooling_output_shape`` (dilation 1)."""
    out = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _avg_pool_divisor(spatial: int) -> Callable[..., Any]:
    def lower(
        self,
        kernel_size,
        stride=(),
        padding=0,
        ceil_mode=False,
        count_include_pad=True,
        divisor_override=None,
    ):
        rank = len(self.shape)
        sizes = [int(n) for n in self.shape[rank - spatial :]]
        kernel = _expand(kernel_size, spatial)
        strides = _expand(stride, spatial) if stride else kernel
        pads = _expand(padding, spatial)
        outs = [
            _pool_output_size(n, k, st, pd, ceil_mode)
            for n, k, st, pd in zip(sizes, kernel, strides, pads, strict=True)
        ]
        # Zero padding adds nothing to a sum: pad the end so that the last (ceil-mode) window fits.
        ends = [
            max(0, (o - 1) * st + k - n - pd)
            for o, st, k, n, pd in zip(outs, strides, kernel, sizes, pads, strict=True)
        ]
        planes = op.Reshape(self, ints(-1, 1, *sizes))
        ones = op.CastLike(_const(np.ones([1, 1, *kernel], dtype=np.float32)), self)
        total = op.Conv(planes, ones, kernel_shape=kernel, strides=strides, pads=pads + ends)
        leading = op.Shape(self, start=0, end=rank - spatial)
        total = op.Reshape(total, op.Concat(leading, ints(*outs), axis=0))
        return op.Div(total, op.CastLike(divisor_override, self))

    return lower


def _expand(value: Any, spatial: int) -> list[int]:
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    return values * spatial if len(values) == 1 else values


def _divisor_given(spatial: int) -> Callable[[torch.fx.Node], bool]:
    """``divisor_override`` given (torchlib ignores it), a float input, static pooled sizes."""

    def applies(node: torch.fx.Node) -> bool:
        args = list(node.args) + [None] * 7
        divisor = node.kwargs.get("divisor_override", args[6])
        val = node.args[0].meta["val"]
        return (
            divisor is not None
            and val.dtype.is_floating_point
            and all(isinstance(n, int) for n in val.shape[-spatial:])
        )

    return applies


_avg_pool2d = own(aten.avg_pool2d.default, applies=_divisor_given(2))(_avg_pool_divisor(2))
_avg_pool3d = own(aten.avg_pool3d.default, applies=_divisor_given(3))(_avg_pool_divisor(3))
