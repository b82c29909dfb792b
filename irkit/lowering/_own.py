"""irkit's own lowerings: only for aten overloads torchlib has no entry for.

Each is small and, where it can, delegates to the torchlib function that does the real work
(``__and__`` *is* ``bitwise_and``). Ops with a generic fallback (CompositeImplicit
decompositions such as ``aten.diff``, in-place ops) are handled by the planner, not here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._own_indexing import indexing_lowerings
from irkit.lowering._own_ordering import ordering_lowerings
from irkit.lowering._own_pool import pool_lowerings
from irkit.lowering._own_rnn import rnn_lowerings
from irkit.lowering._own_scan import scan_lowerings
from irkit.lowering._own_squeeze import squeeze_lowerings
from irkit.lowering._own_vision import vision_lowerings
from irkit.lowering._source import resolve_op

__all__ = ["OwnLowering", "own_lowerings"]


@dataclasses.dataclass(frozen=True)
class OwnLowering:
    """A lowering plus an optional plan-time test of whether it applies to an FX node.

    When ``applies(node)`` is false the planner falls back to decomposing the node.
    """

    fn: Callable[..., Any]
    applies: Callable[[torch.fx.Node], bool] | None = None
    # The lowering returns its input unchanged (eval-mode dropout): as an in-place op's
    # counterpart it mutates nothing, so aliasing never forces functionalization.
    identity: bool = False


def _no_output(*args: Any, **kwargs: Any) -> None:
    """``_assert_tensor_metadata`` and friends check at trace time and compute nothing."""
    return None


_COMPLEX_PARTS = {
    ir.DataType.COMPLEX64: ir.DataType.FLOAT,
    ir.DataType.COMPLEX128: ir.DataType.DOUBLE,
}


def _cast_to(x: ir.Value, dtype: Any = None) -> ir.Value:
    if dtype is None or dtype == -1 or dtype == x.dtype:
        return x  # a no-op conversion emits nothing
    part = _COMPLEX_PARTS.get(ir.DataType(dtype))
    if part is not None:
        # torchlib's complex tensors are real tensors with a trailing (real, imag) dim of 2.
        real = x if x.dtype == part else op.Cast(x, to=int(part))
        last = op.Constant(value=ir.tensor([-1], dtype=ir.DataType.INT64))
        real = op.Unsqueeze(real, last)
        return op.Concat(real, op.Mul(real, op.CastLike(0, real)), axis=-1)
    return op.Cast(x, to=int(dtype))


def _to_dtype(self, dtype=None, non_blocking=False, copy=False, memory_format=None):
    return _cast_to(self, dtype)


def _to_dtype_layout(
    self,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    copy=False,
    memory_format=None,
):
    return _cast_to(self, dtype)


def _to_device(self, device=None, dtype=None, non_blocking=False, copy=False, memory_format=None):
    return _cast_to(self, dtype)


def _to_other(self, other, non_blocking=False, copy=False, memory_format=None):
    return _cast_to(self, other.dtype)


def _batch_norm(native_no_training: Callable[..., Any]) -> Callable[..., Any]:
    def lower(
        input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True
    ):
        return native_no_training(input, weight, bias, running_mean, running_var, momentum, eps)[0]

    return lower


def _batch_norm_applies(node: torch.fx.Node) -> bool:
    training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training", False)
    return training is False and node.args[3] is not None


def _adaptive_avg_pool2d(x: ir.Value, output_size):
    out_h, out_w = output_size
    if (out_h, out_w) == (1, 1):
        return op.GlobalAveragePool(x)
    in_h, in_w = x.shape[-2], x.shape[-1]
    kernel = [in_h // out_h, in_w // out_w]
    return op.AveragePool(x, kernel_shape=kernel, strides=kernel)


def _adaptive_avg_pool2d_applies(node: torch.fx.Node) -> bool:
    """Global pooling, or static input sizes divisible by the output size."""
    out = tuple(node.args[1])
    if out == (1, 1):
        return True
    shape = node.args[0].meta["val"].shape
    return all(
        isinstance(i, int) and isinstance(o, int) and o > 0 and i % o == 0
        for i, o in zip(shape[-2:], out, strict=False)
    )


def _split_sizes(x: ir.Value, split_size: int, dim: int) -> list[int]:
    total = x.shape[dim]
    return [min(split_size, total - start) for start in range(0, total, split_size)]


def _split(x: ir.Value, sizes: list[int], dim: int):
    if len(sizes) == 1:
        return (op.Identity(x),)
    if len(set(sizes)) == 1:
        return op.Split(x, axis=dim, num_outputs=len(sizes))
    return op.Split(x, op.Constant(value=ir.tensor(sizes, dtype=ir.DataType.INT64)), axis=dim)


def _split_tensor(self, split_size, dim=0):
    return _split(self, _split_sizes(self, split_size, dim), dim)


def _split_with_sizes(self, split_sizes, dim=0):
    return _split(self, list(split_sizes), dim)


def _split_tensor_applies(node: torch.fx.Node) -> bool:
    """torchlib emits SplitToSequence; a static size lets us emit a plain multi-output Split."""
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    size = node.args[0].meta["val"].shape[dim]
    return isinstance(size, int) and isinstance(node.args[1], int) and node.args[1] > 0


def _split_with_sizes_applies(node: torch.fx.Node) -> bool:
    return all(isinstance(s, int) for s in node.args[1])


def _dropout_eval(input, p=0.5, train=False):
    return input  # inference: dropout is the identity (torchlib emits a Dropout node)


def _dropout_applies(node: torch.fx.Node) -> bool:
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
    return train is False


def _detach_(input):
    return input  # detach_ changes autograd metadata only: the same values, nothing to mutate


def _conv_no_bias(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """ONNX Conv without its optional bias (torchlib computes an all-zero bias tensor)."""
    spatial = len(weight.shape) - 2

    def per_dim(v: int | list[int]) -> list[int]:  # torch allows one value for every dim
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return v if len(v) == spatial else v * spatial

    pads = per_dim(padding)
    return op.Conv(
        input,
        weight,
        strides=per_dim(stride),
        pads=pads + pads,
        dilations=per_dim(dilation),
        group=groups,
    )


def _conv_no_bias_applies(node: torch.fx.Node) -> bool:
    """Batched input, no bias, numeric padding (not "same"/"valid")."""
    args = dict(zip(("input", "weight", "bias", "stride", "padding"), node.args, strict=False))
    args.update(node.kwargs)
    weight = args["weight"].meta["val"]
    padding = args.get("padding", 0)
    return (
        args.get("bias") is None
        and not isinstance(padding, str)
        and args["input"].meta["val"].dim() == weight.dim()
    )


def _swap_last_two(transpose: Callable[..., Any]) -> Callable[..., Any]:
    def lower(self):
        return transpose(self, -2, -1)

    return lower


def _is_real(node: torch.fx.Node) -> bool:
    """torchlib writes ``mT``/``mH`` as an ``Einsum``, which has no bool kernel; a real tensor's
    ``mT`` (and ``mH``) is a ``Transpose`` of the last two dims, for every dtype."""
    return not node.args[0].meta["val"].dtype.is_complex


def _resize(self, size, memory_format=None):
    return op.Reshape(self, list(size))


def _resize_applies(node: torch.fx.Node) -> bool:
    """Static sizes that keep the element count: ``resize`` is a reshape (otherwise torch hands
    back uninitialized memory, which no graph reproduces)."""
    size, val = node.args[1], node.args[0].meta["val"]
    return (
        all(isinstance(s, int) for s in size)
        and isinstance(val.numel(), int)
        and (math.prod(size) == val.numel())
    )


def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """``out[r] = self[r] @ mat2[g] (+ bias[g])`` for the rows ``offs[g-1] <= r < offs[g]``.

    The ragged (mixture-of-experts) form of ``aten._grouped_mm``: ``self`` is ``(S, K)`` with its
    rows sorted by group, ``mat2`` is ``(G, K, N)`` and ``offs`` holds each group's end row. The
    number of groups is static, so this is one ``Slice``/``MatMul`` per group and a ``Concat``;
    rows past the last offset are zero, as in torch's kernel.
    """
    groups = mat2.shape[0]
    zero = op.Constant(value=ir.tensor([0], dtype=ir.DataType.INT64))
    ends = op.Cast(offs, to=int(ir.DataType.INT64))
    group_ends = op.Split(ends, axis=0, num_outputs=groups) if groups > 1 else (ends,)
    weights = op.Split(mat2, axis=0, num_outputs=groups) if groups > 1 else (mat2,)
    biases = None
    if bias is not None:
        biases = op.Split(bias, axis=0, num_outputs=groups) if groups > 1 else (bias,)
    parts, start = [], zero
    for g in range(groups):
        rows = op.Slice(self, start, group_ends[g], zero)
        out = op.MatMul(rows, op.Squeeze(weights[g], zero))
        if biases is not None:
            out = op.Add(out, op.Squeeze(biases[g], zero))
        parts.append(out)
        start = group_ends[g]
    # Rows after the last group: zeros of shape (S - offs[-1], N).
    tail_rows = op.Sub(op.Shape(self, start=0, end=1), start)
    cols = op.Shape(mat2, start=2, end=3)
    tail = op.Expand(op.CastLike(0, parts[0]), op.Concat(tail_rows, cols, axis=0))
    result = op.Concat(*parts, tail, axis=0)
    return _cast_to(result, out_dtype)


def _grouped_mm_applies(node: torch.fx.Node) -> bool:
    """Ragged rows (2-D ``self``, 3-D ``mat2``, ``offs`` given) with a static group count;
    torchlib covers the dense forms."""
    args = dict(zip(("self", "mat2", "offs"), node.args, strict=False))
    args.update(node.kwargs)
    a, b, offs = (
        args.get("self", args.get("input")),
        args.get("mat2", args.get("weight")),
        args.get("offs"),
    )
    if not all(isinstance(v, torch.fx.Node) for v in (a, b, offs)):
        return False
    a_val, b_val = a.meta["val"], b.meta["val"]
    return a_val.dim() == 2 and b_val.dim() == 3 and isinstance(b_val.shape[0], int)


def _grouped_mm_fallback(input, weight, offs):
    return _grouped_mm(input, weight, offs)


# Custom ops of libraries that compute exactly an aten op irkit lowers, by registered name (the
# library is never imported here; an op that is not registered is simply absent).
# transformers' MoE experts call ``transformers::grouped_mm_fallback`` (a Python loop over the
# data-dependent expert offsets, which no trace can follow) where ``aten._grouped_mm`` is unusable.
_LIBRARY_OPS: Mapping[str, OwnLowering] = {
    "transformers::grouped_mm_fallback": OwnLowering(_grouped_mm_fallback, _grouped_mm_applies),
    **{name: OwnLowering(fn) for name, fn in vision_lowerings().items()},
}


def _hypot(self, other):
    return op.Sqrt(op.Add(op.Mul(self, self), op.Mul(other, other)))


def _signbit(self):
    """``x < 0``, and for floats also ``-0.0`` (``1 / -0.0 = -inf``), compared with a scalar zero
    so a 0-d input stays 0-d (torchlib compares with ``[0]`` and misses ``-0.0``). The sign bit
    of a NaN is not observable with ONNX ops: a NaN counts as positive."""
    if self.dtype == ir.DataType.BOOL:
        return op.ConstantOfShape(op.Shape(self), value=ir.tensor([False]))
    zero = op.CastLike(0, self)
    negative = op.Less(self, zero)
    if not self.dtype.is_floating_point():
        return negative
    negative_zero = op.And(op.Equal(self, zero), op.Less(op.Reciprocal(self), zero))
    return op.Or(negative, negative_zero)


def _nan_ignoring(pick: Callable[..., Any]) -> Callable[..., Any]:
    """``fmax``/``fmin``: ``max``/``min`` where a NaN loses against a number."""

    def lower(self, other):
        both = pick(self, other)
        if not self.dtype.is_floating_point():
            return both
        return op.Where(op.IsNaN(self), other, op.Where(op.IsNaN(other), self, both))

    return lower


def _uniform(self, from_=0.0, to=1.0, *, generator=None, **kwargs):
    low, high = kwargs.get("from", from_), to
    return op.RandomUniformLike(self, low=float(low), high=float(high))


def _is_float(node: torch.fx.Node) -> bool:
    return node.args[0].meta["val"].dtype.is_floating_point


_SCATTER_REDUCTIONS = {"add": "add", "multiply": "mul"}


def _scatter_reduce(self, dim, index, src, *, reduce):
    if not isinstance(src, ir.Value):  # scatter.value_reduce: a scalar for every index
        src = op.Expand(op.CastLike(src, self), op.Shape(index))
    return op.ScatterElements(self, index, src, axis=dim, reduction=_SCATTER_REDUCTIONS[reduce])


def _scatter_reduce_applies(node: torch.fx.Node) -> bool:
    return node.kwargs.get("reduce") in _SCATTER_REDUCTIONS


def _symbolic(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A ``torch.sym_*`` function on symbolic scalars (0-d tensors) and Python numbers."""

    def lower(*args: Any) -> Any:
        like = next((a for a in args if isinstance(a, ir.Value)), None)
        values = [
            a if isinstance(a, ir.Value) or like is None else op.CastLike(a, like) for a in args
        ]
        return fn(*values)

    return lower


