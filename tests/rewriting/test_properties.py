"""Property: the rewritten model computes what the original computes, over random shapes."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from irkit import rules as library
from tests.rewriting import util

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


def _shape(dims) -> str:
    return ",".join(str(d) for d in dims)


def _check(text: str, expect_rule: str | None, opset: int) -> None:
    m = util.model(f'<ir_version: 10, opset_import: ["" : {opset}]>\n' + text)
    m = util.infer_shapes(m)
    before = util.clone(m)
    report = util.rewrite(m, library.default_rules())
    if expect_rule:
        assert report.rules[expect_rule].fired == 1, str(report)
    util.assert_valid(m)
    util.assert_same_numbers(before, m, atol=1e-4)


@SETTINGS
@given(shapes, st.booleans())
def test_gelu_forms(dims, tanh):
    s = _shape(dims)
    if tanh:
        body = """h = Constant<value=float {0.5}>()  k = Constant<value=float {0.044715}>()
          c = Constant<value=float {0.7978845608}>()  one = Constant<value=float {1.0}>()
          p = Mul(x, x)  p3 = Mul(p, x)  q = Mul(p3, k)  r = Add(q, x)  t = Mul(r, c)
          u = Tanh(t)  v = Add(one, u)  w = Mul(x, v)  y = Mul(w, h)"""
    else:
        body = """h = Constant<value=float {0.5}>()  c = Constant<value=float {0.70710678}>()
          one = Constant<value=float {1.0}>()
          b = Mul(c, x)  e = Erf(b)  f = Add(e, one)  g = Mul(f, h)  y = Mul(x, g)"""
    _check(
        f"g (float[{s}] x) => (float[{s}] y) {{ {body} }}", "GeluTanh" if tanh else "GeluErf", 20
    )


@SETTINGS
@given(shapes, st.integers(1, 2), st.booleans())
def test_layer_norm(dims, n_axes, bias):
    n_axes = min(n_axes, len(dims))
    norm = dims[-n_axes:]
    axes = ", ".join(str(-i - 1) for i in range(n_axes))
    s, ns = _shape(dims), _shape(norm)
    tail = "y = Add(nw, b)" if bias else "y = Identity(nw)"
    _check(
        f"""g (float[{s}] x, float[{ns}] w, float[{ns}] b) => (float[{s}] y) {{
      ax = Constant<value=int64[{n_axes}] {{{axes}}}>()  two = Constant<value=float {{2.0}}>()
      eps = Constant<value=float {{1e-5}}>()
      m = ReduceMean(x, ax)  d = Sub(x, m)  p = Pow(d, two)  v = ReduceMean(p, ax)
      ve = Add(v, eps)  sd = Sqrt(ve)  n = Div(d, sd)  nw = Mul(n, w)  {tail} }}""",
        "LayerNormalization",
        18,
    )


@SETTINGS
@given(shapes)
def test_rms_norm(dims):
    s, ns = _shape(dims), _shape(dims[-1:])
    _check(
        f"""g (float[{s}] x, float[{ns}] w) => (float[{s}] y) {{
      ax = Constant<value=int64[1] {{-1}}>()  two = Constant<value=float {{2.0}}>()
      eps = Constant<value=float {{1e-6}}>()
      p = Pow(x, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)  sd = Sqrt(ve)  r = Reciprocal(sd)
      n = Mul(x, r)  y = Mul(n, w) }}""",
        "RMSNormalization",
        23,
    )


@SETTINGS
@given(
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(1, 5),
    st.sampled_from(["N", "1", "M,N", "M,1", "1,N", "1,1", "K,M,N"]),
)
def test_matmul_add(m, k, n, bias):
    bshape = bias.replace("M", str(m)).replace("N", str(n)).replace("K", "2")
    out = f"2,{m},{n}" if bias.startswith("K") else f"{m},{n}"
    legal = not bias.startswith("K")
    _check(
        f"""g (float[{m},{k}] a, float[{k},{n}] b, float[{bshape}] c) => (float[{out}] y) {{
      t = MatMul(a, b)  y = Add(c, t) }}""",
        "MatMulAddToGemm" if legal else None,
        18,
    )


@SETTINGS
@given(st.permutations(range(3)), st.permutations(range(3)))
def test_transpose_pairs(p1, p2):
    _check(
        f"""g (float[2,3,4] x) => (y) {{
      t = Transpose<perm=[{_shape(p1)}]>(x)  y = Transpose<perm=[{_shape(p2)}]>(t) }}""",
        "TransposeTranspose",
        18,
    )


@SETTINGS
@given(st.sampled_from(list(itertools.permutations([2, 3, 4]))), st.booleans())
def test_reshape_pairs(target, minus_one):
    inner = "24" if not minus_one else "-1"
    _check(
        f"""g (float[2,3,4] x) => (y) {{
      s1 = Constant<value=int64[1] {{{inner}}}>()  s2 = Constant<value=int64[3] {{{_shape(target)}}}>()
      t = Reshape(x, s1)  y = Reshape(t, s2) }}""",
        "ReshapeReshape",
        18,
    )
