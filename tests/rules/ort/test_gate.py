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


def attention_text(masked: bool = True, beta_elsewhere: bool = False) -> str:
    """A gated delta step as irkit's export leaves it on the ort target: the decay gate and
    ``Sigmoid(b)``, each times the padding mask ``m`` (or not), into ``LinearAttention``."""
    hold = (
        "  g = Mul(g0, m)  beta = Mul(beta0, m)\n"
        if masked
        else "  g = Identity(g0)  beta = Identity(beta0)\n"
    )
    extra = ", float[2, 3, 8] beta_out" if beta_elsewhere else ""
    copy = "  beta_out = Identity(beta0)\n" if beta_elsewhere else ""
    return (
        "g (float[2, 3, 16] q, float[2, 3, 16] k, float[2, 3, 64] v, float[2, 8, 8, 8] s,"
        " float[2, 3, 8] a, float[2, 3, 8] b, float[8] dt, float[8] A, float[2, 3, 1] m)"
        f" => (float[2, 3, 64] y, float[2, 8, 8, 8] s1{extra}) {{\n"
        "  e = Exp(A)  n = Neg(e)\n"
        "  g0 = com.microsoft.LinearAttentionGate(a, dt, n)\n"
        "  beta0 = Sigmoid(b)\n"
        f"{hold}{copy}"
        "  y, s1 = com.microsoft.LinearAttention<q_num_heads=2, kv_num_heads=8,"
        ' update_rule="gated_delta", scale=1.0>(q, k, v, s, g, beta)\n}'
    )


def test_update_rate_joins_the_gate_through_the_masks():
    """``Sigmoid(b)`` becomes the gate's second output (4 inputs); the masks stay; onnxruntime's
    numbers before and after agree."""
    model = infer_shapes(parse(attention_text()))
    fire(
        model,
        "LinearAttentionGateBeta",
        {"Exp": 1, "LinearAttention": 1, "LinearAttentionGate": 1, "Mul": 2, "Neg": 1},
    )
    (gate,) = [x for x in model.graph if x.op_type == "LinearAttentionGate"]
    assert len(gate.inputs) == 4 and len(gate.outputs) == 2


def test_update_rate_joins_the_gate_without_masks():
    fire(
        infer_shapes(parse(attention_text(masked=False))),
        "LinearAttentionGateBeta",
        {"Exp": 1, "LinearAttention": 1, "LinearAttentionGate": 1, "Neg": 1},
    )


def test_an_update_rate_used_elsewhere_stays_a_sigmoid():
    no_fire(
        infer_shapes(parse(attention_text(beta_elsewhere=True))),
        "LinearAttentionGateBeta",
        "an intermediate value of the match is used outside it",
    )


def test_an_update_rate_of_another_shape_stays_a_sigmoid():
    no_fire(
        infer_shapes(parse(attention_text().replace("float[2, 3, 8] b", "float[2, 3, 1] b"))),
        "LinearAttentionGateBeta",
        "b is not float32 of the gate input's shape",
    )
