"""SkipSimplifiedLayerNormalization / SkipLayerNormalization: fire (onnxruntime numbers on random
shapes, fp32 and fp16) and decline (the reason, visible in ``explain``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rules.ort.support import fire, no_fire, parse

SHAPES = st.tuples(st.integers(1, 3), st.integers(1, 5), st.sampled_from([4, 8, 16]))
DTYPES = st.sampled_from(["float", "float16"])


def _rms(t: str, b: int, s: int, h: int, skip: str = "", axis: int = -1) -> str:
    skip = skip or f"{b},{s},{h}"
    return f"""g ({t}[{b},{s},{h}] x, {t}[{skip}] r, {t}[{h}] w) => ({t}[{b},{s},{h}] y, {t}[{b},{s},{h}] z) {{
      z = Add(x, r)  y = RMSNormalization<axis={axis}, epsilon=1e-5>(z, w) }}"""


@settings(max_examples=4, deadline=None)
@given(SHAPES, DTYPES)
def test_skip_simplified_layer_norm(shape, t):
    fire(
        parse(_rms(t, *shape)),
        "SkipSimplifiedLayerNormalization",
        {"SkipSimplifiedLayerNormalization": 1},
        t,
    )


def test_skip_simplified_from_decomposed_rms_norm():
    m = parse("""g (float[2,3,8] x, float[2,3,8] r, float[8] w) => (float[2,3,8] y, float[2,3,8] z) {
      z = Add(x, r)  two = Constant<value=float {2.0}>()  ax = Constant<value=int64[1] {-1}>()
      eps = Constant<value=float {1e-6}>()  p = Pow(z, two)  v = ReduceMean(p, ax)
      ve = Add(v, eps)  s = Sqrt(ve)  q = Reciprocal(s)  n = Mul(z, q)  y = Mul(w, n) }""")
    fire(m, "SkipSimplifiedLayerNormalization", {"SkipSimplifiedLayerNormalization": 1})


def test_skip_simplified_declines_broadcast_skip():
    no_fire(
        parse(_rms("float", 2, 3, 8, skip="3,8")),
        "SkipSimplifiedLayerNormalization",
        "residual shapes",
    )


def test_skip_simplified_declines_other_axis():
    m = parse("""g (float[2,3,8] x, float[2,3,8] r, float[3,8] w) => (float[2,3,8] y) {
      z = Add(x, r)  y = RMSNormalization<axis=1, epsilon=1e-5>(z, w) }""")
    no_fire(m, "SkipSimplifiedLayerNormalization", "normalizes from axis 1")


def _ln(t: str, b: int, s: int, h: int, bias: bool) -> str:
    args = "w, bb" if bias else "w"
    return f"""g ({t}[{b},{s},{h}] x, {t}[{b},{s},{h}] r, {t}[{h}] w, {t}[{h}] bb) => ({t}[{b},{s},{h}] y, {t}[{b},{s},{h}] z) {{
      z = Add(x, r)  y = LayerNormalization<axis=-1, epsilon=1e-5>(z, {args}) }}"""


@settings(max_examples=4, deadline=None)
@given(SHAPES, DTYPES, st.booleans())
def test_skip_layer_norm(shape, t, bias):
    fire(parse(_ln(t, *shape, bias)), "SkipLayerNormalization", {"SkipLayerNormalization": 1}, t)


def test_skip_layer_norm_declines_rank_4():
    m = parse("""g (float[2,2,3,8] x, float[2,2,3,8] r, float[8] w) => (float[2,2,3,8] y) {
      z = Add(x, r)  y = LayerNormalization<axis=-1, epsilon=1e-5>(z, w) }""")
    no_fire(m, "SkipLayerNormalization", "input has rank 4")


def test_skip_layer_norm_declines_another_stash_type():
    m = parse("""g (float[2,3,8] x, float[2,3,8] r, float[8] w) => (float[2,3,8] y, float[2,3,8] z) {
      z = Add(x, r)  y = LayerNormalization<axis=-1, epsilon=1e-5, stash_type=0>(z, w) }""")
    no_fire(m, "SkipLayerNormalization", "attribute stash_type=0, pattern requires 1")


def test_skip_simplified_with_a_computed_scale():
    """``1 + w`` (Gemma's, Qwen3.5's norms): the ``Add`` of the scale is rewritten with the norm."""
    m = parse("""g (float[2,3,8] x, float[2,3,8] r, float[8] w) => (float[2,3,8] y, float[2,3,8] z) {
      z = Add(x, r)  one = Constant<value=float {1.0}>()  w1 = Add(w, one)
      y = RMSNormalization<axis=-1, epsilon=1e-5>(z, w1) }""")
    report = fire(
        m,
        "SkipSimplifiedLayerNormalizationOffset",
        {"Add": 1, "Constant": 1, "SkipSimplifiedLayerNormalization": 1},
    )
    assert "SkipSimplifiedLayerNormalization" not in report.fired


def test_skip_simplified_declines_an_offset_that_broadcasts_the_scale():
    m = parse("""g (float[2,3,8] x, float[2,3,8] r, float[1] w) => (float[2,3,8] y, float[2,3,8] z) {
      z = Add(x, r)  c = Constant<value=float[8] {1, 1, 1, 1, 1, 1, 1, 1}>()  w1 = Add(w, c)
      y = RMSNormalization<axis=-1, epsilon=1e-5>(z, w1) }""")
    no_fire(m, "SkipSimplifiedLayerNormalizationOffset", "broadcasts the weight")
