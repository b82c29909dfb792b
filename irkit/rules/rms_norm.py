"""Decomposed RMS normalization → ``RMSNormalization`` (opset ≥ 23).

Identity (mean over the trailing axes ``axis..rank-1``):

``x · rsqrt(mean(x²) + eps) · w = RMSNormalization(x, w, axis, eps)``

Matched forms (Llama's ``LlamaRMSNorm`` lowers to ``Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul``):
``x²`` as ``Pow(x, 2)`` or ``x·x``; ``rsqrt(v)`` as ``Reciprocal(Sqrt(v))``, ``1 / Sqrt(v)`` or
``Pow(v, -0.5)``; ``x · rsqrt(v)`` or ``x / Sqrt(v)``; products in either operand order.

Preconditions: opset ≥ 23; ``x`` floating point with known rank; the mean reduces trailing axes
with ``keepdims=1``; ``eps`` a scalar constant; ``w`` has exactly the normalized shape.
"""

from __future__ import annotations

from irkit.rewriting import Const, Rule, RuleSet, attr, either, fail, op, optional, var
from irkit.rewriting.checks import dims, is_float, reduced_axis, same_dims, scalar

x, eps, w, ax = var("x"), var("eps"), var("w"), var("ax")

_MS = op.Add(op.ReduceMean(either(op.Pow(x, 2.0), op.Mul(x, x)), optional(ax),
                           axes=attr("axes"), keepdims=1), eps)
_NORMED = either(
    op.Mul(x, either(op.Reciprocal(op.Sqrt(_MS)), op.Div(1.0, op.Sqrt(_MS)),
                     op.Pow(_MS, Const(-0.5)))),
    op.Div(x, op.Sqrt(_MS)),
)


def _check(x, ax, axes, eps, w):  # noqa: ANN001
    if not is_float(x) or dims(x) is None:
        return fail("x must be floating point with known rank", x)
    k = reduced_axis(x, ax, axes)
    if not isinstance(k, int):
        return k
    if scalar(eps) is None:
        return fail("epsilon is not a scalar constant", eps)
    if w.dtype != x.dtype:
        return fail(f"scale dtype {w.dtype} differs from input dtype {x.dtype}", w)
    normalized = dims(x)[k:]  # type: ignore[index]
    if dims(w) is None or not same_dims(dims(w), normalized):
        return fail(f"scale shape {dims(w)} is not the normalized shape {normalized}", w)
    return True


def _rewrite(op, x, ax, axes, w, eps):  # noqa: ANN001
    """RMSNormalization(x, w, axis=first reduced axis, epsilon=eps)"""
    axis = reduced_axis(x, ax, axes) - len(x.shape)
    return op.RMSNormalization(x, w, axis=axis, epsilon=scalar(eps))


rules = RuleSet(
    "rms_norm",
    [
        Rule(  # x · rsqrt(mean(x²) + eps) · w = RMSNormalization(x, w)
            "RMSNormalization",
            op.Mul(_NORMED, w),
            _rewrite,
            _check,
            min_opset=23,
        ),
    ],
)
