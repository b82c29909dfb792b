"""Float32 RMS-norm islands of a float16 graph → the float16 norm (computes in float32 itself).

Identity (``x`` float16, ``w`` float16 of the normalized size, ``c`` a constant)::

    Cast(RMSNormalization(Cast(x, to=float), Cast(w, to=float), eps), to=float16)
      = RMSNormalization(x, w, eps, stash_type=1)
    Cast(RMSNormalization(Cast(x, to=float), Cast(w, to=float) + c, eps), to=float16)
      = RMSNormalization(x, Cast(Cast(w, to=float) + c, to=float16), eps, stash_type=1)

Hugging Face's half models that upcast the whole norm (``Qwen3_5RMSNorm``,
``Qwen3NextRMSNorm``, Gemma's: ``self._norm(x.float()) * (1.0 + self.weight.float())``,
rounded to half once at the end) lower to the left side: three kernels (two ``Cast`` and the
norm) where the right side runs one, and the ``Cast`` between the residual ``Add`` and the norm
keeps :mod:`irkit.rules.ort.skip_norm` from fusing the pair: with ``skip_rules`` the island of a
residual sum becomes ``SkipSimplifiedLayerNormalization`` in the same rewrite.

Why the right side gives the left's numbers (up to float rounding): onnxruntime's CUDA
``RMSNormalization`` for float16 is registered as its layer-norm kernel ``RMSNorm<MLFloat16,
float, MLFloat16, simplified=true>`` (``U = float``, onnxruntime's CUDA provider): the
statistics and the product ``x · rsqrt(mean(x²) + eps) · w`` are computed in float32 from the
half inputs, then rounded to float16 once, as the left side's final ``Cast`` does; likewise the
fused ``SkipSimplifiedLayerNormalization`` the skip rule makes of it. ``Cast(w, to=float)`` of a
float16 ``w`` is exact, so the first form differs in no operand; in the second, the scale
``w + c`` is computed in float32 as before and rounded to float16 once (a constant expression
onnxruntime folds at load): a relative difference of at most 2⁻¹¹ in the scale, the size of the
output's own rounding. The
kernels read are CUDA's, so the rules are turned on for CUDA only
(:class:`irkit.llm._provider.ExecutionProvider`'s ``half_norms``); CPU graphs stay as they were.

The gated output norm of the gated delta net (``Qwen3_5RMSNormGated``: the norm in half, then
``· silu(gate.float())`` in float32, rounded to half at the end)::

    Cast(Cast(RMSNormalization(x, w), to=float) · silu(Cast(g, to=float)), to=float16)
      = GatedRMSNorm(x, w, g, activation="silu")

written as ``Cast(GatedRMSNorm(…), to=float)`` for the float32 product (the rule is anchored at
the product, two nodes from the norm, so the engine retries it once the norm fuses) when only
``Cast`` to float16 reads that product; the round trip ``Cast(Cast(h, to=float),
to=float16) = h`` of a float16 ``h`` (exact: float32 holds every float16) then removes the pair.
onnxruntime documents the contrib op's arithmetic (its schema, 1.32): "All arithmetic including
gate activation is done in float32 regardless of the tensor type", so the difference is the
float16 rounding of the norm before the gate, which the fused op skips.
:mod:`irkit.rules.ort.gated_norm`'s ``GatedRMSNormPacked`` then drops the per-head reshapes
where the shapes allow.

Preconditions (each declined with the reason, ``irkit.explain``): ``x`` float16 and the outer
``Cast`` back to float16; the norm's ``stash_type`` float32; the scale (or the scale minus a
constant offset ``c``) a ``Cast`` of a float16 value or a float32 constant whose every element
float16 holds exactly (the export folds ``Cast(w, to=float)`` of a float16 weight into such a
constant, or the export's fold of the offset form, ``Cast(w, to=float) + c`` of a float16 weight
as one derived float32 constant: rounded to float16 once, as the offset identity does); ``c``
a float32 constant of one element or the scale's shape. The gated form: ``x`` float16, the float32 product read only by ``Cast``
to float16 (not a graph output), and :mod:`irkit.rules.ort.gated_norm`'s preconditions.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.errors import RewriteError
from irkit.rewriting import (
    Match,
    Pattern,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    cast_weight,
    const_tensor,
    dims,
    fail,
    op,
    var,
    weight_constant,
)
from irkit.rules.ort import gated_norm, skip_norm
from irkit.weights import Add as AddRecipe
from irkit.weights import Cast as CastRecipe
from irkit.weights import Constant as ConstantRecipe
from irkit.weights import Recipe, as_recipe, has_data

__all__ = ["rules", "skip_rules"]

_FLOAT = int(ir.DataType.FLOAT)
_HALF = ir.DataType.FLOAT16

x, s, c, a, b = var("x"), var("s"), var("c"), var("a"), var("b")
_SUM = a + b


def _island(normed: Pattern, scale: Pattern) -> Pattern:
    return op.Cast(
        op.RMSNormalization(
            op.Cast(normed, to=_FLOAT),
            scale,
            axis=attr("axis"),
            epsilon=attr("epsilon"),
            stash_type=1,
        ),
        to=attr("to"),
    )


_PLAIN = _island(x, s)
g, h = var("g"), var("h")
_GATE = op.Cast(g, to=_FLOAT)
#: (anchored at the product, two nodes from the norm: the engine retries it when the norm fuses)
_GATED = op.Cast(
    op.RMSNormalization(x, var("w"), axis=attr("axis"), epsilon=attr("epsilon"), stash_type=1),
    to=_FLOAT,
) * (_GATE * op.Sigmoid(_GATE))
_ROUND_TRIP = op.Cast(op.Cast(h, to=_FLOAT), to=attr("to"))
_OFFSET = _island(x, op.Add(s, c))
_SKIP = (_island(_SUM, s), _SUM)
_SKIP_OFFSET = (_island(_SUM, op.Add(s, c)), _SUM)


def _exact_half(value: ir.Value) -> ir.TensorProtocol | None:
    """``value``'s constant in float16 if float16 holds every element exactly, else None.

    A weight without data (a lowered model's weights stream in at save) is exact when it is a
    ``Cast`` to float32 of a float16 weight (the export folds ``Cast(w, to=float)``): its
    float16 twin is then the derived ``Cast`` back, which gives ``w`` again.
    """
    tensor = const_tensor(value)
    if tensor is None or tensor.dtype != ir.DataType.FLOAT:
        return None
    if not has_data(tensor):
        recipe = as_recipe(tensor)
        exact = _half_cast(recipe) or _folded_offset(recipe)
        return cast_weight(tensor, _HALF) if exact else None
    array = tensor.numpy()
    with np.errstate(over="ignore"):
        half = array.astype(np.float16)
    return ir.tensor(half) if np.array_equal(half.astype(np.float32), array) else None


def _half_cast(recipe: Recipe) -> bool:
    return isinstance(recipe, CastRecipe) and recipe.source.dtype == _HALF


def _folded_offset(recipe: Recipe) -> bool:
    """``Cast(w, to=float) + c`` of a float16 weight and a small float32 constant, as the export
    folds the offset form's scale (Gemma's and Qwen3.5's ``1 + w``): rounded to float16 once,
    as the offset identity rounds it (the module docstring)."""
    if not isinstance(recipe, AddRecipe):
        return False
    for weight, offset in ((recipe.a, recipe.b), (recipe.b, recipe.a)):
        if _half_cast(weight) and isinstance(offset, ConstantRecipe):
            small = np.abs(np.asarray(offset.value, dtype=np.float64)).max(initial=0) <= 1e4
            if small and (offset.value.size == 1 or offset.shape == weight.shape):
                return True
    return False


def _half_source(s: ir.Value) -> ir.Value | None:
    """The float16 value ``s`` is a ``Cast`` of, or None."""
    node = s.producer()
    if node is None or node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return None
    source = node.inputs[0]
    return source if source is not None and source.dtype == _HALF else None


def _check(x: ir.Value, s: ir.Value, to: int) -> Verdict:
    if x.dtype != _HALF:
        return fail(f"x is {x.dtype}, not float16", x)
    if to != _HALF:
        return fail(f"the norm is cast to {ir.DataType(to)}, not back to float16", x)
    if _half_source(s) is None and _exact_half(s) is None:
        return fail("the scale is neither a Cast of float16 nor a constant float16 holds", s)
    return True


def _check_offset(x: ir.Value, s: ir.Value, c: ir.Value, to: int) -> Verdict:
    offset = const_tensor(c)
    if offset is None or offset.dtype != ir.DataType.FLOAT:
        return fail("the scale's offset is no float32 constant", c)
    size = int(np.prod(offset.shape.numpy()))
    if size != 1 and list(offset.shape.numpy()) != _scale_dims(s):
        return fail("the scale's offset broadcasts the weight", c)
    return _check(x, s, to)


def _scale_dims(s: ir.Value) -> list[int] | None:
    """``s``'s dims: its constant's, else its value's (a parsed ``Constant`` has none)."""
    tensor = const_tensor(s)
    if tensor is not None:
        return [int(d) for d in tensor.shape.numpy()]
    found = dims(s)
    return None if found is None else list(found)  # type: ignore[arg-type]


def _check_skip(a: ir.Value, b: ir.Value, s: ir.Value, to: int, axis: int) -> Verdict:
    verdict = _check(a, s, to)
    if verdict is not True:
        return verdict
    return skip_norm.check_skip(a, b, s, axis, None)


def _check_skip_offset(
    a: ir.Value, b: ir.Value, s: ir.Value, c: ir.Value, to: int, axis: int
) -> Verdict:
    verdict = _check_offset(a, s, c, to)
    if verdict is not True:
        return verdict
    return skip_norm.check_skip(a, b, s, axis, None)


def _half(op: RewriteBuilder, value: ir.Value) -> ir.Value:
    """``value`` in float16: the ``Cast``'s source, or the constant converted (both exact)."""
    source = _half_source(value)
    if source is not None:
        return source
    tensor = _exact_half(value)
    if tensor is None:  # (the check saw one or the other)
        raise RewriteError(f"{value.name!r} is neither a Cast of float16 nor a float16 constant")
    return weight_constant(op, tensor)


def _norm(op: RewriteBuilder, x: ir.Value, scale: ir.Value, axis: int, epsilon: float) -> ir.Value:
    out: ir.Value = op.RMSNormalization(x, scale, axis=axis, epsilon=epsilon, stash_type=1)
    out.type, out.shape = x.type, x.shape
    return out


def _plain(op: RewriteBuilder, x: ir.Value, s: ir.Value, axis: int, epsilon: float) -> ir.Value:
    """RMSNormalization(x, float16(s)) in float16"""
    return _norm(op, x, _half(op, s), axis, epsilon)


def _check_gated(x: ir.Value, w: ir.Value, g: ir.Value, axis: int, match: Match) -> Verdict:
    if x.dtype != _HALF:
        return fail(f"x is {x.dtype}, not float16", x)
    product = match.outputs[0]
    if product.is_graph_output():
        return fail("the float32 product is read by more than Casts to float16", product)
    for use in product.uses():
        node = use.node
        if node.op_type != "Cast" or node.attributes.get_int("to") != _HALF:
            return fail("the float32 product is read by more than Casts to float16", product)
    return gated_norm.check_gated(x, w, g, axis)


def _gated(op: RewriteBuilder, x: ir.Value, w: ir.Value, g: ir.Value, epsilon: float) -> ir.Value:
    """Cast(GatedRMSNorm(x, w, g, activation="silu"), to=float), read by Casts to float16"""
    out = gated_norm.gated_rms_norm(op, x, w, g, epsilon)
    wide: ir.Value = op.Cast(out, to=_FLOAT)
    wide.dtype, wide.shape = ir.DataType.FLOAT, out.shape
    return wide


def _check_round_trip(h: ir.Value, to: int) -> Verdict:
    if h.dtype != _HALF or to != _HALF:
        return fail(f"casts {h.dtype} to float32 and to {ir.DataType(to)}: not float16 both", h)
    return True


def _round_trip(op: RewriteBuilder, h: ir.Value) -> ir.Value:
    """h (float16 → float32 → float16 is exact)"""
    return h


def _offset_scale(op: RewriteBuilder, s: ir.Value, c: ir.Value) -> ir.Value:
    """``Cast(s + c, to=float16)``: the sum in float32 (onnxruntime folds it at load; its CPU
    kernels, which fold, have no float16 ``Add``), rounded once."""
    offset = const_tensor(c)
    if offset is None:  # (the check saw a constant)
        raise RewriteError(f"the offset {c.name!r} of a norm's scale is not a constant")
    # (the offset as a constant of the rewrite's own, as skip_norm's rules write it: the old one,
    # shared by the norms of every layer, stays outside the replaced module call)
    total = op.Add(s, weight_constant(op, offset))
    total.dtype, total.shape = ir.DataType.FLOAT, s.shape
    scale: ir.Value = op.Cast(total, to=int(_HALF))
    scale.dtype, scale.shape = _HALF, s.shape
    return scale


def _offset(
    op: RewriteBuilder, x: ir.Value, s: ir.Value, c: ir.Value, axis: int, epsilon: float
) -> ir.Value:
    """RMSNormalization(x, float16(s) + float16(c)) in float16"""
    return _norm(op, x, _offset_scale(op, s, c), axis, epsilon)


def _skip(
    op: RewriteBuilder, a: ir.Value, b: ir.Value, s: ir.Value, epsilon: float
) -> tuple[ir.Value, ir.Value]:
    """SkipSimplifiedLayerNormalization(a, b, float16(s)) → (normalized, a + b)"""
    return skip_norm.skip_simplified(op, a, b, _half(op, s), epsilon)


def _skip_offset(
    op: RewriteBuilder, a: ir.Value, b: ir.Value, s: ir.Value, c: ir.Value, epsilon: float
) -> tuple[ir.Value, ir.Value]:
    """SkipSimplifiedLayerNormalization(a, b, float16(s) + float16(c)) → (normalized, a + b)"""
    return skip_norm.skip_simplified(op, a, b, _offset_scale(op, s, c), epsilon)


rules = RuleSet(
    "ort_half_norm",
    [
        Rule(  # Cast(RMSNorm(Cast(x, f32), Cast(w, f32) + c), f16) = RMSNorm(x, w + c)
            "HalfRMSNormalizationOffset",
            _OFFSET,
            check=_check_offset,
            rewrite=_offset,
        ),
        Rule(  # Cast(RMSNorm(Cast(x, f32), Cast(w, f32)), f16) = RMSNorm(x, w)
            "HalfRMSNormalization",
            _PLAIN,
            check=_check,
            rewrite=_plain,
        ),
        Rule(  # Cast(RMSNorm(x, w), f32) · silu(Cast(g, f32)) = Cast(GatedRMSNorm(x, w, g), f32)
            "HalfGatedRMSNorm",
            _GATED,
            check=_check_gated,
            rewrite=_gated,
        ),
        Rule(  # Cast(Cast(h, f32), f16) = h  (h float16)
            "HalfRoundTripCast",
            _ROUND_TRIP,
            check=_check_round_trip,
            rewrite=_round_trip,
        ),
    ],
)
"""The float16 RMS-norm rules (for CUDA)."""

skip_rules = RuleSet(
    "ort_half_skip_norm",
    [
        Rule(  # the offset island of a + b, a + b = SkipSimplifiedLayerNormalization(a, b, w + c)
            "HalfSkipSimplifiedLayerNormalizationOffset",
            _SKIP_OFFSET,
            check=_check_skip_offset,
            rewrite=_skip_offset,
        ),
        Rule(  # the island of a + b, a + b = SkipSimplifiedLayerNormalization(a, b, w)
            "HalfSkipSimplifiedLayerNormalization",
            _SKIP,
            check=_check_skip,
            rewrite=_skip,
        ),
    ],
)
"""The same islands of a residual sum, fused with it as :mod:`irkit.rules.ort.skip_norm` does
(in one rewrite: the float16 scale's constants are the rewrite's own, so the norm's module call
is replaced whole). Before :data:`rules`."""
