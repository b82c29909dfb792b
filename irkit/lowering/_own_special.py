"""Special functions ONNX has no operator for.

**erfinv.** The inverse error function (Gemma 3n's activation sparsity: ``Normal(0, 1).icdf``,
``√2 · erfinv(2p − 1)``; OpInfo's ``erfinv``). torch has no decomposition of it. Here it is
Giles' single-precision approximation ("Approximating the erfinv function", GPU Computing Gems
Jade, 2011): with ``w = −log((1 − x)(1 + x))``, ``erfinv(x) = x · p(w − 2.5)`` for ``w < 5`` and
``x · q(√w − 3)`` beyond, ``p`` and ``q`` polynomials of degree 8; a few float32 ulps from
torch's (2.5e-7 relative at most over [-1, 1]). ``±1`` gives ``±inf`` and ``|x| > 1`` NaN, as
torch. It is computed in float32 (onnxruntime has no float64 ``Erf`` to refine with): float16
and bfloat16 inputs are cast up and back; a float64 input is rounded to float32 first, which
near ±1 dominates (1e-5 relative at 1 − 1e-7); an integer or bool input gives float32, as
torch's type promotion does.

**ndtri** (the standard normal quantile, ``√2 · erfinv(2p − 1)``) is the same approximation with
``1 − (2p − 1)² = 4p(1 − p)`` taken from ``p`` for ``0.02425 ≤ p ≤ 0.97575``, and Acklam's
rational approximation in ``√(−2 log p)`` in the tails (Giles' float32 fit ends near p = 1e-7;
Acklam's holds down to the smallest float).
"""

from __future__ import annotations

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from irkit.lowering._registration import own

__all__: list[str] = []

aten = torch.ops.aten

# Giles (2011), single precision: highest degree first
_CENTRAL = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941,
)  # fmt: skip
_TAIL = (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682,
)  # fmt: skip


def _horner(coefficients: tuple[float, ...], w: ir.Value) -> ir.Value:
    p = op.Constant(value_float=coefficients[0])
    for c in coefficients[1:]:
        p = op.Add(op.Mul(p, w), op.Constant(value_float=c))
    return p


def _erfinv_of(x: ir.Value, w: ir.Value) -> ir.Value:
    """erfinv(x) from ``x`` and ``w = −log(1 − x²)`` (float32), finite ``|x| < 1``."""
    central = _horner(_CENTRAL, op.Sub(w, op.Constant(value_float=2.5)))
    tail = _horner(_TAIL, op.Sub(op.Sqrt(w), op.Constant(value_float=3.0)))
    return op.Mul(op.Where(op.Less(w, op.Constant(value_float=5.0)), central, tail), x)


def _as_input_float(y: ir.Value, like: ir.Value) -> ir.Value:
    """``y`` (float32) in ``like``'s float type; float32 for integer and bool inputs."""
    if like.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE):
        return op.Cast(y, to=like.dtype)
    return y


@own(aten.erfinv.default)
def _erfinv(self: ir.Value) -> ir.Value:
    x = op.Cast(self, to=ir.DataType.FLOAT)
    one = op.Constant(value_float=1.0)
    w = op.Neg(op.Log(op.Mul(op.Sub(one, x), op.Add(one, x))))
    infinite = op.Mul(x, op.Constant(value_float=float("inf")))  # ±1 → ±inf
    y = op.Where(op.Equal(op.Abs(x), one), infinite, _erfinv_of(x, w))
    return _as_input_float(y, self)


# Acklam's rational approximation of the normal quantile's tails (p < 0.02425 and mirrored),
# in q = √(−2 log p): relative error below 1.2e-9 in exact arithmetic, down to the smallest p
_TAIL_NUMERATOR = (
    -7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
    -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00,
)  # fmt: skip
_TAIL_DENOMINATOR = (
    7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00, 1.0,
)  # fmt: skip
_TAIL_P = 0.02425


@own(aten.special_ndtri.default)
def _ndtri(self: ir.Value) -> ir.Value:
    # central: √2 · erfinv(2p − 1) with 1 − (2p − 1)² = 4p(1 − p); tails (the smaller of p and
    # 1 − p below 0.02425): Acklam's q-rational, where Giles' float32 fit runs out (p < 1e-7)
    p = op.Cast(self, to=ir.DataType.FLOAT)
    one = op.Constant(value_float=1.0)
    x = op.Sub(op.Add(p, p), one)
    w = op.Neg(op.Log(op.Mul(op.Mul(op.Constant(value_float=4.0), p), op.Sub(one, p))))
    central = op.Mul(_erfinv_of(x, w), op.Constant(value_float=2.0**0.5))
    small = op.Min(p, op.Sub(one, p))
    q = op.Sqrt(op.Mul(op.Constant(value_float=-2.0), op.Log(small)))
    tail = op.Div(_horner(_TAIL_NUMERATOR, q), _horner(_TAIL_DENOMINATOR, q))  # (negative)
    tail = op.Where(op.Less(p, op.Constant(value_float=0.5)), tail, op.Neg(tail))
    y = op.Where(op.Less(small, op.Constant(value_float=_TAIL_P)), tail, central)
    infinite = op.Mul(x, op.Constant(value_float=float("inf")))  # p = 0, 1 → -inf, +inf
    y = op.Where(op.Equal(small, op.Constant(value_float=0.0)), infinite, y)
    return _as_input_float(y, self)
