"""Rule family :mod:`irkit.rules.rms_norm`: each rule fires (golden, numbers) and declines (exact reason)."""

from __future__ import annotations

from tests.rules.support import fire, no_fire, parse

RMS = """g (float[2,5,8] x, float[8] w) => (float[2,5,8] y) {
  ax = Constant<value=int64[1] {-1}>()  two = Constant<value=float {2.0}>()
  eps = Constant<value=float {1e-6}>()
  p = Pow(x, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)  s = Sqrt(ve)  r = Reciprocal(s)
  n = Mul(x, r)  y = Mul(w, n) }"""


def test_rms_norm():
    fire(parse(RMS, opset=23), "RMSNormalization", {"RMSNormalization": 1}, "rms_norm")


def test_rms_norm_needs_opset_23():
    no_fire(parse(RMS, opset=22), "RMSNormalization", "needs opset >= 23, graph has 22")
