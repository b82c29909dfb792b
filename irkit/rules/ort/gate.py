"""The gated delta net's decay gate → onnxruntime's ``LinearAttentionGate``.

Identity (transformers' ``g = -A_log.exp() * softplus(a + dt_bias)``, after
:mod:`irkit.rules.ort.softplus` made the softplus one op)::

    n · Softplus(a + d) = com.microsoft.LinearAttentionGate(a, d, n)

onnxruntime's contrib op computes ``neg_exp_A · softplus(a + dt_bias)`` per head. One kernel
instead of ``Add``, ``Softplus`` and ``Mul`` per layer and step.

Its optional fourth input ``b`` gives ``sigmoid(b)`` as a second output: the update rate ``β``
that feeds the same ``LinearAttention`` as the decay joins the gate (``LinearAttentionGateBeta``;
the match starts at the ``LinearAttention``, where the two meet), each through the mask it is
multiplied by (irkit's export holds the state at pads with ``decay · m`` and ``β · m``)::

    LinearAttention(q, k, v, S, LinearAttentionGate(a, d, n) [· m₁], Sigmoid(b) [· m₂])
      = LinearAttention(q, k, v, S, g [· m₁], β [· m₂])
        where g, β = LinearAttentionGate(a, d, n, b)

Preconditions (declined with the reason, ``irkit.explain``): ``a`` 3-D ``(B, S, H)`` (the layout
the kernel was checked on), ``d`` and ``n`` vectors of the heads, ``(H,)``, with ``a``'s last dim
the static ``H`` (the op's per-head layout; any other broadcast is not its), all float32. For
``β``: ``b`` float32 of ``a``'s shape, the gate and the ``Sigmoid`` (and their masks' ``Mul``)
used by that ``LinearAttention`` only.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from irkit._irutil import node_attributes
from irkit.rewriting import (
    Match,
    RewriteBuilder,
    Rule,
    RuleSet,
    Verdict,
    dims,
    either,
    fail,
    op,
    optional,
    var,
)

__all__ = ["rules"]

MS = "com.microsoft"
a, d, n, b = var("a"), var("d"), var("n"), var("b")
_GATE = op.domain(MS).LinearAttentionGate(a, d, n)
_BETA = op.Sigmoid(b)
_LINEAR_ATTENTION = op.domain(MS).LinearAttention(
    var("q"),
    var("k"),
    var("v"),
    optional(var("state")),
    either(_GATE * var("m1"), _GATE),
    either(_BETA * var("m2"), _BETA),
    _outputs=2,
)


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


def _check_beta(a: ir.Value, b: ir.Value) -> Verdict:
    # (the gate, the Sigmoid and the masks' Mul used elsewhere: the engine declines the match)
    if b.dtype != ir.DataType.FLOAT or dims(b) is None or dims(b) != dims(a):
        return fail(f"b is not float32 of the gate input's shape {dims(a)}", b)
    return True


def _with_beta(
    op: RewriteBuilder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    state: ir.Value | None,
    a: ir.Value,
    d: ir.Value,
    n: ir.Value,
    b: ir.Value,
    m1: ir.Value | None,
    m2: ir.Value | None,
    match: Match,
) -> tuple[Any, Any]:
    """LinearAttention(q, k, v, S, g [· m₁], β [· m₂]), g, β = LinearAttentionGate(a, d, n, b)"""
    attention = next(x for x in match.nodes if x.op_type == "LinearAttention")
    decay, beta = op.domain(MS).LinearAttentionGate(a, d, n, b, _outputs=2)
    for value in (decay, beta):  # (checkers know no contrib op's type inference)
        value.type, value.shape = a.type, a.shape
    if m1 is not None:
        decay = op.Mul(decay, m1)
    if m2 is not None:
        beta = op.Mul(beta, m2)
    out, final = op.domain(MS).LinearAttention(
        q, k, v, state, decay, beta, _outputs=2, **node_attributes(attention)
    )
    out.type, out.shape = attention.outputs[0].type, attention.outputs[0].shape
    final.type, final.shape = attention.outputs[1].type, attention.outputs[1].shape
    return out, final


rules = RuleSet(
    "ort_gate",
    [
        Rule(  # n · Softplus(a + d) = LinearAttentionGate(a, d, n)
            "LinearAttentionGate",
            n * op.Softplus(a + d),
            check=_check,
            rewrite=lambda op, a, d, n: op.domain(MS).LinearAttentionGate(a, d, n),
        ),
        Rule(  # LinearAttention(…, Gate(a, d, n) · m₁, Sigmoid(b) · m₂) = … Gate(a, d, n, b) …
            "LinearAttentionGateBeta",
            _LINEAR_ATTENTION,
            check=_check_beta,
            rewrite=_with_beta,
        ),
    ],
)
"""The gate rule."""
