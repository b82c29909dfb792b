"""irkit's own lowerings: only for aten overloads torchlib has no entry for (or covers badly).

Each is small, registered where it is defined (``@own``, :mod:`irkit.lowering._registration`),
and, where it can, delegates to the torchlib function that does the real work (``_is_all_true``
*is* ``all``). Ops with a generic fallback (CompositeImplicit decompositions such as
``aten.diff``, in-place ops) are handled by the planner, not here. :func:`own_lowerings` collects
the records of this module and of the ``_own_*`` modules.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering import (
    _own_attention,
    _own_copy,
    _own_indexing,
    _own_integer,
    _own_ordering,
    _own_pool,
    _own_rnn,
    _own_scan,
    _own_special,
    _own_squeeze,
    _own_vision,
)
from irkit.lowering._registration import OwnLowering, collect, own, torchlib, torchlib_gap

__all__ = ["OwnLowering", "own_lowerings"]

aten = torch.ops.aten


@own(aten._assert_tensor_metadata.default, complex=True)
@own(aten._assert_scalar.default, complex=True)
@own(aten._assert_async.default, complex=True)
@own(aten._assert_async.msg, complex=True)
@own(aten.sym_constrain_range.default, complex=True)
@own(aten.sym_constrain_range_for_size.default, complex=True)
def _no_output(*args: Any, **kwargs: Any) -> None:
    """Runtime assertions (``torch._check``, ``torch._assert_async``, ``_check_is_size``) and
    ``_assert_tensor_metadata``: torch checked them while tracing; they compute nothing and are
    dropped (the values they read are computed as usual, and removed by ``irkit.optimize``
    when nothing else reads them)."""
    return None


# ``torch.all``/``torch.any`` of a bool tensor into one bool, as ``if not torch.all(...)`` traces:
# values (an assertion reads them through ``item``), so lowered, not dropped.
_IS_ALL_TRUE = OwnLowering(aten._is_all_true.default, torchlib("aten::all"))
_IS_ANY_TRUE = OwnLowering(aten._is_any_true.default, torchlib("aten::any"))


@own(aten._functional_assert_async.msg)
@own(aten._functional_assert_scalar.default)
@own(aten._functional_sym_constrain_range.default)
@own(aten._functional_sym_constrain_range_for_size.default)
def _pass_token(self: Any, *args: Any) -> ir.Value:
    """The functional assertions return their effect token (the last argument) unchanged."""
    token: ir.Value = args[-1]
    return op.Identity(token)


@own(aten._make_dep_token.default)
def _dep_token(**kwargs: Any) -> ir.Value:
    """The effect token the functional assertions thread: an empty float scalar, as in torch."""
    return op.Constant(value=ir.tensor(0.0, dtype=ir.DataType.FLOAT))


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


@own(aten.to.dtype)
def _to_dtype(self, dtype=None, non_blocking=False, copy=False, memory_format=None):
    return _cast_to(self, dtype)


@own(aten.to.dtype_layout)
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


@own(aten.to.device)
def _to_device(self, device=None, dtype=None, non_blocking=False, copy=False, memory_format=None):
    return _cast_to(self, dtype)


@own(aten.to.other)
def _to_other(self, other, non_blocking=False, copy=False, memory_format=None):
    return _cast_to(self, other.dtype)


def _batch_norm_applies(node: torch.fx.Node) -> bool:
    training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training", False)
    return training is False and node.args[3] is not None


@own(aten.batch_norm.default, applies=_batch_norm_applies)
def _batch_norm(
    input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True
):
    native = torchlib("aten::_native_batch_norm_legit_no_training")
    return native(input, weight, bias, running_mean, running_var, momentum, eps)[0]


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


@own(aten.adaptive_avg_pool2d.default, applies=_adaptive_avg_pool2d_applies)
def _adaptive_avg_pool2d(x: ir.Value, output_size):
    out_h, out_w = output_size
    if (out_h, out_w) == (1, 1):
        return op.GlobalAveragePool(x)
    in_h, in_w = x.shape[-2], x.shape[-1]
    kernel = [in_h // out_h, in_w // out_w]
    return op.AveragePool(x, kernel_shape=kernel, strides=kernel)


def _split_sizes(x: ir.Value, split_size: int, dim: int) -> list[int]:
    total = x.shape[dim]
    return [min(split_size, total - start) for start in range(0, total, split_size)]


def _split(x: ir.Value, sizes: list[int], dim: int):
    if len(sizes) == 1:
        return (op.Identity(x),)
    if len(set(sizes)) == 1:
        return op.Split(x, axis=dim, num_outputs=len(sizes))
    return op.Split(x, op.Constant(value=ir.tensor(sizes, dtype=ir.DataType.INT64)), axis=dim)


def _split_tensor_applies(node: torch.fx.Node) -> bool:
    """torchlib emits SplitToSequence; a static size lets us emit a plain multi-output Split."""
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    size = node.args[0].meta["val"].shape[dim]
    return isinstance(size, int) and isinstance(node.args[1], int) and node.args[1] > 0


def _split_with_sizes_applies(node: torch.fx.Node) -> bool:
    return all(isinstance(s, int) for s in node.args[1])


@own(aten.split.Tensor, applies=_split_tensor_applies)
def _split_tensor(self, split_size, dim=0):
    return _split(self, _split_sizes(self, split_size, dim), dim)


@own(aten.split_with_sizes.default, applies=_split_with_sizes_applies)
def _split_with_sizes(self, split_sizes, dim=0):
    return _split(self, list(split_sizes), dim)


def _dropout_applies(node: torch.fx.Node) -> bool:
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
    return train is False


@own(aten.dropout.default, applies=_dropout_applies, identity=True, complex=True)
def _dropout_eval(input, p=0.5, train=False):
    return input  # inference: dropout is the identity (torchlib emits a Dropout node)


# transformers' DynamicCache detaches empty placeholder constants in place: no
# functionalization (a re-trace of the whole program) for that.
@own(aten.detach_.default, identity=True, complex=True)
def _detach_(input):
    return input  # detach_ changes autograd metadata only: the same values, nothing to mutate


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


@own(aten.conv1d.default, applies=_conv_no_bias_applies)
@own(aten.conv2d.default, applies=_conv_no_bias_applies)
@own(aten.conv3d.default, applies=_conv_no_bias_applies)
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


def _is_real(node: torch.fx.Node) -> bool:
    """torchlib writes ``mT``/``mH`` as an ``Einsum``, which has no bool kernel; a real tensor's
    ``mT`` (and ``mH``) is a ``Transpose`` of the last two dims, for every dtype."""
    return not node.args[0].meta["val"].dtype.is_complex


@own(aten.mT.default, applies=_is_real)
@own(aten.mH.default, applies=_is_real)
def _swap_last_two(self):
    return torchlib("aten::transpose.int")(self, -2, -1)


def _resize_applies(node: torch.fx.Node) -> bool:
    """Static sizes that keep the element count: ``resize`` is a reshape (otherwise torch hands
    back uninitialized memory, which no graph reproduces)."""
    size, val = node.args[1], node.args[0].meta["val"]
    return (
        all(isinstance(s, int) for s in size)
        and isinstance(val.numel(), int)
        and (math.prod(size) == val.numel())
    )


@own(aten.resize.default, applies=_resize_applies)
def _resize(self, size, memory_format=None):
    return op.Reshape(self, list(size))


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


@own(aten._grouped_mm.default, applies=_grouped_mm_applies)
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


# Custom ops of libraries that compute exactly an aten op irkit lowers, by registered name (the
# library is never imported here; an op that is not registered is simply absent).
# transformers' MoE experts call ``transformers::grouped_mm_fallback`` (a Python loop over the
# data-dependent expert offsets, which no trace can follow) where ``aten._grouped_mm`` is unusable.
@own("transformers::grouped_mm_fallback", applies=_grouped_mm_applies)
def _grouped_mm_fallback(input, weight, offs):
    return _grouped_mm(input, weight, offs)


@own(aten.hypot.default)
def _hypot(self, other):
    return op.Sqrt(op.Add(op.Mul(self, self), op.Mul(other, other)))


@own(aten.signbit.default)
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


_fmax = own(aten.fmax.default)(_nan_ignoring(op.Max))
_fmin = own(aten.fmin.default)(_nan_ignoring(op.Min))


def _is_float(node: torch.fx.Node) -> bool:
    return node.args[0].meta["val"].dtype.is_floating_point


@own(aten.uniform.default, applies=_is_float)
def _uniform(self, from_=0.0, to=1.0, *, generator=None, **kwargs):
    low, high = kwargs.get("from", from_), to
    return op.RandomUniformLike(self, low=float(low), high=float(high))


_SCATTER_REDUCTIONS = {"add": "add", "multiply": "mul"}


def _scatter_reduce_applies(node: torch.fx.Node) -> bool:
    return node.kwargs.get("reduce") in _SCATTER_REDUCTIONS


@own(aten.scatter.reduce, applies=_scatter_reduce_applies)
@own(aten.scatter.value_reduce, applies=_scatter_reduce_applies)
def _scatter_reduce(self, dim, index, src, *, reduce):
    if not isinstance(src, ir.Value):  # scatter.value_reduce: a scalar for every index
        src = op.Expand(op.CastLike(src, self), op.Shape(index))
    return op.ScatterElements(self, index, src, axis=dim, reduction=_SCATTER_REDUCTIONS[reduce])


def _symbolic(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A ``torch.sym_*`` function on symbolic scalars (0-d tensors) and Python numbers."""

    def lower(*args: Any) -> Any:
        like = next((a for a in args if isinstance(a, ir.Value)), None)
        values = [
            a if isinstance(a, ir.Value) or like is None else op.CastLike(a, like) for a in args
        ]
        return fn(*values)

    return lower


