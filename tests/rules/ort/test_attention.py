"""GroupQueryAttention, MultiHeadAttention and contrib RotaryEmbedding from the opset-23 ops (the
ONNX spec's 4-D Q/K/V): fire (onnxruntime numbers on random shapes, fp32 and fp16) and decline
(the reason, visible in ``explain``)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import irkit
from irkit.rewriting import RewriteReport, Rule
from irkit.rules import ort
from tests.helpers import run_ort
from tests.rules.ort.support import ATOL, TYPES, clone, fire, no_fire, ops, parse, rewrite

DTYPES = st.sampled_from(["float", "float16"])
MAX_POS = 32


def _gqa(t, b, n, kv, s, p, h, causal=1, mask=False, past=True, mask_shape=None):
    past_in = f", {t}[{b},{kv},{p},{h}] pk, {t}[{b},{kv},{p},{h}] pv" if past else ""
    total = s + p if past else s
    mask_in = f", {t}[{mask_shape or f'{b},1,{s},{total}'}] m" if mask else ""
    outs = f"{t}[{b},{n},{s},{h}] y"
    if past:
        outs += f", {t}[{b},{kv},{total},{h}] ko, {t}[{b},{kv},{total},{h}] vo"
    args = f"q, k, v, {'m' if mask else ''}" + (", pk, pv" if past else "")
    res = "y, ko, vo" if past else "y"
    return parse(f"""g ({t}[{b},{n},{s},{h}] q, {t}[{b},{kv},{s},{h}] k, {t}[{b},{kv},{s},{h}] v{past_in}{mask_in})
      => ({outs}) {{ {res} = Attention<is_causal={causal}>({args}) }}""")


@settings(max_examples=4, deadline=None)
@given(
    st.integers(1, 2),
    st.sampled_from([(2, 1), (4, 2), (2, 2)]),
    st.integers(1, 4),
    st.integers(1, 5),
    st.sampled_from([8, 16]),
    DTYPES,
    st.booleans(),
)
def test_group_query_attention(b, heads, s, p, h, t, past):
    if past and b > 1:
        s = 1  # (onnxruntime: a past with several new tokens only at batch 1)
    m = _gqa(t, b, heads[0], heads[1], s, p, h, past=past)
    rule = "GroupQueryAttentionKVCache" if past else "GroupQueryAttention"
    report = fire(m, rule, _ops_with("GroupQueryAttention", past), t)
    assert report.fired[rule] == 1


def _ops_with(op: str, past: bool) -> dict[str, int]:
    """The graph after the rewrite: Q/K/V to 3-D and back, the lengths GQA needs."""
    ops = {op: 1, "Constant": 4, "Reshape": 4, "Transpose": 4}
    if op == "GroupQueryAttention":
        ops.update(Shape=3 if past else 2, Cast=1, Sub=1, Expand=1, Constant=5)
        if past:
            ops["Add"] = 1
    return dict(sorted(ops.items()))


def test_group_query_attention_declines_head_size_4():
    no_fire(
        _gqa("float", 1, 2, 1, 3, 2, 4),
        "GroupQueryAttentionKVCache",
        "head size 4 is not a multiple of 8 (onnxruntime CPU)",
    )


def test_group_query_attention_declines_chunks_with_past_in_a_batch():
    no_fire(
        _gqa("float", 2, 2, 1, 3, 2, 8),
        "GroupQueryAttentionKVCache",
        "batch 2 and 3 new tokens with a past",
    )


def test_group_query_attention_declines_a_mask():
    no_fire(
        _gqa("float", 1, 2, 1, 3, 2, 8, mask=True),
        "GroupQueryAttentionKVCache",
        "has an attention mask besides the causal one",
    )


@settings(max_examples=4, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 5),
    st.sampled_from([4, 8]),
    DTYPES,
    st.booleans(),
    st.booleans(),
)
def test_multi_head_attention(b, n, s, p, h, t, mask, past):
    m = _gqa(t, b, n, n, s, p, h, causal=0, mask=mask, past=past)
    fire(
        m,
        "MultiHeadAttentionKVCache" if past else "MultiHeadAttention",
        _ops_with("MultiHeadAttention", past),
        t,
    )


def test_multi_head_attention_2d_mask():
    m = _gqa("float", 2, 2, 2, 3, 4, 8, causal=0, mask=True, mask_shape="3,7")
    ops = {**_ops_with("MultiHeadAttention", True), "Unsqueeze": 1}
    ops["Constant"] += 1
    fire(m, "MultiHeadAttentionKVCache", dict(sorted(ops.items())))


def test_multi_head_attention_declines_a_mask_broadcast_over_queries():
    # BERT's (B, 1, 1, L) extended mask as an Attention's attn_mask (a model from elsewhere:
    # irkit's own fusion expands it): attention_bias must be (·, ·, S, past + L) exactly
    no_fire(
        _gqa("float", 2, 2, 2, 3, 4, 8, causal=0, mask=True, mask_shape="2,1,1,7"),
        "MultiHeadAttentionKVCache",
        "the mask's query dim 1 is not 3: attention_bias takes no broadcast there",
    )


def test_multi_head_attention_declines_a_minus_inf_mask():
    # a boolean SDPA mask as irkit lowers it: onnxruntime's MultiHeadAttention gives NaN where
    # a query's every key is -inf, Attention (and torch) 0; the Attention stays and keeps 0
    m = parse("""g (float[1,2,3,8] q, float[1,2,3,8] k, float[1,2,3,8] v, bool[1,1,3,3] keep)
      => (float[1,2,3,8] y) {
        zero = Constant<value = float zero {0.0}>()
        minus_inf = Constant<value = float minus_inf {-inf}>()
        mask = Where(keep, zero, minus_inf)
        y = Attention(q, k, v, mask) }""")
    no_fire(m, "MultiHeadAttention", "the mask holds -inf (a boolean mask's fill)")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 8), dtype=np.float32) for _ in range(3))
    keep = np.ones((1, 1, 3, 3), dtype=bool)
    keep[0, 0, 1] = False
    for model in (m, irkit.optimize(clone(m), target="ort")):
        (y,) = run_ort(model, [q, k, v, keep])
        assert np.isfinite(y).all() and not y[0, :, 1].any()


def test_multi_head_attention_declines_grouped_heads():
    no_fire(
        _gqa("float", 1, 4, 2, 3, 2, 8, causal=0),
        "MultiHeadAttentionKVCache",
        "4 query heads but 2 key/value heads",
    )


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        ("left_window_size=2", "left_window_size=2: a sliding window (opset 25)"),
        ("right_window_size=1", "right_window_size=1: a sliding window (opset 25)"),
        ("softmax_precision=11", "softmax_precision=11: softmax in another precision"),
        ("softcap=2.0", "softcap: MultiHeadAttention has none"),
        ("future_option=1", "attribute future_option=1: not one the contrib ops are known"),
    ],
)
def test_multi_head_attention_declines_what_it_cannot_carry(attributes, reason):
    """An attribute whose meaning MultiHeadAttention would drop stops the rewrite (whitelist)."""
    m = parse(
        f"""g (float[1,2,3,8] q, float[1,2,3,8] k, float[1,2,3,8] v) => (float[1,2,3,8] y) {{
      y = Attention<{attributes}>(q, k, v) }}""",
        opset=25,
    )
    no_fire(m, "MultiHeadAttention", reason)
    assert [n.op_type for n in m.graph] == ["Attention"]


def test_multi_head_attention_carries_the_defaults_of_opset_25():
    m = parse(
        """g (float[1,2,3,8] q, float[1,2,3,8] k, float[1,2,3,8] v) => (float[1,2,3,8] y) {
      y = Attention<left_window_size=-1, right_window_size=-1, softmax_precision=1,
                    qk_matmul_output_mode=0, softcap=0.0>(q, k, v) }""",
        opset=25,
    )
    fire(m, "MultiHeadAttention", _ops_with("MultiHeadAttention", False))


def test_group_query_attention_declines_a_window():
    m = parse(
        """g (float[1,2,3,8] q, float[1,2,3,8] k, float[1,2,3,8] v) => (float[1,2,3,8] y) {
      y = Attention<is_causal=1, left_window_size=1>(q, k, v) }""",
        opset=25,
    )
    no_fire(m, "GroupQueryAttention", "left_window_size=1: a sliding window")


def test_attention_declines_nonpad_kv_seqlen():
    m = parse(
        """g (float[2,2,3,8] q, float[2,2,3,8] k, float[2,2,3,8] v, int64[2] n) => (float[2,2,3,8] y) {
      y = Attention<is_causal=1>(q, k, v, , , , n) }""",
        opset=24,
    )
    no_fire(m, "GroupQueryAttention", "nonpad_kv_seqlen (opset 24) is not supported")


@pytest.mark.parametrize(
    ("causal", "rule", "op"),
    [
        (1, "GroupQueryAttentionKVCache", "GroupQueryAttention"),
        (0, "MultiHeadAttentionKVCache", "MultiHeadAttention"),
    ],
)
def test_attention_writing_a_cache_without_a_past(causal, rule, op):
    """Prefill: no past, the presents are K and V (outputs): the cache form, past absent."""
    m = parse(f"""g (float[1,2,3,8] q, float[1,2,3,8] k, float[1,2,3,8] v)
      => (float[1,2,3,8] y, float[1,2,3,8] ko, float[1,2,3,8] vo) {{
      y, ko, vo = Attention<is_causal={causal}>(q, k, v) }}""")
    fire(m, rule, _ops_with(op, False))


def test_attention_declines_a_used_qk_matmul_output():
    m = parse("""g (float[1,2,3,8] q, float[1,2,3,8] k, float[1,2,3,8] v)
      => (float[1,2,3,8] y, float[1,2,3,3] qk) {
      y, , , qk = Attention<is_causal=1>(q, k, v) }""")
    no_fire(m, "GroupQueryAttention", "an intermediate value of the match is a graph output")
    assert [n.op_type for n in m.graph] == ["Attention"]


def test_attention_rules_are_patterns():
    """Every ort attention rule is a pattern Rule (no hand-written NodeRule left), but the cut of
    a wider pack: like the packing rule it replaces a ``Split`` of any number of outputs and
    cuts constant weights, which a pattern does not express."""
    shared = ort.attention.SharedBuffer()
    cut = ort.attention.packed_qkv.PackedQKVAttentionOfWiderPack
    for options in ({}, {"gqa_dynamic_past": True, "gqa_masked": True}, {"shared": shared}):
        rule_set = ort.attention.attention_rules(**options)
        assert all(type(rule) in (Rule, cut) for rule in rule_set), [
            type(r).__name__ for r in rule_set
        ]
    names = ort.attention.attention_rules().names()
    assert names == [
        "GroupQueryAttentionKVCache",
        "GroupQueryAttention",
        "PackedQKVAttention",
        "PackedQKVAttentionSlices",
        "PackedQKVAttentionOfWiderPack",
        "MultiHeadAttentionKVCache",
        "MultiHeadAttention",
        "ContribRotaryEmbedding",
    ]


def _packed_gqa(
    b: int, n: int, kv: int, s: int, p: int, h: int, order: str = "q, k, v"
) -> ir.Model:
    """``GroupQueryAttention`` of the three outputs of ``Split(x)`` (in ``order``), with a past."""
    w, t = (n + 2 * kv) * h, p + s
    return parse(f"""g (float[{b},{s},{w}] x, float[{b},{kv},{p},{h}] pk, float[{b},{kv},{p},{h}] pv,
                        int32[{b}] seqlens, int32 total)
      => (float[{b},{s},{n * h}] y, float[{b},{kv},{t},{h}] ko, float[{b},{kv},{t},{h}] vo) {{
        sizes = Constant<value = int64[3] {{{n * h}, {kv * h}, {kv * h}}}>()
        q, k, v = Split<axis=-1>(x, sizes)
        y, ko, vo = com.microsoft.GroupQueryAttention<num_heads={n}, kv_num_heads={kv}>({order},
                                                                   pk, pv, seqlens, total)
      }}""")


def _packed_feeds(m: ir.Model, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    x, pk = m.graph.inputs[0].shape, m.graph.inputs[1].shape
    total = int(pk[2]) + int(x[1])
    return [
        rng.standard_normal([int(d) for d in x]).astype(np.float32),
        rng.standard_normal([int(d) for d in pk]).astype(np.float32),
        rng.standard_normal([int(d) for d in pk]).astype(np.float32),
        np.full([int(x[0])], total - 1, dtype=np.int32),
        np.array(total, dtype=np.int32),
    ]


@pytest.mark.parametrize(
    ("b", "n", "kv", "s", "p"), [(1, 4, 2, 3, 5), (2, 8, 2, 1, 7), (1, 2, 2, 1, 0)]
)
def test_packed_qkv_goes_into_group_query_attention(b, n, kv, s, p):
    """``GroupQueryAttention(Split(x))`` → ``GroupQueryAttention(x)``: the op splits the packed
    projection itself; the Split goes, onnxruntime's numbers stay."""
    m = _packed_gqa(b, n, kv, s, p, 16)
    before, feeds = clone(m), _packed_feeds(m)
    report = rewrite(m)
    assert report.fired.get("PackedQKVAttention") == 1
    assert ops(m) == {"GroupQueryAttention": 1}
    node = next(iter(m.graph))
    assert node.inputs[0] is m.graph.inputs[0] and node.inputs[1] is None and node.inputs[2] is None
    for a, e in zip(run_ort(m, feeds), run_ort(before, feeds), strict=True):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-5)


