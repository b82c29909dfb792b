"""Decomposed RMS normalization → ``RMSNormalization`` (opset ≥ 23).

Identity (mean over the trailing axes ``axis..rank-1``):

``x · rsqrt(mean(x²) + eps) · w = RMSNormalization(x, w, axis, eps)``

Matched forms (Llama's ``LlamaRMSNorm`` lowers to ``Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul``):
``x²`` as ``Pow(x, 2)`` or ``x·x``; ``rsqrt(v)`` as ``Reciprocal(Sqrt(v))``, ``1 / Sqrt(v)`` or
``Pow(v, -0.5)``; ``x · rsqrt(v)`` or ``x / Sqrt(v)``; products in either operand order.

Preconditions: opset ≥ 23; ``x`` floating point with known rank; the mean reduces trailing axes
with ``keepdims=1``; ``eps`` a scalar constant; ``w`` has exactly the normalized shape.

Half precision (``RMSNormalizationHalf``): Hugging Face's fp16/bf16 RMS norms (Llama, Qwen2,
Phi-3, Mistral, …) compute in float32 and round before the scale,
``w · Cast(x₃₂ · rsqrt(mean(x₃₂²) + eps), to=half)`` with ``x₃₂ = Cast(x, to=float)``: that is
``RMSNormalization(x, w, stash_type=1)`` exactly (the op computes in float32 and casts the
normalized value back to ``x``'s type before the scale). ``x`` and ``w`` are float16 or bfloat16,
the output Cast goes back to ``x``'s type.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from irkit.rewriting import (
    Const,
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

x, eps, w, ax = var("x"), var("eps"), var("w"), var("ax")

_HALF_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def _normed(v: Pattern) -> Pattern:
    """``v · rsqrt(mean(v²) + eps)`` in the forms listed in the module docstring."""
    ms = op.ReduceMean(either(v**2.0, v * v), optional(ax), axes=attr("axes"), keepdims=1) + eps
    rsqrt = either(op.Reciprocal(op.Sqrt(ms)), 1.0 / op.Sqrt(ms), ms ** Const(-0.5))
    return either(v * rsqrt, v / op.Sqrt(ms))


_NORMED = _normed(x)
_HALF_NORMED = op.Cast(_normed(op.Cast(x, to=int(ir.DataType.FLOAT))), to=attr("to"))


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


def _check_half(
    x: ir.Value,
    ax: ir.Value | None,
    axes: Sequence[int] | None,
    eps: ir.Value,
    w: ir.Value,
    to: int,
) -> Verdict:
    """:func:`_check`, and ``x`` half precision with the normalized value cast back to it."""
    if x.dtype not in _HALF_TYPES:
        return fail(f"x is {x.dtype}, not float16/bfloat16 (the float32 form is the plain rule)", x)
    if to != x.dtype:
        return fail(f"the normalized value is cast to {ir.DataType(to)}, not to x's {x.dtype}", x)
    return _check(x, ax, axes, eps, w)


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
        Rule(  # w · Cast(Cast(x, f32) · rsqrt(mean(·²) + eps), half) = RMSNormalization(x, w)
            "RMSNormalizationHalf",
            _HALF_NORMED * w,
            check=_check_half,
            rewrite=_rewrite,
            min_opset=23,
        ),
    ],
)
"""The RMS-norm rule."""
