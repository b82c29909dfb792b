"""torch's thresholded softplus → ``Softplus`` (onnxruntime's kernel is overflow-safe).

Identity (torch's ``softplus(x, beta=1, threshold=t)`` as torchlib lowers it; ``t ≥ 20``)::

    Where(x > t, x, Softplus(x) / 1) = Softplus(x)

For ``x > t ≥ 20``, ``log(1 + exp(x)) = x + log1p(exp(−x))`` differs from ``x`` by less than
``exp(−20) ≈ 2e-9``, under half a unit in the last place of ``x`` in float32 and float16, so both
sides round to the same number; onnxruntime computes ``Softplus`` without overflow (``x`` for
large ``x``, measured with onnxruntime 1.32 up to 1e3). The linear-attention gates
(``softplus(a + dt_bias)``) carry this chain once per layer and token.

Preconditions (declined with the reason, ``irkit.explain``): ``beta`` the scalar 1, the
threshold a scalar ≥ 20. The ``CastLike`` torchlib puts on each constant may be there or folded.
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import RewriteBuilder, Rule, RuleSet, Verdict, either, fail, op, scalar, var

__all__ = ["rules"]

x, b, t = var("x"), var("b"), var("t")
_SP = op.Softplus(x)
_THRESHOLDED = op.Where(
    op.Greater(x, either(op.CastLike(t, x), t)), x, op.Div(_SP, either(op.CastLike(b, _SP), b))
)

_MIN_THRESHOLD = 20.0


def _check(x: ir.Value, b: ir.Value, t: ir.Value) -> Verdict:
    if scalar(b) != 1.0:
        return fail(f"beta {scalar(b)} is not the constant 1", b)
    threshold = scalar(t)
    if threshold is None or threshold < _MIN_THRESHOLD:
        return fail(f"threshold {threshold} is not a constant ≥ {_MIN_THRESHOLD:g}", t)
    return True


def _softplus(op: RewriteBuilder, x: ir.Value) -> ir.Value:
    """Softplus(x)"""
    out: ir.Value = op.Softplus(x)
    return out


rules = RuleSet(
    "ort_softplus",
    [
        Rule("Softplus", _THRESHOLDED, check=_check, rewrite=_softplus)
    ],  # Where(x>t, x, sp(x)) = sp(x)
)
"""The softplus rules."""