def _sliced_gqa(n: int, kv: int, h: int, bounds: list[int], end: int) -> ir.Model:
    """``GroupQueryAttention(x[..., b0:b1], x[..., b1:b2], x[..., b2:end])`` (b, s = 1, 1)."""
    w, p = (n + 2 * kv) * h, 3
    b0, b1, b2 = bounds
    return parse(f"""g (float[1,1,{w}] x, float[1,{kv},{p},{h}] pk, float[1,{kv},{p},{h}] pv,
                        int32[1] seqlens, int32 total)
      => (float[1,1,{n * h}] y, float[1,{kv},{p + 1},{h}] ko, float[1,{kv},{p + 1},{h}] vo) {{
        s0 = Constant<value = int64[1] {{{b0}}}>()
        s1 = Constant<value = int64[1] {{{b1}}}>()
        s2 = Constant<value = int64[1] {{{b2}}}>()
        e = Constant<value = int64[1] {{{end}}}>()
        ax = Constant<value = int64[1] {{-1}}>()
        q = Slice(x, s0, s1, ax)
        k = Slice(x, s1, s2, ax)
        v = Slice(x, s2, e, ax)
        y, ko, vo = com.microsoft.GroupQueryAttention<num_heads={n}, kv_num_heads={kv}>(q, k, v,
                                                                   pk, pv, seqlens, total)
      }}""")


