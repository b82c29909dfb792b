"""Every library rule: fires (golden + onnxruntime numbers) and does not fire (exact reason)."""

from __future__ import annotations

import pytest

from irkit import rules as library
from tests.rewriting import util

H = '<ir_version: 10, opset_import: ["" : {opset}]>'


def _m(body: str, opset: int = 18):
    return util.model(H.format(opset=opset) + body)


def fire(m, rule_name: str, expect_ops: dict[str, int], golden: str | None = None):
    """Apply the default rules; the named rule fires, numbers agree, the graph stays valid."""
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    assert report.rules[rule_name].fired >= 1, str(report)
    assert util.ops(m) == expect_ops
    util.assert_valid(m)
    util.assert_same_numbers(before, m)
    if golden:
        util.assert_golden(m, golden)
    return report


def no_fire(m, rule_name: str, reason: str):
    report = util.rewrite(m, library.default_rules())
    stats = report.rules[rule_name]
    assert stats.fired == 0 and stats.tried >= 1
    assert reason in stats.failures, dict(stats.failures)


# --- cleanup -----------------------------------------------------------------------------------


def test_identity_fires():
    m = _m("g (float[2,3] x) => (float[2,3] y) { t = Identity(x)  y = Relu(t) }")
    fire(m, "IdentityElimination", {"Relu": 1}, "identity")


def test_identity_kept_between_graph_input_and_output():
    m = _m("g (float[2,3] x) => (float[2,3] y) { y = Identity(x) }")
    no_fire(
        m,
        "IdentityElimination",
        "needed: connects a graph input/initializer/output to a graph output",
    )
    assert util.ops(m) == {"Identity": 1}


def test_identity_before_graph_output_moves_the_name():
    m = _m("g (float[2,3] x) => (float[2,3] y) { t = Relu(x)  y = Identity(t) }")
    fire(m, "IdentityElimination", {"Relu": 1})
    assert [o.name for o in m.graph.outputs] == ["y"]
    assert m.graph.outputs[0].producer().op_type == "Relu"


def test_noop_cast():
    m = _m("g (float[2,3] x) => (float[2,3] y) { t = Cast<to=1>(x)  y = Relu(t) }")
    fire(m, "NoOpCast", {"Relu": 1})


def test_real_cast_kept():
    m = _m("g (float[2,3] x) => (float16[2,3] y) { y = Cast<to=10>(x) }")
    no_fire(m, "NoOpCast", "casts FLOAT to FLOAT16")


def test_noop_reshape():
    m = _m(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ s = Constant<value=int64[2] {2, -1}>()  t = Reshape(x, s)  y = Relu(t) }"
    )
    fire(m, "NoOpReshape", {"Relu": 1})


def test_real_reshape_kept():
    m = _m(
        "g (float[2,3] x) => (float[3,2] y) "
        "{ s = Constant<value=int64[2] {3, 2}>()  y = Reshape(x, s) }"
    )
    no_fire(m, "NoOpReshape", "target [3, 2] differs from input shape [2, 3]")


def test_reshape_reshape():
    m = _m(
        "g (float[2,3] x) => (float[3,2] y) { s1 = Constant<value=int64[1] {6}>() "
        "s2 = Constant<value=int64[2] {3, 2}>()  t = Reshape(x, s1)  y = Reshape(t, s2) }"
    )
    fire(m, "ReshapeReshape", {"Constant": 1, "Reshape": 1}, "reshape_reshape")


def test_reshape_reshape_with_zero_kept():
    m = _m(
        "g (float[2,3] x) => (float[6] y) { s1 = Constant<value=int64[2] {3, 2}>() "
        "s2 = Constant<value=int64[2] {0, -1}>()  t = Reshape(x, s1)  y = Reshape(t, s2) }"
    )
    no_fire(m, "ReshapeReshape", "outer shape copies a dim (0) of the inner result")


def test_transpose_transpose_cancels():
    m = _m(
        "g (float[2,3,4] x) => (float[2,3,4] y) "
        "{ t = Transpose<perm=[1,0,2]>(x)  u = Transpose<perm=[1,0,2]>(t)  y = Relu(u) }"
    )
    report = fire(m, "TransposeTranspose", {"Relu": 1})
    assert report.fired == {"TransposeTranspose": 1, "NoOpTranspose": 1}


