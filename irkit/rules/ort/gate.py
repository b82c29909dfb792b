"""The gated delta net's decay gate → onnxruntime's ``LinearAttentionGate``.

Identity (transformers' ``g = -A_log.exp() * softplus(a + dt_bias)``, after
:mod:`irkit.rules.ort.softplus` made the softplus one op)::

    n · Softplus(a + d) = com.microsoft.LinearAttentionGate(a, d, n)

onnxruntime's contrib op computes ``neg_exp_A · softplus(a + dt_bias)`` per head (its optional
fourth input ``b`` gives ``sigmoid(b)`` as a second output; not used here, the ``Sigmoid`` of
the update rate stays). One kernel instead of ``Add``, ``Softplus`` and ``Mul`` per layer and
step.

Preconditions (declined with the reason, ``irkit.explain``): ``a`` 3-D ``(B, S, H)`` (the layout
the kernel was checked on), ``d`` and ``n`` vectors of the heads, ``(H,)``, with ``a``'s last dim
the static ``H`` (the op's per-head layout; any other broadcast is not its), all float32.
"""

from __future__ import annotations

import onnx_ir as ir

from irkit.rewriting import Rule, RuleSet, Verdict, dims, fail, op, var

__all__ = ["rules"]

a, d, n = var("a"), var("d"), var("n")


def _check(a: ir.Value, d: ir.Value, n: ir.Value) -> Verdict:
    shape = dims(a)
    if shape is None or len(shape) != 3 or not isinstance(shape[-1], int):
        return fail("the gate input is not (batch, sequence, heads) with static heads", a)
    heads = shape[-1]
    for vector in (d, n):
        if dims(vector) != (heads,):
            return fail(f"not a vector of the {heads} heads", vector)
    if {v.dtype for v in (a, d, n)} != {ir.DataType.FLOAT}:
        return fail("not float32 (onnxruntime's kernel)", a)
    return True


rules = RuleSet(
    "ort_gate",
    [
        Rule(  # n · Softplus(a + d) = LinearAttentionGate(a, d, n)
            "LinearAttentionGate",
            n * op.Softplus(a + d),
            check=_check,
            rewrite=lambda op, a, d, n: op.domain("com.microsoft").LinearAttentionGate(a, d, n),
        ),
    ],
)
"""The gate rule."""