def test_packed_qkv_slices_go_into_group_query_attention():
    """phi3's packed ``qkv_proj`` cut by three slices that tile it (the last to INT64_MAX)."""
    m = _sliced_gqa(4, 2, 16, [0, 64, 96], 2**63 - 1)
    before, feeds = clone(m), _packed_feeds(m)
    report = rewrite(m)
    assert report.fired.get("PackedQKVAttentionSlices") == 1
    assert ops(m) == {"GroupQueryAttention": 1}
    for a, e in zip(run_ort(m, feeds), run_ort(before, feeds), strict=True):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("bounds", "end", "reason"),
    [
        ([16, 80, 112], 128, "do not tile the packed projection"),  # a gap before Q
        ([0, 64, 96], 120, "not at the packed width 128"),  # V stops short
    ],
)
def test_packed_qkv_slices_decline_what_is_not_the_packed_layout(bounds, end, reason):
    m = _sliced_gqa(4, 2, 16, bounds, end)
    no_fire(m, "PackedQKVAttentionSlices", reason)


def test_packed_qkv_declines_outputs_out_of_order():
    """K and V swapped (same width): not the packed layout, so the Split stays."""
    m = _packed_gqa(1, 4, 2, 2, 3, 16, order="q, v, k")
    report = rewrite(m)
    assert report.fired.get("PackedQKVAttention", 0) == 0
    assert ops(m) == {"Constant": 1, "GroupQueryAttention": 1, "Split": 1}


def test_packed_qkv_declines_widths_not_of_the_heads():
    """Q narrower than ``num_heads`` heads of K's size: no packed form to hand the op."""
    m = _packed_gqa(1, 4, 2, 1, 3, 16)
    next(n for n in m.graph if n.op_type == "GroupQueryAttention").attributes["num_heads"] = (
        ir.AttrInt64("num_heads", 2)
    )
    report = no_fire(m, "PackedQKVAttention", "are not 2/2 heads of one size")
    assert report.fired.get("PackedQKVAttention", 0) == 0


