"""Rule family :mod:`irkit.rules.layer_norm`: each rule fires (golden, numbers) and declines (exact reason)."""

from __future__ import annotations

from tests.rules.support import fire, no_fire, parse

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
    m = parse(LN.format(square="Pow(d, two)", tail="Add(nw, b)"))
    fire(m, "LayerNormalization", {"LayerNormalization": 1}, "layer_norm")


def test_layer_norm_no_bias_mul_square():
    m = parse(LN.format(square="Mul(d, d)", tail="Identity(nw)"))
    fire(m, "LayerNormalization", {"Constant": 1, "LayerNormalization": 1})  # `two`: unused
    (ln,) = [n for n in m.graph if n.op_type == "LayerNormalization"]
    assert len(ln.inputs) == 2  # no bias


def test_layer_norm_opset17_axes_attribute():
    m = parse(LN17, opset=17)
    fire(m, "LayerNormalization", {"LayerNormalization": 1})


def test_layer_norm_not_trailing_axis():
    m = parse(
        LN.format(square="Pow(d, two)", tail="Add(nw, b)")
        .replace("{-1}", "{1}")
        .replace("float[8] w, float[8] b", "float[5,1] w, float[5,1] b")
    )
    no_fire(m, "LayerNormalization", "axes [1] are not the trailing axes of a rank-3 input")


def test_layer_norm_broadcast_scale_rejected():
    m = parse(
        LN.format(square="Pow(d, two)", tail="Add(nw, b)").replace("float[8] w", "float[1] w")
    )
    no_fire(m, "LayerNormalization", "scale shape (1,) is not the normalized shape (8,)")
