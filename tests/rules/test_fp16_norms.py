"""Half-precision norms: the Cast(float32) … Cast(half) forms Hugging Face writes fuse exactly.

``RMSNormalizationHalf`` / ``LayerNormalizationHalf`` (:mod:`irkit.rules.rms_norm`,
:mod:`irkit.rules.layer_norm`) fire on float16 and bfloat16 graphs; onnxruntime's fused op
(float32 statistics, the normalized value rounded to half before the scale) gives the numbers of
the decomposed graph; the ``"ort"`` skip fusion follows on float16. Declines carry the reason.
"""

from __future__ import annotations

import numpy as np
import pytest

from irkit import rules
from irkit.rules import ort
from tests.helpers import run_ort
from tests.rewriting import util
from tests.rules.support import no_fire, parse

# Llama/Qwen2/Phi-3's RMS norm in half: statistics in float32, rounded before the scale
RMS_HALF = """g ({t}[2,5,16] x, {t}[16] w) => ({t}[2,5,16] y) {{
  ax = Constant<value=int64[1] {{-1}}>()  two = Constant<value=float {{2.0}}>()
  eps = Constant<value=float {{1e-6}}>()  x32 = Cast<to=1>(x)
  p = Pow(x32, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)  s = Sqrt(ve)  r = Reciprocal(s)
  n = Mul(x32, r)  nh = Cast<to={to}>(n)  y = Mul(w, nh) }}"""

LN_HALF = """g ({t}[2,5,16] x, {t}[16] w, {t}[16] b) => ({t}[2,5,16] y) {{
  ax = Constant<value=int64[1] {{-1}}>()  eps = Constant<value=float {{1e-5}}>()
  x32 = Cast<to=1>(x)  m = ReduceMean(x32, ax)  d = Sub(x32, m)  dd = Mul(d, d)
  v = ReduceMean(dd, ax)  ve = Add(v, eps)  s = Sqrt(ve)  n = Div(d, s)  nh = Cast<to={to}>(n)
  sw = Mul(nh, w)  y = Add(sw, b) }}"""

HALF = {"float16": 10, "bfloat16": 16}


def _fire(text: str, rule: str, fused: str) -> tuple[object, object]:
    model = parse(text, opset=23)
    before = util.clone(model)
    report = util.rewrite(model, rules.default_rules())
    assert report.fired == {rule: 1}, str(report)
    assert util.ops(model) == {fused: 1}
    node = next(iter(model.graph))
    assert node.attributes.get_int("stash_type", 1) == 1  # float32 statistics, as the Casts
    util.assert_valid(model)
    return before, model


@pytest.mark.parametrize("t", ["float16", "bfloat16"])
def test_rms_norm_half_fires(t):
    before, after = _fire(
        RMS_HALF.format(t=t, to=HALF[t]), "RMSNormalizationHalf", "RMSNormalization"
    )
    if t == "float16":  # (onnxruntime's CPU kernels have no bfloat16 RMSNormalization)
        x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float16) * 30
        w = np.random.default_rng(1).standard_normal(16).astype(np.float16)
        (want,), (got,) = run_ort(before, [x, w]), run_ort(after, [x, w])
        assert got.dtype == np.float16
        # the same float32 statistics; one half ulp of rounding apart at most
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3
        )


@pytest.mark.parametrize("t", ["float16", "bfloat16"])
def test_layer_norm_half_fires(t):
    before, after = _fire(
        LN_HALF.format(t=t, to=HALF[t]), "LayerNormalizationHalf", "LayerNormalization"
    )
    if t == "float16":
        rng = np.random.default_rng(0)
        feeds = [rng.standard_normal(s).astype(np.float16) for s in ((2, 5, 16), (16,), (16,))]
        (want,), (got,) = run_ort(before, feeds), run_ort(after, feeds)
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3
        )


def test_rms_norm_half_declines_a_cast_to_another_type():
    # normalized value left in float32: the scale multiplies in float32, not what the op does
    text = RMS_HALF.format(t="float16", to=1).replace("float16[16] w", "float[16] w")
    text = text.replace("=> (float16[2,5,16] y)", "=> (float[2,5,16] y)")
    no_fire(
        parse(text, opset=23),
        "RMSNormalizationHalf",
        "the normalized value is cast to FLOAT, not to x's FLOAT16",
    )


def test_rms_norm_half_declines_a_double_input():
    text = RMS_HALF.format(t="double", to=11)
    no_fire(
        parse(text, opset=23),
        "RMSNormalizationHalf",
        "x is DOUBLE, not float16/bfloat16 (the float32 form is the plain rule)",
    )


def test_rms_norm_half_needs_opset_23():
    no_fire(
        parse(RMS_HALF.format(t="float16", to=10), opset=22),
        "RMSNormalizationHalf",
        "needs opset >= 23, graph has 22",
    )


def test_half_rms_norm_then_skip_simplified_layer_norm_fp16():
    # the residual add of a decoder layer in float16, then HF's half RMS norm
    text = """g (float16[2,5,16] a, float16[2,5,16] b, float16[16] w) => (float16[2,5,16] y, float16[2,5,16] z) {
      z = Add(a, b)  ax = Constant<value=int64[1] {-1}>()  two = Constant<value=float {2.0}>()
      eps = Constant<value=float {1e-6}>()  x32 = Cast<to=1>(z)
      p = Pow(x32, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)  s = Sqrt(ve)  r = Reciprocal(s)
      n = Mul(x32, r)  nh = Cast<to=10>(n)  y = Mul(w, nh) }"""
    model = parse(text, opset=23)
    model.opset_imports["com.microsoft"] = 1
    before = util.clone(model)
    report = util.rewrite(model, ort.default_rules(skip_norm=True))
    assert report.fired == {"RMSNormalizationHalf": 1, "SkipSimplifiedLayerNormalization": 1}
    assert util.ops(model) == {"SkipSimplifiedLayerNormalization": 1}
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal(s).astype(np.float16) for s in ((2, 5, 16), (2, 5, 16), (16,))]
    for want, got in zip(run_ort(before, feeds), run_ort(model, feeds), strict=True):
        assert got.dtype == np.float16
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=4e-3
        )
