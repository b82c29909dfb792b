"""Residual add + normalization → ``SkipSimplifiedLayerNormalization`` / ``SkipLayerNormalization``.

Identities (``com.microsoft`` contrib ops of onnxruntime; ``s = a + b`` is also an output, the
residual stream the next block adds to):

- ``RMSNormalization(a + b, w, axis=-1, eps) , a + b
  = SkipSimplifiedLayerNormalization(a, b, w, epsilon=eps)`` outputs 0 and 3
- ``RMSNormalization(a + b, w₀ + c, …) , a + b
  = SkipSimplifiedLayerNormalization(a, b, w₀ + c, …)`` (a scale computed as ``1 + w``,
  ``c`` a constant of one element or ``w₀``'s shape: the ``Add`` is rewritten with the norm)
- ``LayerNormalization(a + b, w, bias, axis=-1, eps) , a + b
  = SkipLayerNormalization(a, b, w, bias, epsilon=eps)`` outputs 0 and 3

The norms are the ones the ``"onnx"`` fusions produce (:mod:`irkit.rules.rms_norm`,
:mod:`irkit.rules.layer_norm`), so the decomposed forms are covered too.

Preconditions: the norm normalizes the last axis only; ``a`` and ``b`` float16/float32 with the
same dtype and the same known dims of rank 2 or 3 (the contrib ops do not broadcast the skip
input here); ``w`` (and the bias) 1-D of the hidden size; the norm's ``stash_type`` is float32;
its other outputs unused. In a model whose module calls were opened for the rewrite, the fusion
belongs to the deepest module containing the add and the norm.
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.errors import RewriteError
from irkit.rewriting import (
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    const_value,
    dims,
    fail,
    op,
    optional,
    var,
)
from irkit.rules._ort_types import ORT_FLOAT_TYPES

MS = "com.microsoft"

a, b, w, bias = var("a"), var("b"), var("w"), var("bias")
_SUM = a + b
_RMS = op.RMSNormalization(_SUM, w, axis=attr("axis"), epsilon=attr("epsilon"), stash_type=1)
#: The same norm whose scale is computed right before it (``1 + w``: Gemma's, Qwen3.5's and
#: Qwen3-Next's norms, ``Add`` of the weight and a constant inside the norm's module call):
#: rewritten with that ``Add`` too, so the norm's module call is replaced whole and the fusion
#: keeps sibling calls of the norm's class alike (onnxruntime folds the ``Add`` at load).
w0, offset = var("w0"), var("offset")
_RMS_OFFSET = op.RMSNormalization(
    _SUM, op.Add(w0, offset), axis=attr("axis"), epsilon=attr("epsilon"), stash_type=1
)
_LN = op.LayerNormalization(
    _SUM, w, optional(bias), axis=attr("axis"), epsilon=attr("epsilon"), stash_type=1
)  # (every attribute of the op listed: the contrib op computes in float32, as stash_type=1)


def _check_rms(a: ir.Value, b: ir.Value, w: ir.Value, axis: int) -> Verdict:
    return _check(a, b, w, axis, None)


def _check_rms_offset(
    a: ir.Value, b: ir.Value, w0: ir.Value, offset: ir.Value, axis: int
) -> Verdict:
    constant = const_value(offset)
    if constant is None:
        return fail("the scale's offset is not a constant", offset)
    if constant.size != 1 and constant.shape != dims(w0):
        return fail(f"the scale's offset of shape {constant.shape} broadcasts the weight", offset)
    return _check(a, b, w0, axis, None)


def _check_ln(a: ir.Value, b: ir.Value, w: ir.Value, axis: int, bias: ir.Value | None) -> Verdict:
    return _check(a, b, w, axis, bias)


def _check(a: ir.Value, b: ir.Value, w: ir.Value, axis: int, bias: ir.Value | None) -> Verdict:
    return check_skip(a, b, w, axis, bias)


def check_skip(
    a: ir.Value,
    b: ir.Value,
    w: ir.Value,
    axis: int,
    bias: ir.Value | None,
) -> Verdict:
    """The preconditions of the module docstring (for :mod:`irkit.rules.ort.half_norm` too).

    Args:
        a: The residual sum's first operand.
        b: Its second.
        w: The norm's scale (its shape is checked).
        axis: The norm's ``axis``.
        bias: The layer norm's bias, or None.
    """
    da, db = dims(a), dims(b)
    if da is None or db is None:
        return fail("input ranks unknown", a if da is None else b)
    if len(da) not in (2, 3):
        return fail(f"input has rank {len(da)}; the contrib op takes rank 2 or 3", a)
    if axis not in (-1, len(da) - 1):
        return fail(f"normalizes from axis {axis}, the contrib op only the last axis", a)
    if a.dtype not in ORT_FLOAT_TYPES or b.dtype != a.dtype:
        return fail(f"dtypes {a.dtype}, {b.dtype}: need float16/float32, both the same", a)
    if da != db or any(d is None for d in da):
        return fail(f"residual shapes {list(da)} and {list(db)} differ or are unknown", b)
    for v in (w, bias):
        if v is not None and (dims(v) is None or dims(v) != da[-1:]):
            return fail(f"scale/bias shape {dims(v)} is not [{da[-1]}]", v)
    return True


def skip_simplified(
    op: RewriteBuilder, a: ir.Value, b: ir.Value, w: ir.Value, epsilon: float
) -> tuple[ir.Value, ir.Value]:
    """SkipSimplifiedLayerNormalization(a, b, w) → (normalized, a + b)"""
    y, _, _, total = op.domain(MS).SkipSimplifiedLayerNormalization(
        a, b, w, epsilon=epsilon, _outputs=4
    )
    return y, total


def _skip_simplified_offset(
    op: RewriteBuilder, a: ir.Value, b: ir.Value, w0: ir.Value, offset: ir.Value, epsilon: float
) -> tuple[ir.Value, ir.Value]:
    """SkipSimplifiedLayerNormalization(a, b, w0 + offset) → (normalized, a + b)"""
    # (the offset as a constant of the rewrite's own: the old one, read by the replaced Add
    # only, goes with the norm's module call, which is then replaced whole)
    constant = const_value(offset)
    if constant is None:  # (the check saw a constant)
        raise RewriteError(f"the offset {offset.name!r} of a norm's scale is not a constant")
    return skip_simplified(op, a, b, op.Add(w0, op.const(constant)), epsilon)


def _skip_layer_norm(
    op: RewriteBuilder,
    a: ir.Value,
    b: ir.Value,
    w: ir.Value,
    bias: ir.Value | None,
    epsilon: float,
) -> tuple[ir.Value, ir.Value]:
    """SkipLayerNormalization(a, b, w, bias) → (normalized, a + b)"""
    y, _, _, total = op.domain(MS).SkipLayerNormalization(
        a, b, w, bias, epsilon=epsilon, _outputs=4
    )
    return y, total


rules = RuleSet(
    "ort_skip_norm",
    [
        Rule(  # RMSNorm(a + b, w0 + c), a + b = SkipSimplifiedLayerNormalization(a, b, w0 + c)
            "SkipSimplifiedLayerNormalizationOffset",
            (_RMS_OFFSET, _SUM),
            check=_check_rms_offset,
            rewrite=_skip_simplified_offset,
        ),
        Rule(  # RMSNorm(a + b, w), a + b = SkipSimplifiedLayerNormalization(a, b, w)
            "SkipSimplifiedLayerNormalization",
            (_RMS, _SUM),
            check=_check_rms,
            rewrite=skip_simplified,
        ),
        Rule(  # LayerNorm(a + b, w, bias), a + b = SkipLayerNormalization(a, b, w, bias)
            "SkipLayerNormalization",
            (_LN, _SUM),
            check=_check_ln,
            rewrite=_skip_layer_norm,
        ),
    ],
)
"""The skip-norm rules."""