def test_transpose_transpose_composes():
    m = _m(
        "g (float[2,3,4] x) => (float[4,2,3] y) "
        "{ t = Transpose<perm=[1,0,2]>(x)  y = Transpose<perm=[2,1,0]>(t) }"
    )
    fire(m, "TransposeTranspose", {"Transpose": 1}, "transpose_compose")
    assert list(m.graph.node(0).attributes["perm"].value) == [2, 0, 1]


def test_transpose_without_perm_kept():
    m = _m("g (float[2,3] x) => (float[2,3] y) { t = Transpose(x)  y = Transpose(t) }")
    no_fire(m, "TransposeTranspose", "a Transpose without explicit perm")


def test_noop_transpose_kept_when_permuting():
    m = _m("g (float[2,3] x) => (float[3,2] y) { y = Transpose<perm=[1,0]>(x) }")
    no_fire(m, "NoOpTranspose", "perm (1, 0) is not the identity")


def test_noop_expand():
    m = _m(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ s = Constant<value=int64[2] {1, 3}>()  t = Expand(x, s)  y = Relu(t) }"
    )
    fire(m, "NoOpExpand", {"Relu": 1})


def test_real_expand_kept():
    m = _m(
        "g (float[2,3] x) => (float[4,2,3] y) "
        "{ s = Constant<value=int64[3] {4, 2, 3}>()  y = Expand(x, s) }"
    )
    no_fire(m, "NoOpExpand", "expand adds dimensions")


# --- gemm --------------------------------------------------------------------------------------


def test_matmul_add_to_gemm():
    m = _m(
        "g (float[4,8] a, float[8,16] b, float[16] c) => (float[4,16] y) "
        "{ t = MatMul(a, b)  y = Add(c, t) }"
    )
    fire(m, "MatMulAddToGemm", {"Gemm": 1}, "gemm")


def test_gemm_2d_bias_from_input():
    m = _m(
        "g (float[4,8] a, float[8,16] b, float[4,1] c) => (float[4,16] y) "
        "{ t = MatMul(a, b)  y = Add(t, c) }"
    )
    fire(m, "MatMulAddToGemm", {"Gemm": 1})


def test_gemm_bias_of_unknown_shape():
    m = _m(
        "g (float[4,8] a, float[8,16] b, float[4,1] c) => (float[4,16] y) "
        "{ t = MatMul(a, b)  r = Relu(c)  y = Add(t, r) }"
    )
    no_fire(m, "MatMulAddToGemm", "bias shape unknown")


@pytest.mark.parametrize(
    ("sig", "reason"),
    [
        (
            "float[2,4,8] a, float[8,16] b, float[16] c) => (float[2,4,16] y",
            "A must have rank 2, has 3",
        ),
        (
            "float[4,8] a, float[8,16] b, float[3,4,16] c) => (float[3,4,16] y",
            "bias has rank 3 > 2",
        ),
        (
            "float[4,8] a, float[8,1] b, float[5] c) => (float[4,5] y",
            "bias dim 5 does not broadcast to the 4x1 product",
        ),
    ],
)
def test_gemm_illegal(sig, reason):
    m = _m(f"g ({sig}) {{ t = MatMul(a, b)  y = Add(t, c) }}")
    no_fire(m, "MatMulAddToGemm", reason)


# --- gelu --------------------------------------------------------------------------------------

GELU_ERF = """g (float[2,8] x) => (float[2,8] y) {
  c = Constant<value=float {0.70710678}>()  h = Constant<value=float {0.5}>()
  one = Constant<value=float {1.0}>()
  a = Mul(x, h)  b = Mul(x, c)  e = Erf(b)  f = Add(e, one)  y = Mul(a, f) }"""

GELU_ERF_DIV = """g (float[2,8] x) => (float[2,8] y) {
  c = Constant<value=float {1.41421356}>()  two = Constant<value=float {2.0}>()
  one = Constant<value=float {1.0}>()
  b = Div(x, c)  e = Erf(b)  f = Add(one, e)  a = Mul(f, x)  y = Div(a, two) }"""

GELU_TANH = """g (float[2,8] x) => (float[2,8] y) {
  h = Constant<value=float {0.5}>()  k = Constant<value=float {0.044715}>()
  s = Constant<value=float {0.7978845608}>()  three = Constant<value=float {3.0}>()
  one = Constant<value=float {1.0}>()
  a = Mul(h, x)  p = Pow(x, three)  q = Mul(k, p)  r = Add(x, q)  t = Mul(s, r)
  u = Tanh(t)  v = Add(u, one)  y = Mul(a, v) }"""


