"""Decomposed layer normalization → ``LayerNormalization`` (opset ≥ 17).

Identity (mean and variance over the trailing axes ``axis..rank-1``):

``d = x - mean(x);  (d / sqrt(mean(d²) + eps)) · w + b = LayerNormalization(x, w, b, axis, eps)``

Matched forms: ``d²`` as ``Pow(d, 2)`` or ``d·d``; ``d / s`` or ``d · Reciprocal(s)``; the affine
part ``· w + b`` or ``· w`` (no bias), products and sums in either operand order; ``ReduceMean``
axes as input (opset ≥ 18) or attribute (older).

Preconditions: opset ≥ 17; ``x`` floating point with known rank; both means reduce the same
trailing axes with ``keepdims=1``; ``eps`` a scalar constant; ``w`` (and ``b``) have exactly the
normalized shape ``x.shape[axis:]`` (LayerNormalization does not broadcast them).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from irkit.rewriting import (
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

x, eps, w, b = var("x"), var("eps"), var("w"), var("b")
ax1, ax2 = var("ax1"), var("ax2")

_MEAN = op.ReduceMean(x, optional(ax1), axes=attr("axes1"), keepdims=1)
_D = x - _MEAN
_VAR = op.ReduceMean(either(_D**2.0, _D * _D), optional(ax2), axes=attr("axes2"), keepdims=1)
_STD = op.Sqrt(_VAR + eps)
_NORMED = either(_D / _STD, _D * op.Reciprocal(_STD))


def _check(
    x: ir.Value,
    ax1: ir.Value | None,
    axes1: Sequence[int] | None,
    ax2: ir.Value | None,
    axes2: Sequence[int] | None,
    eps: ir.Value,
    w: ir.Value,
    b: ir.Value | None,
) -> Verdict:
    """The preconditions; finds the normalized ``axis`` (negative) and ``epsilon``."""
    xd = dims(x)
    if not is_float(x) or xd is None:
        return fail("x must be floating point with known rank", x)
    k1 = reduced_axis(x, ax1, axes1)
    if not isinstance(k1, int):
        return k1
    k2 = reduced_axis(x, ax2, axes2)
    if k2 != k1:
        return k2 if not isinstance(k2, int) else fail("mean and variance reduce different axes")
    epsilon = scalar(eps)
    if epsilon is None:
        return fail("epsilon is not a scalar constant", eps)
    normalized = xd[k1:]
    for name, v in (("scale", w), ("bias", b)):
        if v is not None and ((vd := dims(v)) is None or not same_dims(vd, normalized)):
            return fail(f"{name} shape {dims(v)} is not the normalized shape {normalized}", v)
    return {"axis": k1 - len(xd), "epsilon": epsilon}


def _rewrite(
    op: RewriteBuilder, x: ir.Value, w: ir.Value, b: ir.Value | None, axis: int, epsilon: float
) -> ir.Value:
    """LayerNormalization(x, w, b, axis=first reduced axis, epsilon=eps)"""
    return op.LayerNormalization(x, w, b, axis=axis, epsilon=epsilon)


rules = RuleSet(
    "layer_norm",
    [
        Rule(  # (x - E[x]) / sqrt(Var[x] + eps) · w + b = LayerNormalization(x, w, b)
            "LayerNormalization",
            either(_NORMED * w + b, _NORMED * w),
            check=_check,
            rewrite=_rewrite,
            min_opset=17,
        ),
    ],
)
"""The layer-norm rule."""
