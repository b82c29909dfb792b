"""irkit's rule library: one family of rewrite rules per module, each exporting ``rules``.

The library sits one layer above the engine (:mod:`irkit.rewriting`): it imports the engine,
never the reverse (a ruff ``banned-api`` rule in ``irkit/rewriting/ruff.toml`` enforces it).

============================  ======================================================
module                        identity
============================  ======================================================
:mod:`irkit.rules.cleanup`     no-op Identity/Cast/Reshape/Transpose/Expand, pairs that collapse
:mod:`irkit.rules.gemm`        ``MatMul + Add → Gemm`` (2-D, legal bias broadcast)
:mod:`irkit.rules.gelu`        erf / tanh GELU → ``Gelu`` (opset ≥ 20)
:mod:`irkit.rules.layer_norm`  decomposed layer norm → ``LayerNormalization`` (opset ≥ 17)
:mod:`irkit.rules.rms_norm`    decomposed RMS norm → ``RMSNormalization`` (opset ≥ 23)
:mod:`irkit.rules.attention`   decomposed attention (+GQA, KV cache) → ``Attention`` (opset ≥ 23)
:mod:`irkit.rules.rotary`      rotate-half / interleaved rotary → ``RotaryEmbedding`` (opset ≥ 23)
:mod:`irkit.rules.uniform`     reads of a broadcast axis at index 0; scatters that write back
                              what is there (text positions' M-RoPE) → their input
:mod:`irkit.rules.reshape`     a ``Reshape`` to a computed shape the known shapes give → a
                              constant target
:mod:`irkit.rules.index`       ``Slice(GatherElements(d, i))`` → ``GatherElements(d, Slice(i))``
:mod:`irkit.rules.arith`       ``x + 0``, ``x · 1`` … → ``x``; a per-column scale folded into a weight
:mod:`irkit.rules.glue`        shape-keeping ``Reshape`` → ``x``; head reshapes → 3-D ``Attention``
:mod:`irkit.rules.unit_axes`   a ``Reshape`` appending unit dims → ``Unsqueeze``; an ``Unsqueeze``
                              of a ``keepdims=0`` reduction → ``keepdims=1`` (``"ort"`` target)
:mod:`irkit.rules.packed`      ``x @ W₁ … x @ Wₙ`` → one ``MatMul`` + ``Split`` (Q/K/V, n ≥ 3); a pair back to two
:mod:`irkit.rules.quantize`    constant-weight MatMul/FusedMatMul/Gemm → ``MatMulNBits`` (a pass:
                              :func:`irkit.quantize`, not in any default rule set)
:mod:`irkit.rules.decode`      after quantizing: residual add + RMSNorm →
                              ``SkipSimplifiedLayerNormalization``, SiLU → ``QuickGelu``, the
                              causal mask → ``is_causal=1``, rotary angles → tables read
                              at the position ids (:func:`irkit.rules.decode.quantized_rules`)
============================  ======================================================

The ``"ort"`` target's contrib-op rules live in :mod:`irkit.rules.ort` (imported on demand).

>>> from irkit.rules import default_rules
>>> default_rules().names()[:2]
['IdentityElimination', 'NoOpCast']
"""

from __future__ import annotations

from irkit.rewriting import RuleSet
from irkit.rules import (
    arith,
    attention,
    cleanup,
    decode,
    gelu,
    gemm,
    glue,
    index,
    layer_norm,
    packed,
    reshape,
    rms_norm,
    rotary,
    uniform,
    unit_axes,
)

__all__ = [
    "arith",
    "attention",
    "cleanup",
    "decode",
    "gelu",
    "gemm",
    "glue",
    "index",
    "layer_norm",
    "packed",
    "reshape",
    "rms_norm",
    "rotary",
    "uniform",
    "unit_axes",
    "default_rules",
    "fusion_rules",
    "onnx_target_rules",
]


def fusion_rules() -> RuleSet:
    """Fusions into standard ONNX ops (each gated on the opset that introduced the op)."""
    return RuleSet(
        "fusions",
        [
            layer_norm.rules,
            rms_norm.rules,
            gelu.rules,
            gemm.rules,
            attention.rules,
            rotary.rules,
        ],
    )


def default_rules() -> RuleSet:
    """Cleanup then fusions (what the ``"ort"`` target starts from)."""
    return RuleSet(
        "default",
        [cleanup.rules, uniform.rules, fusion_rules(), arith.rules, reshape.rules, index.rules],
    )


def onnx_target_rules() -> RuleSet:
    """What :func:`irkit.optimize` uses for ``target="onnx"``: :func:`default_rules`, then the
    decode-step glue (:mod:`irkit.rules.glue`) and the packed projections
    (:mod:`irkit.rules.packed`). The ``"ort"`` target leaves both to its contrib rules (its
    attention fusions take the 4-D form)."""
    return RuleSet("onnx", [default_rules(), glue.rules, packed.rules])
