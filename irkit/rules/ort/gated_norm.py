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

A per-head norm that the model runs on rows of one head (``Qwen3_5RMSNormGated`` on
``reshape(-1, C)``, then ``reshape(batch, seq, -1)``) is the contrib op on the packed tensor, its
groups the same ``C`` consecutive elements (``GatedRMSNormPacked``)::

    Reshape(GatedRMSNorm(Reshape(x, s₁), w, Reshape(g, s₂)), s₃) = GatedRMSNorm(x, w, g)

when ``x``, ``g`` and the result have the same known dims, the inner reshapes give 2-D rows of
``C = len(w)`` (a reshape keeps the row-major order, so each row is a trailing group of ``x``) and
``C`` divides ``x``'s last dim. Per layer and step three reshapes go, and the computed
``(batch, seq, -1)`` target with them.
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import (
    Match,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    attr,
    dims,
    fail,
    op,
    var,
)
from irkit.rules._ort_types import ORT_FLOAT_TYPES

__all__ = ["rules"]

MS = "com.microsoft"

x, w, g = var("x"), var("w"), var("g")
_NORM = op.RMSNormalization(x, w, axis=attr("axis"), epsilon=attr("epsilon"), stash_type=1)
_GATED = _NORM * (g * op.Sigmoid(g))


def check_gated(x: ir.Value, w: ir.Value, g: ir.Value, axis: int) -> Verdict:
    """The preconditions of the module docstring (for :mod:`irkit.rules.ort.half_norm` too)."""
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


def gated_rms_norm(
    op: RewriteBuilder, x: ir.Value, w: ir.Value, g: ir.Value, epsilon: float
) -> ir.Value:
    """GatedRMSNorm(x, w, g, activation="silu", epsilon=eps)"""
    out: ir.Value = op.domain(MS).GatedRMSNorm(x, w, g, activation="silu", epsilon=epsilon)
    out.type, out.shape = x.type, x.shape  # (checkers know no contrib op's type inference)
    return out


_ROWS = op.domain(MS).GatedRMSNorm(
    op.Reshape(x, var("s1")),
    w,
    op.Reshape(g, var("s2")),
    activation=attr("activation"),
    epsilon=attr("epsilon"),
)
_PACKED = op.Reshape(_ROWS, var("s3"))


def _check_packed(x: ir.Value, w: ir.Value, g: ir.Value, match: Match) -> Verdict:
    dx, dg, dw, out = dims(x), dims(g), dims(w), dims(match.outputs[0])
    if dx is None or None in dx or dx != dg or dx != out:
        return fail(f"x, g and the result have not the same known dims: {dx}, {dg}, {out}", x)
    if dw is None or len(dw) != 1 or not isinstance(dw[0], int) or not isinstance(dx[-1], int):
        return fail("the scale is not a vector of known length", w)
    if dx[-1] % dw[0]:
        return fail(f"the groups of {dw[0]} do not divide x's last dim {dx[-1]}", x)
    norm = next(n for n in match.nodes if n.op_type == "GatedRMSNorm")
    for rows in (norm.inputs[0], norm.inputs[2]):
        if rows is None or dims(rows) is None or len(dims(rows) or ()) != 2:
            return fail("the norm's input is not 2-D rows", rows)
        if (dims(rows) or ())[-1] != dw[0]:
            return fail(f"the rows are not of the scale's length {dw[0]}", rows)
    return True


def _gated_rms_norm_packed(
    op: RewriteBuilder, x: ir.Value, w: ir.Value, g: ir.Value, activation: str, epsilon: float
) -> ir.Value:
    """GatedRMSNorm(x, w, g) on the packed tensor"""
    out: ir.Value = op.domain(MS).GatedRMSNorm(x, w, g, activation=activation, epsilon=epsilon)
    out.type, out.shape = x.type, x.shape  # (checkers know no contrib op's type inference)
    return out


rules = RuleSet(
    "ort_gated_norm",
    [
        Rule(  # RMSNorm(x, w) · silu(g) = GatedRMSNorm(x, w, g)
            "GatedRMSNorm",
            _GATED,
            check=check_gated,
            rewrite=gated_rms_norm,
        ),
        Rule(  # Reshape(GatedRMSNorm(rows(x), w, rows(g)), shape(x)) = GatedRMSNorm(x, w, g)
            "GatedRMSNormPacked",
            _PACKED,
            check=_check_packed,
            rewrite=_gated_rms_norm_packed,
        ),
    ],
)
"""The gated-norm rules."""
