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

from collections.abc import Sequence

import onnx_ir as ir

from irkit.rewriting import (
    Const,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    dims,
    either,
    fail,
    is_float,
    op,
    optional,
    reduced_axis,
    same_dims,
    scalar,
    var,
)

x, eps, w, ax = var("x"), var("eps"), var("w"), var("ax")

_MS = op.ReduceMean(either(x**2.0, x * x), optional(ax), axes=attr("axes"), keepdims=1) + eps
_RSQRT = either(op.Reciprocal(op.Sqrt(_MS)), 1.0 / op.Sqrt(_MS), _MS ** Const(-0.5))
_NORMED = either(x * _RSQRT, x / op.Sqrt(_MS))


def _check(
    x: ir.Value, ax: ir.Value | None, axes: Sequence[int] | None, eps: ir.Value, w: ir.Value
) -> Verdict:
    """The preconditions; finds the normalized ``axis`` (negative) and ``epsilon``."""
    xd = dims(x)
    if not is_float(x) or xd is None:
        return fail("x must be floating point with known rank", x)
    k = reduced_axis(x, ax, axes)
    if not isinstance(k, int):
        return k
    epsilon = scalar(eps)
    if epsilon is None:
        return fail("epsilon is not a scalar constant", eps)
    if w.dtype != x.dtype:
        return fail(f"scale dtype {w.dtype} differs from input dtype {x.dtype}", w)
    normalized = xd[k:]
    if (wd := dims(w)) is None or not same_dims(wd, normalized):
        return fail(f"scale shape {dims(w)} is not the normalized shape {normalized}", w)
    return {"axis": k - len(xd), "epsilon": epsilon}


def _rewrite(op: RewriteBuilder, x: ir.Value, w: ir.Value, axis: int, epsilon: float) -> ir.Value:
    """RMSNormalization(x, w, axis=first reduced axis, epsilon=eps)"""
    return op.RMSNormalization(x, w, axis=axis, epsilon=epsilon)


rules = RuleSet(
    "rms_norm",
    [
        Rule(  # x · rsqrt(mean(x²) + eps) · w = RMSNormalization(x, w)
            "RMSNormalization",
            _NORMED * w,
            check=_check,
            rewrite=_rewrite,
            min_opset=23,
        ),
    ],
)
"""The RMS-norm rule."""