# Python's min()/max()/not/if on symbolic sizes, recorded as torch.sym_* calls.
_sym_min = own(torch.sym_min)(_symbolic(op.Min))
_sym_max = own(torch.sym_max)(_symbolic(op.Max))
_sym_not = own(torch.sym_not)(_symbolic(op.Not))


@own(torch.sym_float)
def _sym_float(a: Any) -> Any:
    # torch computes a SymFloat in double; the dtype reconciliation casts to the node's dtype.
    return op.Cast(a, to=int(ir.DataType.DOUBLE))


def _sym_ite(condition: Any, then: Any, otherwise: Any) -> Any:
    return op.Where(condition, then, otherwise)


_sym_ite_lowering = own(torch.sym_ite)(_symbolic(_sym_ite))


@own(torch.sym_sum)
def _sym_sum(values: Any) -> Any:
    return op.Sum(*values) if len(values) > 1 else op.Identity(values[0])


# torchlib lowerings that do not cover some arguments: when the predicate holds, the node takes
# the next way (torch's decompositions) instead of an ONNX op no runtime can run.


@torchlib_gap(aten.cross_entropy_loss.default)
def _cross_entropy_gap(node: torch.fx.Node) -> bool:
    """``cross_entropy_loss`` that torchlib's ``SoftmaxCrossEntropyLoss`` cannot carry: class
    probabilities (a float target: labels are class indices only, no kernel), label smoothing
    (ignored: wrong numbers) or an input without a batch dim (the op needs ``(N, C, ...)``:
    onnxruntime refuses the file). torch's decomposition (``log_softmax`` and ``nll_loss`` or
    the probabilities) lowers instead."""
    names = ("self", "target", "weight", "reduction", "ignore_index", "label_smoothing")
    args = dict(zip(names, node.args, strict=False))
    args.update(node.kwargs)
    target, scores = args.get("target"), args.get("self")
    value = target.meta.get("val") if isinstance(target, torch.fx.Node) else None
    rank = scores.meta["val"].dim() if isinstance(scores, torch.fx.Node) else 2
    return (
        (isinstance(value, torch.Tensor) and value.is_floating_point())
        or args.get("label_smoothing", 0.0) != 0.0
        or rank < 2
    )


_MODULES = (
    sys.modules[__name__],
    _own_attention,
    _own_copy,
    _own_indexing,
    _own_ordering,
    _own_pool,
    _own_integer,
    _own_rnn,
    _own_scan,
    _own_special,
    _own_squeeze,
    _own_vision,
)


def own_lowerings() -> dict[Any, OwnLowering]:
    """Target → record of irkit's own lowerings: those registered in this module and the
    ``_own_*`` modules (a library op while its library has registered it)."""
    return collect(_MODULES)
