"""Rule family :mod:`irkit.rules.gelu`: each rule fires (golden, numbers) and declines (exact reason)."""

from __future__ import annotations

import pytest

from irkit import rules as library
from tests.rewriting import util
from tests.rules.support import fire, no_fire, parse

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
    m = parse(body, opset=20)
    fire(m, "GeluErf", {"Gelu": 1}, name)


def test_gelu_tanh():
    m = parse(GELU_TANH, opset=20)
    fire(m, "GeluTanh", {"Gelu": 1}, "gelu_tanh")
    assert m.graph.node(0).attributes["approximate"].value == "tanh"


def test_gelu_needs_opset_20():
    no_fire(parse(GELU_ERF, opset=18), "GeluErf", "needs opset >= 20, graph has 18")


def test_gelu_wrong_constant():
    m = parse(GELU_ERF.replace("{0.5}", "{0.6}"), opset=20)
    no_fire(m, "GeluErf", "expected constant 0.5")


def test_gelu_capped_by_target_opset():
    m = parse(GELU_ERF, opset=20)
    report = util.rewrite(m, library.gelu.rules, max_opset=18)
    assert report.rules["GeluErf"].failures == {"needs opset >= 20, target caps 18": 3}
