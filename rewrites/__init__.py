"""irkit's rule library: one family of rewrite rules per module, each exporting ``rules``.

======================  ==========================================================
module                  identity
======================  ==========================================================
:mod:`rewrites.cleanup`     no-op Identity/Cast/Reshape/Transpose/Expand, pairs that collapse
:mod:`rewrites.gemm`        ``MatMul + Add → Gemm`` (2-D, legal bias broadcast)
:mod:`rewrites.gelu`        erf / tanh GELU → ``Gelu`` (opset ≥ 20)
:mod:`rewrites.layer_norm`  decomposed layer norm → ``LayerNormalization`` (opset ≥ 17)
:mod:`rewrites.rms_norm`    decomposed RMS norm → ``RMSNormalization`` (opset ≥ 23)
======================  ==========================================================

>>> from rewrites import default_rules
>>> default_rules().names()[:2]
['IdentityElimination', 'NoOpCast']
"""

from __future__ import annotations

from irkit.rewriting import RuleSet
from rewrites import cleanup, gelu, gemm, layer_norm, rms_norm

__all__ = ["cleanup", "gelu", "gemm", "layer_norm", "rms_norm", "default_rules", "fusion_rules"]


def fusion_rules() -> RuleSet:
    """Fusions into standard ONNX ops (each gated on the opset that introduced the op)."""
    return RuleSet("fusions", [layer_norm.rules, rms_norm.rules, gelu.rules, gemm.rules])


def default_rules() -> RuleSet:
    """Cleanup then fusions: what :func:`irkit.optimize` uses for ``target="onnx"``."""
    return RuleSet("default", [cleanup.rules, fusion_rules()])