@pytest.mark.parametrize(("body", "name"), [(GELU_ERF, "gelu_erf"), (GELU_ERF_DIV, None)])
def test_gelu_erf(body, name):
    m = _m(body, opset=20)
    fire(m, "GeluErf", {"Gelu": 1}, name)


def test_gelu_tanh():
    m = _m(GELU_TANH, opset=20)
    fire(m, "GeluTanh", {"Gelu": 1}, "gelu_tanh")
    assert m.graph.node(0).attributes["approximate"].value == "tanh"


def test_gelu_needs_opset_20():
    no_fire(_m(GELU_ERF, opset=18), "GeluErf", "needs opset >= 20, graph has 18")


def test_gelu_wrong_constant():
    m = _m(GELU_ERF.replace("{0.5}", "{0.6}"), opset=20)
    no_fire(m, "GeluErf", "expected constant 0.5")


def test_gelu_capped_by_target_opset():
    m = _m(GELU_ERF, opset=20)
    report = util.rewrite(m, library.gelu.rules, max_opset=18)
    assert report.rules["GeluErf"].failures == {"needs opset >= 20, target caps 18": 3}


# --- layer norm --------------------------------------------------------------------------------

LN = """g (float[2,5,8] x, float[8] w, float[8] b) => (float[2,5,8] y) {{
  ax = Constant<value=int64[1] {{-1}}>()  two = Constant<value=float {{2.0}}>()
  eps = Constant<value=float {{1e-5}}>()
  m = ReduceMean(x, ax)  d = Sub(x, m)  p = {square}  v = ReduceMean(p, ax)  ve = Add(v, eps)
  s = Sqrt(ve)  n = Div(d, s)  nw = Mul(w, n)  y = {tail} }}"""

LN17 = """g (float[2,5,8] x, float[8] w, float[8] b) => (float[2,5,8] y) {
  two = Constant<value=float {2.0}>()  eps = Constant<value=float {1e-5}>()
  m = ReduceMean<axes=[2]>(x)  d = Sub(x, m)  p = Pow(d, two)  v = ReduceMean<axes=[-1]>(p)
  ve = Add(eps, v)  s = Sqrt(ve)  r = Reciprocal(s)  n = Mul(d, r)  nw = Mul(n, w)  y = Add(b, nw) }"""


def test_layer_norm():
    m = _m(LN.format(square="Pow(d, two)", tail="Add(nw, b)"))
    fire(m, "LayerNormalization", {"LayerNormalization": 1}, "layer_norm")


def test_layer_norm_no_bias_mul_square():
    m = _m(LN.format(square="Mul(d, d)", tail="Identity(nw)"))
    fire(m, "LayerNormalization", {"Constant": 1, "LayerNormalization": 1})  # `two`: unused
    (ln,) = [n for n in m.graph if n.op_type == "LayerNormalization"]
    assert len(ln.inputs) == 2  # no bias


def test_layer_norm_opset17_axes_attribute():
    m = _m(LN17, opset=17)
    fire(m, "LayerNormalization", {"LayerNormalization": 1})


def test_layer_norm_not_trailing_axis():
    m = _m(
        LN.format(square="Pow(d, two)", tail="Add(nw, b)")
        .replace("{-1}", "{1}")
        .replace("float[8] w, float[8] b", "float[5,1] w, float[5,1] b")
    )
    no_fire(m, "LayerNormalization", "axes [1] are not the trailing axes of a rank-3 input")


def test_layer_norm_broadcast_scale_rejected():
    m = _m(LN.format(square="Pow(d, two)", tail="Add(nw, b)").replace("float[8] w", "float[1] w"))
    no_fire(m, "LayerNormalization", "scale shape (1,) is not the normalized shape (8,)")


# --- rms norm ----------------------------------------------------------------------------------

RMS = """g (float[2,5,8] x, float[8] w) => (float[2,5,8] y) {
  ax = Constant<value=int64[1] {-1}>()  two = Constant<value=float {2.0}>()
  eps = Constant<value=float {1e-6}>()
  p = Pow(x, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)  s = Sqrt(ve)  r = Reciprocal(s)
  n = Mul(x, r)  y = Mul(w, n) }"""


def test_rms_norm():
    fire(_m(RMS, opset=23), "RMSNormalization", {"RMSNormalization": 1}, "rms_norm")


def test_rms_norm_needs_opset_23():
    no_fire(_m(RMS, opset=22), "RMSNormalization", "needs opset >= 23, graph has 22")