def _caches(t: str, h: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0, 3, (MAX_POS, h // 2))
    return np.cos(angles).astype(TYPES[t]), np.sin(angles).astype(TYPES[t])


def _with_caches(m: ir.Model, t: str, h: int) -> ir.Model:
    cos, sin = _caches(t, h)
    for name, arr in (("cos", cos), ("sin", sin)):
        v = m.graph.initializers.get(name) or ir.Value(name=name)
        v.const_value = ir.tensor(arr, name=name)
        v.type, v.shape = ir.TensorType(ir.DataType.from_numpy(arr.dtype)), ir.Shape(arr.shape)
        for node in m.graph:
            for i, inp in enumerate(node.inputs):
                if inp is not None and inp.name == name and inp is not v:
                    node.replace_input_with(i, v)
        m.graph.register_initializer(v)
    return m


@settings(max_examples=4, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 3),
    st.integers(1, 4),
    st.sampled_from([4, 8]),
    DTYPES,
    st.integers(0, 1),
)
def test_contrib_rotary_embedding(b, n, s, h, t, interleaved):
    m = parse(f"""g ({t}[{b},{n},{s},{h}] x, int64[{b},{s}] pos) => ({t}[{b},{n},{s},{h}] y) {{
      y = RotaryEmbedding<interleaved={interleaved}>(x, cos, sin, pos) }}""")
    m = _with_caches(m, t, h)
    fire(m, "ContribRotaryEmbedding", {"RotaryEmbedding": 1}, t)
    assert next(iter(m.graph)).domain == "com.microsoft"


@pytest.mark.parametrize("interleaved", [0, 1])
def test_contrib_rotary_embedding_with_rotary_dim_gets_num_heads(interleaved):
    """onnxruntime's kernel needs num_heads with a rotary_embedding_dim: read from the 4-D shape."""
    m = parse(f"""g (float[2,3,4,8] x, int64[2,4] pos) => (float[2,3,4,8] y) {{
      y = RotaryEmbedding<interleaved={interleaved}, rotary_embedding_dim=4>(x, cos, sin, pos) }}""")
    m = _with_caches(m, "float", 4)
    fire(m, "ContribRotaryEmbedding", {"RotaryEmbedding": 1})
    assert next(iter(m.graph)).attributes["num_heads"].value == 3


def test_contrib_rotary_declines_per_token_cos_sin():
    m = parse("""g (float[1,2,3,8] x, float[1,3,4] cos, float[1,3,4] sin) => (float[1,2,3,8] y) {
      y = RotaryEmbedding(x, cos, sin) }""")
    no_fire(m, "ContribRotaryEmbedding", "no position_ids: per-token cos/sin")


@settings(max_examples=4, deadline=None)
@given(
    st.integers(1, 2),
    st.sampled_from([(2, 1), (4, 2)]),
    st.integers(1, 4),
    st.integers(1, 5),
    DTYPES,
    st.integers(0, 1),
)
def test_group_query_attention_absorbs_rotary(b, heads, s, p, t, interleaved):
    s = s if b == 1 else 1
    n, kv, h = heads[0], heads[1], 16
    m = parse(f"""g ({t}[{b},{n},{s},{h}] q0, {t}[{b},{kv},{s},{h}] k0, {t}[{b},{kv},{s},{h}] v,
                     {t}[{b},{kv},{p},{h}] pk, {t}[{b},{kv},{p},{h}] pv, int64[{b},{s}] pos)
      => ({t}[{b},{n},{s},{h}] y, {t}[{b},{kv},{s + p},{h}] ko, {t}[{b},{kv},{s + p},{h}] vo)
      <{t}[{b},{n},{s},{h}] q, {t}[{b},{kv},{s},{h}] k> {{
      q = RotaryEmbedding<interleaved={interleaved}>(q0, cos, sin, pos)
      k = RotaryEmbedding<interleaved={interleaved}>(k0, cos, sin, pos)
      y, ko, vo = Attention<is_causal=1>(q, k, v, , pk, pv) }}""")
    m = _with_caches(m, t, h)
    report = fire(m, "GroupQueryAttentionKVCache", _ops_with("GroupQueryAttention", True), t)
    assert report.fired.get("ContribRotaryEmbedding", 0) == 0
    gqa = next(node for node in m.graph if node.op_type == "GroupQueryAttention")
    assert gqa.attributes["do_rotary"].value == 1
    assert gqa.inputs[7].const_value is not None and gqa.inputs[9].name == "pos"


def _dynamic_gqa(t: str = "float") -> ir.Model:
    return parse(f"""g ({t}[b,4,s,16] q, {t}[b,2,s,16] k, {t}[b,2,s,16] v, {t}[b,2,p,16] pk,
                       {t}[b,2,p,16] pv) => ({t}[b,4,s,16] y, {t}[b,2,t,16] ko, {t}[b,2,t,16] vo) {{
      y, ko, vo = Attention<is_causal=1>(q, k, v, , pk, pv) }}""")


def test_group_query_attention_dynamic_past_is_opt_in():
    no_fire(_dynamic_gqa(), "GroupQueryAttentionKVCache", "batch b and s new tokens with a past")


@pytest.mark.parametrize("t", ["float", "float16"])
def test_group_query_attention_dynamic_past_prefill_and_decode(t):
    before = _dynamic_gqa(t)
    m = clone(before)
    report = RewriteReport()
    irkit.rewrite(m, ort.default_rules(gqa_dynamic_past=True), report=report)
    assert report.fired["GroupQueryAttentionKVCache"] == 1
    rng = np.random.default_rng(0)
    for b, s, p in ((3, 5, 0), (3, 1, 6)):  # prefill (empty past), then one decoding step
        shapes = [(b, 4, s, 16), (b, 2, s, 16), (b, 2, s, 16), (b, 2, p, 16), (b, 2, p, 16)]
        inputs = [rng.standard_normal(x).astype(TYPES[t]) for x in shapes]
        for a, e in zip(run_ort(m, inputs), run_ort(before, inputs), strict=True):
            assert a.shape == e.shape
            np.testing.assert_allclose(a, e, atol=ATOL[t], rtol=ATOL[t])


@settings(max_examples=4, deadline=None)
@given(
    st.integers(1, 2),
    st.sampled_from([(4, 2), (2, 2)]),
    st.integers(1, 4),
    st.integers(0, 5),
    DTYPES,
    st.booleans(),
)
def test_group_query_attention_masked_opt_in(b, heads, s, p, t, causal):
    """HF's form: a float (causal + padding) mask, no is_causal → attention_bias, causal=0."""
    s = s if b == 1 else 1  # (a past, even an empty one, with several new tokens: batch 1 only)
    m = _gqa(t, b, heads[0], heads[1], s, p, 16, causal=int(causal), mask=True)
    before = clone(m)
    report = RewriteReport()
    irkit.rewrite(m, ort.default_rules(gqa_masked=True), report=report)
    if t == "float16" and b > 1:  # onnxruntime's kernel is wrong there: declined
        assert "GroupQueryAttentionKVCache" not in report.fired
        return
    assert report.fired["GroupQueryAttentionKVCache"] == 1
    gqa = next(n for n in m.graph if n.op_type == "GroupQueryAttention")
    assert gqa.inputs[10] is not None and gqa.inputs[10].name == "m"
    rng = np.random.default_rng(0)
    inputs = [
        rng.standard_normal([int(d) for d in v.shape]).astype(TYPES[t]) for v in before.graph.inputs
    ]
    inputs[-1] = np.where(rng.random(inputs[-1].shape) < 0.3, -1e4, 0).astype(TYPES[t])
    for a, e in zip(run_ort(m, inputs), run_ort(before, inputs), strict=True):
        np.testing.assert_allclose(a, e, atol=ATOL[t], rtol=ATOL[t])


def test_group_query_attention_masked_declines_a_minus_inf_mask():
    # causal=0 (gqa_masked): onnxruntime's GroupQueryAttention gives NaN for a query whose every
    # key is -inf, as MultiHeadAttention does; the Attention stays and gives 0
    m = parse("""g (float[1,2,3,16] q, float[1,2,3,16] k, float[1,2,3,16] v, bool[1,1,3,3] keep)
      => (float[1,2,3,16] y) {
        zero = Constant<value = float zero {0.0}>()
        minus_inf = Constant<value = float minus_inf {-inf}>()
        mask = Where(keep, zero, minus_inf)
        y = Attention(q, k, v, mask) }""")
    report = RewriteReport()
    irkit.rewrite(
        m, ort.default_rules(gqa_masked=True), explain="GroupQueryAttention", report=report
    )
    assert not report.fired.get("GroupQueryAttention")
    reason = "NaN in GroupQueryAttention with causal=0"
    assert any(reason in r for r in report.rules["GroupQueryAttention"].failures)


def test_group_query_attention_masked_declines_float16_batches_with_a_past():
    m = _gqa("float16", 2, 4, 2, 1, 2, 16, causal=0, mask=True)
    report = RewriteReport()
    irkit.rewrite(
        m, ort.default_rules(gqa_masked=True), explain="GroupQueryAttentionKVCache", report=report
    )
    assert "GroupQueryAttentionKVCache" not in report.fired
    assert "float16 with an attention_bias, a past and batch 2" in report.explain()


def test_group_query_attention_masked_reads_an_untyped_where_mask():
    """torchlib's SDPA builds the float mask with an untyped Where: dtype/rank read through it."""
    m = parse("""g (float[1,4,3,16] q, float[1,2,3,16] k, float[1,2,3,16] v, float[1,2,5,16] pk,
                   float[1,2,5,16] pv, bool[1,1,3,8] keep)
      => (float[1,4,3,16] y, float[1,2,8,16] ko, float[1,2,8,16] vo) {
      zero = Constant<value=float {0.0}>()  low = Constant<value=float {-10000.0}>()
      m = Where(keep, zero, low)
      y, ko, vo = Attention(q, k, v, m, pk, pv) }""")
    before = clone(m)
    report = RewriteReport()
    irkit.rewrite(m, ort.default_rules(gqa_masked=True), report=report)
    assert report.fired["GroupQueryAttentionKVCache"] == 1
    rng = np.random.default_rng(4)
    inputs = [
        rng.standard_normal([int(d) for d in v.shape]).astype(np.float32)
        for v in before.graph.inputs[:5]
    ]
    inputs.append(rng.random((1, 1, 3, 8)) < 0.7)
    for a, e in zip(run_ort(m, inputs), run_ort(before, inputs), strict=True):
        np.testing.assert_allclose(a, e, atol=1e-4, rtol=1e-4)


# ------------------------------------------------ onnxruntime-genai's shared KV buffer


def _mask_text(t: str, window: int | None = None) -> str:
    """Hugging Face's additive mask ``m`` from the ``attention_mask`` input (padding, and a
    sliding window ``kv > q - window``), as ONNX text."""
    windowed = (
        f"""
        w = Constant<value=int64 {{{window}}}>()
        q_w = Sub(q_idx, w)
        in_window = Greater(kv_idx, q_w)
        keep = And(valid, in_window)"""
        if window
        else "\n        keep = Identity(valid)"
    )
    return f"""
        valid = Cast<to=9>(attention_mask)
        t_len = Shape<start=1, end=2>(attention_mask)
        t_sc = Squeeze(t_len)
        zero = Constant<value=int64 {{0}}>()
        one = Constant<value=int64 {{1}}>()
        kv_idx = Range(zero, t_sc, one)
        q_idx = Identity(t_sc){windowed}
        z = Constant<value={t} {{0}}>()
        neg = Constant<value={t} {{-10000}}>()
        m2 = Where(keep, z, neg)
        axes = Constant<value=int64[2] {{1, 2}}>()
        m = Unsqueeze(m2, axes)"""


def _fix_neg(model: ir.Model, t: str) -> ir.Model:
    # (the text parser reads a float16 -10000 as -158: set it here)
    (neg,) = [n for n in model.graph if n.outputs[0].name == "neg"]
    neg.attributes["value"] = ir.AttrTensor("value", ir.tensor(np.array(-10000, TYPES[t])))
    return model


def _shared_model(t: str, window: int | None = None) -> ir.Model:
    """A decoder layer's attention as Hugging Face exports it: the additive mask computed from
    the ``attention_mask`` input."""
    model = parse(f"""g ({t}[B,4,S,16] q, {t}[B,2,S,16] k, {t}[B,2,S,16] v,
          {t}[B,2,P,16] pk, {t}[B,2,P,16] pv, int64[B,T] attention_mask)
      => ({t}[B,4,S,16] y, {t}[B,2,T2,16] ko, {t}[B,2,T2,16] vo) {{{_mask_text(t, window)}
        y, ko, vo = Attention<is_causal=1>(q, k, v, m, pk, pv)
      }}""")
    return _fix_neg(model, t)


def _attend(q, keys, values, window: int | None) -> np.ndarray:
    """One row's causal attention in float64, queries at the last positions of ``keys``."""
    s, total = q.shape[1], keys.shape[1]
    group = q.shape[0] // keys.shape[0]
    keys, values = np.repeat(keys, group, 0), np.repeat(values, group, 0)
    scores = q @ keys.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    qpos = np.arange(total - s, total)[:, None]
    kpos = np.arange(total)[None, :]
    keep = kpos <= qpos
    if window:
        keep &= kpos > qpos - window
    scores = np.where(keep, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ values


@pytest.mark.parametrize("t", ["float", "float16"])
@pytest.mark.parametrize("window", [None, 3])
def test_group_query_attention_on_the_shared_buffer(t, window):
    """Prefill of two right-padded prompts into a buffer of capacity 8, then a decode step:
    each row's valid outputs are its own causal attention, the new keys land at its length."""
    model = _shared_model(t, window)
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(gqa_shared_buffer=True), report=report)
    assert report.fired.get("GroupQueryAttentionKVCache") == 1, str(report)
    (node,) = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert node.attributes.get("local_window_size") is None or window is not None
    if window:
        assert node.attributes["local_window_size"].value == window
    assert "Attention" not in ops(model)
    dtype, rng, cap = TYPES[t], np.random.default_rng(0), 8
    lengths = [3, 5]  # right-padded prompts
    q = rng.standard_normal((2, 4, 5, 16)).astype(dtype)
    k, v = (rng.standard_normal((2, 2, 5, 16)).astype(dtype) for _ in "kv")
    buffer = np.zeros((2, 2, cap, 16), dtype)
    mask = np.array([[1] * n + [0] * (5 - n) for n in lengths], np.int64)
    y, ko, vo = run_ort(model, [q, k, v, buffer, buffer, mask])
    assert ko.shape == (2, 2, cap, 16)
    for r, n in enumerate(lengths):
        want = _attend(q[r, :, :n], k[r, :, :n], v[r, :, :n], window)
        np.testing.assert_allclose(y[r, :, :n], want, atol=ATOL[t], rtol=ATOL[t])
        np.testing.assert_array_equal(ko[r, :, :n], k[r, :, :n])
    # one new token per row, written at its row's length
    q1 = rng.standard_normal((2, 4, 1, 16)).astype(dtype)
    k1, v1 = (rng.standard_normal((2, 2, 1, 16)).astype(dtype) for _ in "kv")
    mask1 = np.array([[1] * (n + 1) + [0] * (5 - n) for n in lengths], np.int64)
    y1, ko1, vo1 = run_ort(model, [q1, k1, v1, ko, vo, mask1])
    for r, n in enumerate(lengths):
        keys = np.concatenate([k[r, :, :n], k1[r]], 1).astype(np.float64)
        values = np.concatenate([v[r, :, :n], v1[r]], 1).astype(np.float64)
        want = _attend(q1[r].astype(np.float64), keys, values, window)
        np.testing.assert_allclose(y1[r], want, atol=ATOL[t], rtol=ATOL[t])
        np.testing.assert_array_equal(ko1[r, :, n], k1[r, :, 0])


def test_shared_buffer_declines_a_mask_not_from_attention_mask():
    model = _gqa("float", 1, 4, 2, 1, 3, 16, mask=True)
    report = RewriteReport()
    irkit.rewrite(
        model,
        ort.default_rules(gqa_shared_buffer=True),
        report=report,
        explain="GroupQueryAttentionKVCache",
    )
    assert report.rules["GroupQueryAttentionKVCache"].fired == 0
    assert "the graph has no input 'attention_mask'" in report.explain(limit=100)


def test_shared_buffer_declines_a_bias_in_the_mask():
    """An additive bias (ALiBi) besides the keep/drop mask stays a standard Attention."""
    model = _shared_model("float")
    (where,) = [n for n in model.graph if n.op_type == "Where"]
    slope = ir.Value(
        name="alibi", shape=ir.Shape([1, 1, 1, 1]), type=ir.TensorType(ir.DataType.FLOAT)
    )
    slope.const_value = ir.tensor(np.full((1, 1, 1, 1), -0.5, np.float32), name="alibi")
    model.graph.initializers["alibi"] = slope
    biased = ir.node("Add", [where.outputs[0], slope])
    model.graph.insert_after(where, biased)
    for use_node, index in list(where.outputs[0].uses()):
        if use_node is not biased:
            use_node.replace_input_with(index, biased.outputs[0])
    report = RewriteReport()
    irkit.rewrite(
        model,
        ort.default_rules(gqa_shared_buffer=True),
        report=report,
        explain="GroupQueryAttentionKVCache",
    )
    assert report.rules["GroupQueryAttentionKVCache"].fired == 0
    assert "ALiBi or another bias" in report.explain(limit=100)


_SHORT = [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0]
_LONG = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0]
_ORIGINAL = 4  # longrope's original_max_position_embeddings in _rotary_model
_INV_FREQ = [1, 0.5, 0.25, 0.125, 0.0625, 0.03, 0.01, 0.001]