def _sym_float(a: Any) -> Any:
    # torch computes a SymFloat in double; the dtype reconciliation casts to the node's dtype.
    return op.Cast(a, to=int(ir.DataType.DOUBLE))


def _sym_ite(condition: Any, then: Any, otherwise: Any) -> Any:
    return op.Where(condition, then, otherwise)


def _sym_sum(values: Any) -> Any:
    return op.Sum(*values) if len(values) > 1 else op.Identity(values[0])


def own_lowerings(
    torchlib: Mapping[torch._ops.OpOverload, Callable[..., Any]],
) -> dict[Any, OwnLowering]:
    """The table of irkit's own lowerings, delegating to ``torchlib``'s functions where it can."""
    aten = torch.ops.aten
    table = {
        aten._assert_tensor_metadata.default: OwnLowering(_no_output),
        aten._assert_scalar.default: OwnLowering(_no_output),
        aten._assert_async.default: OwnLowering(_no_output),
        aten._assert_async.msg: OwnLowering(_no_output),
        aten.sym_constrain_range_for_size.default: OwnLowering(_no_output),
        aten.to.dtype: OwnLowering(_to_dtype),
        aten.to.dtype_layout: OwnLowering(_to_dtype_layout),
        aten.to.device: OwnLowering(_to_device),
        aten.to.other: OwnLowering(_to_other),
        # Python's & | ^ on tensors are the bitwise ops (logical on bool).
        aten.__and__.Tensor: OwnLowering(torchlib[aten.bitwise_and.Tensor]),
        aten.__or__.Tensor: OwnLowering(torchlib[aten.bitwise_or.Tensor]),
        aten.__xor__.Tensor: OwnLowering(torchlib[aten.bitwise_xor.Tensor]),
        aten.split.Tensor: OwnLowering(_split_tensor, _split_tensor_applies),
        aten.split_with_sizes.default: OwnLowering(_split_with_sizes, _split_with_sizes_applies),
        aten.dropout.default: OwnLowering(_dropout_eval, _dropout_applies, identity=True),
        # transformers' DynamicCache detaches empty placeholder constants in place: no
        # functionalization (a re-trace of the whole program) for that.
        aten.detach_.default: OwnLowering(_detach_, identity=True),
        aten.conv1d.default: OwnLowering(_conv_no_bias, _conv_no_bias_applies),
        aten.conv2d.default: OwnLowering(_conv_no_bias, _conv_no_bias_applies),
        aten.conv3d.default: OwnLowering(_conv_no_bias, _conv_no_bias_applies),
        aten.batch_norm.default: OwnLowering(
            _batch_norm(torchlib[aten._native_batch_norm_legit_no_training.default]),
            _batch_norm_applies,
        ),
        aten.mT.default: OwnLowering(_swap_last_two(torchlib[aten.transpose.int]), _is_real),
        aten.mH.default: OwnLowering(_swap_last_two(torchlib[aten.transpose.int]), _is_real),
        aten.resize.default: OwnLowering(_resize, _resize_applies),
        aten.adaptive_avg_pool2d.default: OwnLowering(
            _adaptive_avg_pool2d, _adaptive_avg_pool2d_applies
        ),
        aten._grouped_mm.default: OwnLowering(_grouped_mm, _grouped_mm_applies),
        aten.hypot.default: OwnLowering(_hypot),
        aten.signbit.default: OwnLowering(_signbit),
        aten.fmax.default: OwnLowering(_nan_ignoring(op.Max)),
        aten.fmin.default: OwnLowering(_nan_ignoring(op.Min)),
        aten.uniform.default: OwnLowering(_uniform, _is_float),
        aten.scatter.reduce: OwnLowering(_scatter_reduce, _scatter_reduce_applies),
        aten.scatter.value_reduce: OwnLowering(_scatter_reduce, _scatter_reduce_applies),
    }
    # Python's min()/max()/float()/not/if on symbolic sizes, recorded as torch.sym_* calls.
    table[torch.sym_min] = OwnLowering(_symbolic(op.Min))
    table[torch.sym_max] = OwnLowering(_symbolic(op.Max))
    table[torch.sym_not] = OwnLowering(_symbolic(op.Not))
    table[torch.sym_float] = OwnLowering(_sym_float)
    table[torch.sym_ite] = OwnLowering(_symbolic(_sym_ite))
    table[torch.sym_sum] = OwnLowering(_sym_sum)
    for target, (fn, applies) in ordering_lowerings(torchlib).items():
        table[target] = OwnLowering(fn, applies)
    for target, (fn, applies) in indexing_lowerings(torchlib).items():
        table[target] = OwnLowering(fn, applies)
    for target, (fn, applies) in scan_lowerings().items():
        table[target] = OwnLowering(fn, applies)
    for target, (fn, applies) in squeeze_lowerings().items():
        table[target] = OwnLowering(fn, applies)
    for target, (fn, applies) in pool_lowerings().items():
        table[target] = OwnLowering(fn, applies)
    for target, (fn, applies) in rnn_lowerings().items():
        table[target] = OwnLowering(fn, applies)
    for name, lowering in _LIBRARY_OPS.items():
        target = resolve_op(name)
        if target is not None:
            table[target] = lowering
    return table
