"""Decomposed layer normalization → ``LayerNormalization`` (opset ≥ 17).

Identity (mean and variance over the trailing axes ``axis..rank-1``):

``d = x - mean(x);  (d / sqrt(mean(d²) + eps)) · w + b = LayerNormalization(x, w, b, axis, eps)``

Matched forms: ``d²`` as ``Pow(d, 2)`` or ``d·d``; ``d / s`` or ``d · Reciprocal(s)``; the affine
part ``· w + b`` or ``· w`` (no bias), products and sums in either operand order; ``ReduceMean``
axes as input (opset ≥ 18) or attribute (older).

Preconditions: opset ≥ 17; ``x`` floating point with known rank; both means reduce the same
trailing axes with ``keepdims=1``; ``eps`` a scalar constant; ``w`` (and ``b``) have exactly the
normalized shape ``x.shape[axis:]`` (LayerNormalization does not broadcast them).

Half precision (``LayerNormalizationHalf``): the statistics computed in float32 from
``x₃₂ = Cast(x, to=float)`` and the normalized value cast back to ``x``'s float16/bfloat16 type
before the affine part, ``Cast(normed(x₃₂), to=half) · w + b``, is
``LayerNormalization(x, w, b, stash_type=1)`` exactly (the op's definition casts the normalized
value back to ``x``'s type before the scale and bias). ``x``, ``w`` (and ``b``) are all half.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from irkit.rewriting import (
    Pattern,
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

_HALF_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def _normed(v: Pattern) -> Pattern:
    """``(v - mean(v)) / sqrt(var(v) + eps)`` in the forms listed in the module docstring."""
    d = v - op.ReduceMean(v, optional(ax1), axes=attr("axes1"), keepdims=1)
    var_ = op.ReduceMean(either(d**2.0, d * d), optional(ax2), axes=attr("axes2"), keepdims=1)
    std = op.Sqrt(var_ + eps)
    return either(d / std, d * op.Reciprocal(std))


_NORMED = _normed(x)
_HALF_NORMED = op.Cast(_normed(op.Cast(x, to=int(ir.DataType.FLOAT))), to=attr("to"))


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


def _check_half(
    x: ir.Value,
    ax1: ir.Value | None,
    axes1: Sequence[int] | None,
    ax2: ir.Value | None,
    axes2: Sequence[int] | None,
    eps: ir.Value,
    w: ir.Value,
    b: ir.Value | None,
    to: int,
) -> Verdict:
    """:func:`_check`, and ``x``, ``w``, ``b`` half with the normalized value cast back to it."""
    if x.dtype not in _HALF_TYPES:
        return fail(f"x is {x.dtype}, not float16/bfloat16 (the float32 form is the plain rule)", x)
    if to != x.dtype:
        return fail(f"the normalized value is cast to {ir.DataType(to)}, not to x's {x.dtype}", x)
    for name, v in (("scale", w), ("bias", b)):
        if v is not None and v.dtype != x.dtype:
            return fail(f"{name} dtype {v.dtype} differs from input dtype {x.dtype}", v)
    return _check(x, ax1, axes1, ax2, axes2, eps, w, b)


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
        Rule(  # Cast(normed(Cast(x, f32)), half) · w + b = LayerNormalization(x, w, b)
            "LayerNormalizationHalf",
            either(_HALF_NORMED * w + b, _HALF_NORMED * w),
            check=_check_half,
            rewrite=_rewrite,
            min_opset=17,
        ),
    ],
)
"""The layer-norm rule."""