def _rotary_model(
    dynamic: bool = False, longrope: bool = False, rotary_dim: int = 16, head: int = 16
) -> ir.Model:
    """Hugging Face's rotary before the attention: angles ``position · inv_freq`` (``dynamic``:
    also scaled by the largest position, as dynamic NTK does; ``longrope``: divided by the
    short factors, or the long ones once the largest position + 1 passes :data:`_ORIGINAL`),
    ``RotaryEmbedding`` on Q and K (heads of ``head``, their first ``rotary_dim`` features
    rotated: partial when less)."""
    freqs = ", ".join(str(f) for f in _INV_FREQ[: rotary_dim // 2])
    partial = "" if rotary_dim == head else f"<rotary_embedding_dim={rotary_dim}>"
    scale = "\n        angles = Identity(raw)"
    if dynamic:
        scale = """
        top = ReduceMax<keepdims=1>(pos_f)
        hundred = Constant<value=float {100}>()
        grow = Div(top, hundred)
        one_f = Constant<value=float {1}>()
        factor = Add(grow, one_f)
        angles = Mul(raw, factor)"""
    if longrope:
        short, long = ", ".join(map(str, _SHORT)), ", ".join(map(str, _LONG))
        scale = f"""
        top = ReduceMax<keepdims=1>(pos_f)
        one_f = Constant<value=float {{1}}>()
        length = Add(top, one_f)
        original = Constant<value=float {{{_ORIGINAL}}}>()
        is_long = Greater(length, original)
        short_factor = Constant<value=float[8] {{{short}}}>()
        long_factor = Constant<value=float[8] {{{long}}}>()
        factor = Where(is_long, long_factor, short_factor)
        angles = Div(raw, factor)"""
    h = head
    return parse(f"""g (float[B,4,S,{h}] q, float[B,2,S,{h}] k, float[B,2,S,{h}] v,
          float[B,2,P,{h}] pk, float[B,2,P,{h}] pv, int64[B,T] attention_mask,
          int64[B,S] position_ids)
      => (float[B,4,S,{h}] y, float[B,2,T2,{h}] ko, float[B,2,T2,{h}] vo) {{{_mask_text("float")}
        pos_f = Cast<to=1>(position_ids)
        last = Constant<value=int64[1] {{-1}}>()
        pos3 = Unsqueeze(pos_f, last)
        inv_freq = Constant<value=float[{rotary_dim // 2}] {{{freqs}}}>()
        raw = Mul(pos3, inv_freq){scale}
        cos = Cos(angles)
        sin = Sin(angles)
        qr = RotaryEmbedding{partial}(q, cos, sin)
        kr = RotaryEmbedding{partial}(k, cos, sin)
        y, ko, vo = Attention<is_causal=1>(qr, kr, v, m, pk, pv)
      }}""")


def _rotate(
    x: np.ndarray,
    positions: np.ndarray,
    factors: list[float] | None = None,
    rotary_dim: int = 16,
) -> np.ndarray:
    inv_freq = np.array(_INV_FREQ[: rotary_dim // 2]).astype(np.float32)
    if factors is not None:
        inv_freq = inv_freq / np.array(factors, np.float32)
    angles = positions[:, None] * inv_freq.astype(np.float64)
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    head, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = np.concatenate([-head[..., half:], head[..., :half]], -1)
    return np.concatenate([head * cos + rotated * sin, rest], -1)


def test_rotary_moves_into_the_op_on_the_shared_buffer():
    """cos/sin caches evaluated from the graph's own angles: prefill + decode equal the rotated
    attention (numpy); angles that depend on the largest position stay a RotaryEmbedding."""
    model = _rotary_model(dynamic=False)
    irkit.optimize(model, "ort", rules=ort.default_rules(gqa_shared_buffer=8))
    (node,) = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert node.attributes["do_rotary"].value == 1
    assert "RotaryEmbedding" not in ops(model)
    rng, lengths = np.random.default_rng(1), [3, 5]
    q = rng.standard_normal((2, 4, 5, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 5, 16)).astype(np.float32) for _ in "kv")
    buffer = np.zeros((2, 2, 8, 16), np.float32)
    mask = np.array([[1] * n + [0] * (5 - n) for n in lengths], np.int64)
    positions = np.tile(np.arange(5), (2, 1))
    feeds = {"q": q, "k": k, "v": v, "pk": buffer, "pv": buffer}
    y, ko, vo = run_ort(model, {**feeds, "attention_mask": mask, "position_ids": positions})
    q1 = rng.standard_normal((2, 4, 1, 16)).astype(np.float32)
    k1, v1 = (rng.standard_normal((2, 2, 1, 16)).astype(np.float32) for _ in "kv")
    mask1 = np.array([[1] * (n + 1) + [0] * (5 - n) for n in lengths], np.int64)
    step = {"q": q1, "k": k1, "v": v1, "pk": ko, "pv": vo, "attention_mask": mask1}
    y1, _, _ = run_ort(model, {**step, "position_ids": np.array([[3], [5]])})
    for r, n in enumerate(lengths):
        keys = _rotate(np.concatenate([k[r, :, :n], k1[r]], 1), np.arange(n + 1))
        values = np.concatenate([v[r, :, :n], v1[r]], 1)
        want = _attend(_rotate(q[r, :, :n], np.arange(n)), keys[:, :n], values[:, :n], None)
        np.testing.assert_allclose(y[r, :, :n], want, atol=1e-4, rtol=1e-4)
        want1 = _attend(_rotate(q1[r], np.array([n])), keys, values, None)
        np.testing.assert_allclose(y1[r], want1, atol=1e-4, rtol=1e-4)
    dynamic = _rotary_model(dynamic=True)
    irkit.optimize(dynamic, "ort", rules=ort.default_rules(gqa_shared_buffer=8))
    (node,) = [n for n in dynamic.graph if n.op_type == "GroupQueryAttention"]
    assert "do_rotary" not in node.attributes
    assert ops(dynamic)["RotaryEmbedding"] == 2


def test_partial_rotary_moves_into_the_op_on_the_shared_buffer():
    """A rotation of the first 16 of 32 features (``rotary_embedding_dim=16``: Qwen3.5's
    partial rotary) becomes ``do_rotary`` with caches of 8 columns: onnxruntime's numbers
    before and after the rewrite (prefill of right-padded prompts, then a step) agree, and
    equal the rotated attention (numpy)."""
    before = _rotary_model(rotary_dim=16, head=32)
    model = _rotary_model(rotary_dim=16, head=32)
    irkit.optimize(model, "ort", rules=ort.default_rules(gqa_shared_buffer=8))
    (node,) = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert node.attributes["do_rotary"].value == 1
    assert "RotaryEmbedding" not in ops(model)
    assert list(node.inputs[7].shape) == [8, 8]  # (the cos cache: rotary_dim / 2 columns)
    rng, lengths = np.random.default_rng(3), [3, 5]
    q = rng.standard_normal((2, 4, 5, 32)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 5, 32)).astype(np.float32) for _ in "kv")
    buffer = np.zeros((2, 2, 8, 32), np.float32)
    mask = np.array([[1] * n + [0] * (5 - n) for n in lengths], np.int64)
    feeds = {"q": q, "k": k, "v": v, "pk": buffer, "pv": buffer, "attention_mask": mask}
    positions = np.tile(np.arange(5), (2, 1))
    y, ko, vo = run_ort(model, {**feeds, "position_ids": positions})
    for r, n in enumerate(lengths):  # (the padded rows' outputs are not compared)
        want = _attend(
            _rotate(q[r, :, :n], np.arange(n), rotary_dim=16),
            _rotate(k[r, :, :n], np.arange(n), rotary_dim=16),
            v[r, :, :n],
            None,
        )
        np.testing.assert_allclose(y[r, :, :n], want, atol=1e-4, rtol=1e-4)
    q1 = rng.standard_normal((2, 4, 1, 32)).astype(np.float32)
    k1, v1 = (rng.standard_normal((2, 2, 1, 32)).astype(np.float32) for _ in "kv")
    mask1 = np.array([[1] * (n + 1) + [0] * (5 - n) for n in lengths], np.int64)
    step = {"q": q1, "k": k1, "v": v1, "pk": ko, "pv": vo, "attention_mask": mask1}
    y1, _, _ = run_ort(model, {**step, "position_ids": np.array([[3], [5]])})
    for r, n in enumerate(lengths):
        keys = np.concatenate([k[r, :, :n], k1[r]], 1)
        keys = _rotate(keys, np.arange(n + 1), rotary_dim=16)
        values = np.concatenate([v[r, :, :n], v1[r]], 1)
        want1 = _attend(_rotate(q1[r], np.array([n]), rotary_dim=16), keys, values, None)
        np.testing.assert_allclose(y1[r], want1, atol=1e-4, rtol=1e-4)
        # the graph before the rewrite, on this row's unpadded cache (rotated keys, as stored)
        row = {"q": q1[r : r + 1], "k": k1[r : r + 1], "v": v1[r : r + 1]}
        row |= {"pk": ko[r : r + 1, :, :n], "pv": vo[r : r + 1, :, :n]}
        row |= {"attention_mask": np.ones((1, n + 1), np.int64), "position_ids": np.array([[n]])}
        np.testing.assert_allclose(y1[r], run_ort(before, row)[0][0], atol=1e-5, rtol=1e-5)


def test_partial_rotary_of_a_width_onnxruntime_refuses_stays_unfused():
    """A rotated width that is not a multiple of 16 (onnxruntime: "cos_cache dimension 1 must
    be … a multiple of 8"): the ``RotaryEmbedding`` stays, the attention still fuses."""
    model = _rotary_model(rotary_dim=8)
    irkit.optimize(model, "ort", rules=ort.default_rules(gqa_shared_buffer=8))
    (node,) = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert "do_rotary" not in node.attributes
    assert ops(model)["RotaryEmbedding"] == 2


def test_longrope_caches_switch_with_the_total_length_on_the_shared_buffer():
    """Angles of two regimes (longrope: short factors up to original_max_position_embeddings,
    then long ones for every position): both caches, chosen by the total length (Where on the
    attention mask's width); a prompt of the short regime, then a step of the long one equal the
    rotated attention (numpy)."""
    model = _rotary_model(longrope=True)
    irkit.optimize(model, "ort", rules=ort.default_rules(gqa_shared_buffer=8))
    (node,) = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert node.attributes["do_rotary"].value == 1
    assert "RotaryEmbedding" not in ops(model)
    cos_cache = node.inputs[7]
    assert cos_cache is not None and cos_cache.producer() is not None
    assert cos_cache.producer().op_type == "Where"  # type: ignore[union-attr]
    rng, lengths = np.random.default_rng(2), [3, _ORIGINAL]
    q = rng.standard_normal((2, 4, _ORIGINAL, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, _ORIGINAL, 16)).astype(np.float32) for _ in "kv")
    buffer = np.zeros((2, 2, 8, 16), np.float32)
    mask = np.array([[1] * n + [0] * (_ORIGINAL - n) for n in lengths], np.int64)
    positions = np.tile(np.arange(_ORIGINAL), (2, 1))
    feeds = {"q": q, "k": k, "v": v, "pk": buffer, "pv": buffer}
    y, ko, vo = run_ort(model, {**feeds, "attention_mask": mask, "position_ids": positions})
    q1 = rng.standard_normal((2, 4, 1, 16)).astype(np.float32)
    k1, v1 = (rng.standard_normal((2, 2, 1, 16)).astype(np.float32) for _ in "kv")
    mask1 = np.array([[1] * (n + 1) + [0] * (_ORIGINAL - n) for n in lengths], np.int64)
    step = {"q": q1, "k": k1, "v": v1, "pk": ko, "pv": vo, "attention_mask": mask1}
    y1, _, _ = run_ort(model, {**step, "position_ids": np.array([[3], [_ORIGINAL]])})
    for r, n in enumerate(lengths):
        keys = _rotate(k[r, :, :n], np.arange(n), _SHORT)  # (cached in the short regime)
        keys = np.concatenate([keys, _rotate(k1[r], np.array([n]), _LONG)], 1)
        values = np.concatenate([v[r, :, :n], v1[r]], 1)
        want = _attend(_rotate(q[r, :, :n], np.arange(n), _SHORT), keys[:, :n], values[:, :n], None)
        np.testing.assert_allclose(y[r, :, :n], want, atol=1e-4, rtol=1e-4)
        want1 = _attend(_rotate(q1[r], np.array([n]), _LONG), keys, values, None)
        np.testing.assert_allclose(y1[r], want1, atol=1e-4, rtol=1e-4)


