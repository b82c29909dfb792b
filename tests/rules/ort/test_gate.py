"""The gated delta net's decay gate ``-exp(A) · softplus(a + dt_bias)`` → onnxruntime's
``LinearAttentionGate`` (numbers unchanged); a bias that is not one per head is declined."""

from __future__ import annotations

from tests.rewriting.util import infer_shapes
from tests.rules.ort.support import fire, no_fire, parse


def gate_text(bias: str = "float[8] dt") -> str:
    return (
        f"g (float[2, 3, 8] a, {bias}, float[8] A) => (float[2, 3, 8] g) {{\n"
        "  e = Exp(A)  n = Neg(e)  t = Add(a, dt)  sp = Softplus(t)  g = Mul(n, sp)\n}"
    )


def test_decay_gate_becomes_linear_attention_gate():
    fire(
        infer_shapes(parse(gate_text())),
        "LinearAttentionGate",
        {"Exp": 1, "LinearAttentionGate": 1, "Neg": 1},
    )


def test_a_bias_not_per_head_is_kept():
    no_fire(
        parse(gate_text("float[3, 8] dt")), "LinearAttentionGate", "not a vector of the 8 heads"
    )
