"""RMS norm gated by SiLU → onnxruntime's ``GatedRMSNorm``.

Identity (``com.microsoft::GatedRMSNorm``, onnxruntime ≥ 1.25; the gated norm of Mamba2 and of
the gated delta net's output, ``Qwen3_5RMSNormGated`` and its kin)::

    RMSNormalization(x, w, axis=-1, eps) · (g · Sigmoid(g))
      = GatedRMSNorm(x, w, g, activation="silu", epsilon=eps)

The contrib op normalizes each trailing group of ``C = len(w)`` elements, computes in float32
(as ``stash_type=1``) and multiplies by the gate's SiLU; with ``x``'s last axis exactly ``C`` it
is the left side in one kernel.

Preconditions (each declined with the reason, ``irkit.explain``): the norm normalizes the last
axis only, ``stash_type`` float32; ``x`` and ``g`` float32 (or both float16) with the same known
dims; ``w`` 1-D of ``x``'s last dim.
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import RewriteBuilder, Rule, RuleSet, Verdict, attr, dims, fail, op, var
from irkit.rules._ort_types import ORT_FLOAT_TYPES

__all__ = ["rules"]

MS = "com.microsoft"

x, w, g = var("x"), var("w"), var("g")
_NORM = op.RMSNormalization(x, w, axis=attr("axis"), epsilon=attr("epsilon"), stash_type=1)
_GATED = _NORM * (g * op.Sigmoid(g))


def _check(x: ir.Value, w: ir.Value, g: ir.Value, axis: int) -> Verdict:
    dx, dg, dw = dims(x), dims(g), dims(w)
    if dx is None or dg is None:
        return fail("input ranks unknown", x if dx is None else g)
    if axis not in (-1, len(dx) - 1):
        return fail(f"normalizes from axis {axis}; the contrib op normalizes the last axis", x)
    if x.dtype not in ORT_FLOAT_TYPES or g.dtype != x.dtype:
        return fail(f"dtypes {x.dtype}, {g.dtype}: need float16/float32, both the same", g)
    if dx != dg or any(d is None for d in dx):
        return fail(f"input and gate shapes {list(dx)}, {list(dg)} differ or are unknown", g)
    if dw is None or dw != dx[-1:]:
        return fail(f"scale shape {dw} is not [{dx[-1]}]", w)
    return True


def _gated_rms_norm(
    op: RewriteBuilder, x: ir.Value, w: ir.Value, g: ir.Value, epsilon: float
) -> ir.Value:
    """GatedRMSNorm(x, w, g, activation="silu", epsilon=eps)"""
    out: ir.Value = op.domain(MS).GatedRMSNorm(x, w, g, activation="silu", epsilon=epsilon)
    out.type, out.shape = x.type, x.shape  # (checkers know no contrib op's type inference)
    return out


rules = RuleSet(
    "ort_gated_norm",
    [
        Rule(  # RMSNorm(x, w) · silu(g) = GatedRMSNorm(x, w, g)
            "GatedRMSNorm",
            _GATED,
            check=_check,
            rewrite=_gated_rms_norm,
        )
    ],
)
"""The gated-norm rules."""
