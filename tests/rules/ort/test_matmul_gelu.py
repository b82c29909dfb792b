"""FusedMatMul, BiasGelu and FastGelu: fire (onnxruntime numbers on random shapes, fp32 and
fp16) and decline (the reason, visible in ``explain``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rules.ort.support import fire, no_fire, parse

DTYPES = st.sampled_from(["float", "float16"])
DIM = st.integers(1, 6)


@settings(max_examples=4, deadline=None)
@given(DIM, DIM, DIM, DIM, DTYPES)
def test_fused_matmul_linear(b, s, k, n, t):
    """torchlib's 3-D linear: MatMul(x, Transpose(w)), w a parameter (a graph input here)."""
    m = parse(f"""g ({t}[{b},{s},{k}] x, {t}[{n},{k}] w) => ({t}[{b},{s},{n}] y) {{
      wt = Transpose<perm=[1,0]>(w)  y = MatMul(x, wt) }}""")
    fire(m, "FusedMatMul", {"FusedMatMul": 1}, t)


@settings(max_examples=4, deadline=None)
@given(DIM, DIM, DIM, DIM, DTYPES)
def test_fused_matmul_trans_a_batched(b, s, k, n, t):
    m = parse(f"""g ({t}[{b},{k},{s}] a, {t}[{b},{k},{n}] c) => ({t}[{b},{s},{n}] y) {{
      at = Transpose<perm=[0,2,1]>(a)  y = MatMul(at, c) }}""")
    fire(m, "FusedMatMulTransA", {"FusedMatMul": 1}, t)


def test_fused_matmul_both_transposed():
    m = parse("""g (float[2,4,3] a, float[2,5,4] c) => (float[2,3,5] y) {
      at = Transpose<perm=[0,2,1]>(a)  ct = Transpose<perm=[0,2,1]>(c)  y = MatMul(at, ct) }""")
    fire(m, "FusedMatMulTransAB", {"FusedMatMul": 1})


def test_fused_matmul_declines_other_perm():
    m = parse("""g (float[2,3,4] x, float[4,2,5] w) => (float[2,3,4,5] y) {
      wt = Transpose<perm=[1,0,2]>(w)  y = MatMul(x, wt) }""")
    no_fire(m, "FusedMatMul", "does not swap exactly the last two axes")


def test_fused_matmul_declines_int():
    m = parse("""g (int32[3,4] x, int32[5,4] w) => (int32[3,5] y) {
      wt = Transpose<perm=[1,0]>(w)  y = MatMul(x, wt) }""")
    no_fire(m, "FusedMatMul", "FusedMatMul runs float16/float32")


@settings(max_examples=4, deadline=None)
@given(DIM, DIM, st.sampled_from([4, 8]), DTYPES, st.sampled_from(["none", "tanh"]))
def test_gelu_with_bias(b, s, h, t, approximate):
    m = parse(f"""g ({t}[{b},{s},{h}] x, {t}[{h}] c) => ({t}[{b},{s},{h}] y) {{
      z = Add(x, c)  y = Gelu<approximate="{approximate}">(z) }}""")
    name, op = ("BiasGelu", "BiasGelu") if approximate == "none" else ("FastGeluBias", "FastGelu")
    fire(m, name, {op: 1}, t)


def test_fast_gelu_without_bias():
    m = parse("""g (float16[2,3,8] x) => (float16[2,3,8] y) { y = Gelu<approximate="tanh">(x) }""")
    fire(m, "FastGelu", {"FastGelu": 1}, "float16")


def test_bias_gelu_declines_2d_bias():
    m = parse("""g (float[2,3,8] x, float[3,8] c) => (float[2,3,8] y) {
      z = Add(x, c)  y = Gelu(z) }""")
    no_fire(m, "BiasGelu", "is not [8] (the last axis of the input)")
