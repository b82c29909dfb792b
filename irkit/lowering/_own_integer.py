"""Integer arithmetic onnxruntime computes through doubles: exact, wrapping as torch does.

**pow.** onnxruntime's integer ``Pow`` uses ``std::pow`` on doubles: past 2**53 it loses the low
bits, past the dtype's range it saturates. torch multiplies in the integer type and wraps —
blt's rolling hash ``prime ** arange(n)`` with ``prime = 1000000007`` (its hash embeddings, 4.2
off in the model's output). Here ``pow`` of an integer result is square-and-multiply over the
exponent's bits: unrolled for a Python exponent, else a ``Loop`` that runs while any exponent has
bits left (at most 63 rounds for int64). A negative exponent gives what torch gives: 1 for a
base of 1, ±1 for -1, else 0.

**int64 sum.** onnxruntime's int64 ``ReduceSum`` is off in the low bits once the values pass
2**53 (blt sums the hash terms ``token · prime^i``). Each value is split into its high and low 32
bits, ``x = high · 2**32 + low`` with ``0 ≤ low < 2**32``; both halves sum exactly (partial sums
stay below 2**53 for reductions of fewer than 2**21 elements) and ``high_sum · 2**32 +
low_sum`` wraps in int64 as torch's sum does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._registration import own

__all__: list[str] = []

aten = torch.ops.aten

_INTEGER = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def _integer_result(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype in _INTEGER


@own(aten.pow.Tensor_Tensor, applies=_integer_result)
def _pow_tensor_tensor(self: ir.Value, exponent: ir.Value) -> ir.Value:
    return _pow(self, op.CastLike(exponent, self))


@own(aten.pow.Tensor_Scalar, applies=_integer_result)
def _pow_tensor_scalar(self: ir.Value, exponent: Any) -> ir.Value:
    if isinstance(exponent, int) and exponent >= 0:
        return _pow_unrolled(self, exponent)
    return _pow(self, op.CastLike(exponent, self))


@own(aten.pow.Scalar, applies=_integer_result)
def _pow_scalar(self: Any, exponent: ir.Value) -> ir.Value:
    return _pow(op.CastLike(self, exponent), exponent)


def _int64_input(node: torch.fx.Node) -> bool:
    first = node.args[0] if node.args else None
    val = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
    out = node.meta.get("val")
    return (
        isinstance(val, torch.Tensor)
        and val.dtype == torch.int64
        and isinstance(out, torch.Tensor)
        and out.dtype == torch.int64
    )


@own(aten.sum.default, applies=_int64_input)
def _sum(self: ir.Value, dtype: Any = None) -> ir.Value:
    return _exact_sum(self, None, keepdim=False)


@own(aten.sum.dim_IntList, applies=_int64_input)
def _sum_dims(
    self: ir.Value, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> ir.Value:
    return _exact_sum(self, list(dim) if dim else None, keepdim=keepdim)


def _exact_sum(x: ir.Value, dims: list[int] | None, *, keepdim: bool) -> ir.Value:
    """``ReduceSum`` of int64 ``x`` over ``dims`` (None: all) as two sums of 32-bit halves."""
    half = op.Constant(value=ir.tensor(np.array(2**32, dtype=np.int64)))
    zero = op.Constant(value=ir.tensor(np.array(0, dtype=np.int64)))
    low = op.Mod(x, half)  # fmod=0: the divisor's sign, so 0 ≤ low < 2**32
    truncated = op.Div(x, half)  # rounds toward zero; the floor is one less for a negative x
    borrow = op.And(op.Less(x, zero), op.Greater(low, zero))
    high = op.Sub(truncated, op.Cast(borrow, to=int(ir.DataType.INT64)))
    keep = 1 if keepdim else 0
    if dims is None:
        low_sum, high_sum = op.ReduceSum(low, keepdims=keep), op.ReduceSum(high, keepdims=keep)
    else:
        axes = op.Constant(value=ir.tensor(np.array(dims, dtype=np.int64)))
        low_sum = op.ReduceSum(low, axes, keepdims=keep)
        high_sum = op.ReduceSum(high, axes, keepdims=keep)
    return op.Add(op.Mul(high_sum, half), low_sum)


def _const(n: int, like: ir.Value) -> ir.Value:
    """``n`` as a 0-d tensor of ``like``'s dtype."""
    if like.dtype is None:
        return op.CastLike(n, like)
    return op.Constant(value=ir.tensor(np.array(n, dtype=like.dtype.numpy())))


def _pow_unrolled(base: ir.Value, exponent: int) -> ir.Value:
    """``base ** exponent`` for a known exponent ≥ 0: one ``Mul`` per bit and per set bit."""
    result: ir.Value | None = None
    power = base
    while exponent:
        if exponent & 1:
            result = power if result is None else op.Mul(result, power)
        exponent >>= 1
        if exponent:
            power = op.Mul(power, power)
    if result is None:  # x ** 0 is 1, also for 0 ** 0
        return op.Expand(_const(1, base), op.Shape(base))
    return result if result is not base else op.Identity(base)


def _pow(base: ir.Value, exponent: ir.Value) -> ir.Value:
    """``base ** exponent`` elementwise, both of one integer dtype, exponents computed."""
    zeros = op.Mul(op.Add(base, exponent), _const(0, base))  # the broadcast shape
    one, two = _const(1, base), _const(2, base)
    base_full, exponent_full = op.Add(base, zeros), op.Add(exponent, zeros)
    bits = op.Max(exponent_full, zeros)
    more = op.Greater(op.ReduceMax(bits, keepdims=0), _const(0, base))
    dtype = base.dtype if base.dtype is not None else ir.DataType.INT64
    result, _, _ = op.Loop(None, more, op.Add(zeros, one), base_full, bits, body=_body(dtype))
    if dtype in (ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64):
        return result
    minus_one = _const(-1, base)
    even = op.Equal(op.Mod(exponent_full, two), zeros)
    negative = op.Where(
        op.Equal(base_full, one),
        one,
        op.Where(op.Equal(base_full, minus_one), op.Where(even, one, minus_one), zeros),
    )
    return op.Where(op.Less(exponent_full, zeros), negative, result)


def _body(dtype: ir.DataType) -> ir.Graph:
    """One square-and-multiply round: ``(result, power, bits) → (result · power if bits is odd,
    power², bits // 2)``, going on while any bits are left."""
    iteration = ir.Value(type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    going = ir.Value(type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    result, power, bits = (ir.Value(type=ir.TensorType(dtype)) for _ in range(3))
    nodes: list[ir.Node] = []

    def add(op_type: str, *inputs: ir.Value, **attributes: Any) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attributes)
        nodes.append(node)
        out: ir.Value = node.outputs[0]
        out.type = ir.TensorType(ir.DataType.BOOL if op_type in ("Equal", "Greater") else dtype)
        return out

    def constant(n: int) -> ir.Value:
        return add("Constant", value=ir.tensor(np.array(n, dtype=dtype.numpy())))

    zero, one, two = constant(0), constant(1), constant(2)
    odd = add("Equal", add("Mod", bits, two), one)
    next_result = add("Where", odd, add("Mul", result, power), result)
    next_power = add("Mul", power, power)
    next_bits = add("Div", bits, two)
    next_going = add("Greater", add("ReduceMax", next_bits, keepdims=0), zero)
    return ir.Graph(
        [iteration, going, result, power, bits],
        [next_going, next_result, next_power, next_bits],
        nodes=nodes,
        name="pow_square_and_multiply",
    )
