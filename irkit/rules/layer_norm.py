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

from irkit.rewriting import Rule, RuleSet, attr, either, fail, op, optional, var
from irkit.rewriting.checks import dims, is_float, reduced_axis, same_dims, scalar

x, eps, w, b = var("x"), var("eps"), var("w"), var("b")
ax1, ax2 = var("ax1"), var("ax2")

_MEAN = op.ReduceMean(x, optional(ax1), axes=attr("axes1"), keepdims=1)
_D = op.Sub(x, _MEAN)
_VAR = op.ReduceMean(either(op.Pow(_D, 2.0), op.Mul(_D, _D)), optional(ax2), axes=attr("axes2"),
                     keepdims=1)
_STD = op.Sqrt(op.Add(_VAR, eps))
_NORMED = either(op.Div(_D, _STD), op.Mul(_D, op.Reciprocal(_STD)))


def _check(x, ax1, axes1, ax2, axes2, eps, w, b):  # noqa: ANN001
    if not is_float(x) or dims(x) is None:
        return fail("x must be floating point with known rank", x)
    k1 = reduced_axis(x, ax1, axes1)
    if not isinstance(k1, int):
        return k1
    k2 = reduced_axis(x, ax2, axes2)
    if k2 != k1:
        return k2 if not isinstance(k2, int) else fail("mean and variance reduce different axes")
    if scalar(eps) is None:
        return fail("epsilon is not a scalar constant", eps)
    normalized = dims(x)[k1:]  # type: ignore[index]
    for name, v in (("scale", w), ("bias", b)):
        if v is not None and (dims(v) is None or not same_dims(dims(v), normalized)):
            return fail(f"{name} shape {dims(v)} is not the normalized shape {normalized}", v)
    return True


def _rewrite(op, x, ax1, axes1, w, b, eps):  # noqa: ANN001
    """LayerNormalization(x, w, b, axis=first reduced axis, epsilon=eps)"""
    axis = reduced_axis(x, ax1, axes1)
    r = len(x.shape)
    return op.LayerNormalization(x, w, b, axis=axis - r, epsilon=scalar(eps))


rules = RuleSet(
    "layer_norm",
    [
        Rule(  # (x - E[x]) / sqrt(Var[x] + eps) · w + b = LayerNormalization(x, w, b)
            "LayerNormalization",
            either(op.Add(op.Mul(_NORMED, w), b), op.Mul(_NORMED, w)),
            _rewrite,
            _check,
            min_opset=17,
        ),
    ],
)