_SLOPES = [0.5, 0.25, 0.125, 0.0625]


def _alibi_model(table: np.ndarray) -> ir.Model:
    """mpt's eager ALiBi attention over the concatenated cache: ``Softmax(Where(drop, -1e4,
    (Q @ Kᵀ) · scale + table[..., -T:])) @ V``, ``drop`` causal + padding from
    ``attention_mask``."""
    values = ", ".join(str(float(x)) for x in table.ravel())
    return parse(f"""g (float[B,4,S,16] q, float[B,4,S,16] k, float[B,4,S,16] v,
          float[B,4,P,16] pk, float[B,4,P,16] pv, int64[B,T] attention_mask)
      => (float[B,4,S,16] y, float[B,4,T2,16] kc, float[B,4,T2,16] vc) {{
        valid = Cast<to=9>(attention_mask)
        t_len = Shape<start=1, end=2>(attention_mask)
        t_sc = Squeeze(t_len)
        s_len = Shape<start=2, end=3>(q)
        s_sc = Squeeze(s_len)
        zero = Constant<value=int64 {{0}}>()
        one = Constant<value=int64 {{1}}>()
        kv_idx = Range(zero, t_sc, one)
        first = Sub(t_sc, s_sc)
        q_idx = Range(first, t_sc, one)
        col = Constant<value=int64[1] {{1}}>()
        q_col = Unsqueeze(q_idx, col)
        future = Greater(kv_idx, q_col)
        past_or_now = Not(future)
        axes = Constant<value=int64[2] {{1, 2}}>()
        valid4 = Unsqueeze(valid, axes)
        keep = And(past_or_now, valid4)
        drop = Not(keep)
        kc = Concat<axis=2>(pk, k)
        vc = Concat<axis=2>(pv, v)
        kt = Transpose<perm=[0, 1, 3, 2]>(kc)
        scores = MatMul(q, kt)
        scale = Constant<value=float {{0.25}}>()
        scaled = Mul(scores, scale)
        table = Constant<value=float[4, 1, 8] {{{values}}}>()
        width = Constant<value=int64[1] {{8}}>()
        keys = Shape<start=2, end=3>(kc)
        start = Sub(width, keys)
        last = Constant<value=int64[1] {{-1}}>()
        bias = Slice(table, start, width, last)
        biased = Add(scaled, bias)
        fill = Constant<value=float {{-10000}}>()
        masked = Where(drop, fill, biased)
        probs = Softmax<axis=-1>(masked)
        y = MatMul(probs, vc)
      }}""")


def _attend_alibi(q, keys, values) -> np.ndarray:
    """One row's causal ALiBi attention in float64, queries at the last positions of ``keys``."""
    s, total = q.shape[1], keys.shape[1]
    scores = q @ keys.transpose(0, 2, 1) * 0.25
    scores = scores + np.array(_SLOPES)[:, None, None] * np.arange(total)[None, None, :]
    keep = np.arange(total)[None, :] <= np.arange(total - s, total)[:, None]
    scores = np.where(keep, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ values


def test_eager_alibi_attention_on_the_shared_buffer():
    """The ALiBi slopes (the table's step per head) become GroupQueryAttention's
    attention_bias: a right-padded prefill into a capacity-8 buffer, then a decode step, equal
    numpy ALiBi attention."""
    table = np.array(_SLOPES)[:, None, None] * (np.arange(8) - 7.0)[None, None, :]
    model = _alibi_model(table)
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(gqa_shared_buffer=True), report=report)
    assert report.fired.get("GroupQueryAttentionALiBi") == 1, str(report)
    assert "Softmax" not in ops(model)
    (node,) = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert node.inputs[10] is not None  # attention_bias
    rng, lengths = np.random.default_rng(3), [3, 5]
    q, k, v = (rng.standard_normal((2, 4, 5, 16)).astype(np.float32) for _ in "qkv")
    buffer = np.zeros((2, 4, 8, 16), np.float32)
    mask = np.array([[1] * n + [0] * (5 - n) for n in lengths], np.int64)
    y, ko, vo = run_ort(model, [q, k, v, buffer, buffer, mask])
    q1, k1, v1 = (rng.standard_normal((2, 4, 1, 16)).astype(np.float32) for _ in "qkv")
    mask1 = np.array([[1] * (n + 1) + [0] * (5 - n) for n in lengths], np.int64)
    y1, _, _ = run_ort(model, [q1, k1, v1, ko, vo, mask1])
    for r, n in enumerate(lengths):
        want = _attend_alibi(q[r, :, :n], k[r, :, :n], v[r, :, :n])
        np.testing.assert_allclose(y[r, :, :n], want, atol=1e-4, rtol=1e-4)
        keys = np.concatenate([k[r, :, :n], k1[r]], 1)
        values = np.concatenate([v[r, :, :n], v1[r]], 1)
        np.testing.assert_allclose(y1[r], _attend_alibi(q1[r], keys, values), atol=1e-4, rtol=1e-4)


def test_eager_attention_with_a_table_not_linear_is_kept():
    table = np.random.default_rng(4).standard_normal((4, 1, 8))
    model = _alibi_model(table)
    report = RewriteReport()
    irkit.rewrite(
        model,
        ort.default_rules(gqa_shared_buffer=True),
        report=report,
        explain="GroupQueryAttentionALiBi",
    )
    assert report.rules["GroupQueryAttentionALiBi"].fired == 0
    assert "not linear along the keys" in report.explain(limit=100)
    assert "Softmax" in ops(model)


def test_a_dead_reader_does_not_block_the_alibi_rule():
    """A node nothing reads (constant folding leaves one where transformers casts the
    probabilities) is not a use of the match's intermediate values; it goes with the match."""
    table = np.array(_SLOPES)[:, None, None] * (np.arange(8) - 7.0)[None, None, :]
    model = _alibi_model(table)
    (softmax,) = [n for n in model.graph if n.op_type == "Softmax"]
    dead = ir.node("Neg", [softmax.outputs[0]])  # (no rule removes it: only the dead code pass)
    model.graph.insert_after(softmax, dead)
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(gqa_shared_buffer=True), report=report)
    assert report.fired.get("GroupQueryAttentionALiBi") == 1, str(report)
    assert dead.graph is None
    assert "Softmax" not in ops(model) and "Neg" not in ops(model)
