"""Rule set :func:`irkit.rules.decode.quantized_rules`: a quantized decode step's last fusions.

Hand-written graphs (fast): the rotary angles become tables read at the position ids, with
onnxruntime's numbers unchanged, and the reasons the rule declines. The tiny Llama (slow): exact
op histograms after ``irkit.quantize`` and the rules; onnxruntime against eager transformers.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit.rules.decode import (
    causal_padding_mask,
    quantized_rules,
    quick_gelu,
    rotary_position_table,
)
from tests.rewriting import util

H = '<ir_version: 10, opset_import: ["" : 23]>\n'


def rotary_text(freq: str = "f = Constant<value=float[4] {1.0, 0.1, 0.01, 0.001}>()") -> str:
    """Q and K rotations (4 and 2 heads of 8) whose angles are computed from the position ids."""
    inputs = "float[b, s, 32] q, float[b, s, 16] k, int64[b, s] pos"
    if not freq:
        inputs += ", float[4] f"
    return H + (
        f"g ({inputs}) => (float[b, s, 32] rq, float[b, s, 16] rk) {{\n"
        f"  {freq}\n"
        "  axes = Constant<value=int64[1] {-1}>()\n"
        "  u = Unsqueeze(pos, axes)  pf = Cast<to=1>(u)  a = Mul(pf, f)\n"
        "  c = Cos(a)  sn = Sin(a)\n"
        "  rq = RotaryEmbedding<num_heads=4>(q, c, sn)  rk = RotaryEmbedding<num_heads=2>(k, c, sn)\n"
        "}"
    )


def _feeds(m: ir.Model, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((2, 3, 32)).astype(np.float32),
        "k": rng.standard_normal((2, 3, 16)).astype(np.float32),
        "pos": np.array([[0, 1, 2], [40, 41, 63]], dtype=np.int64),
        **({"f": np.array([1.0, 0.1, 0.01, 0.001], np.float32)} if len(m.graph.inputs) > 3 else {}),
    }


def test_rotary_angles_become_tables_read_at_the_positions():
    m = util.infer_shapes(util.model(rotary_text()))
    before = util.clone(m)
    report = irkit.RewriteReport()
    irkit.optimize(m, rules=rotary_position_table(64), report=report)
    assert report.fired["RotaryPositionTable"] == 2
    assert util.ops(m) == {"RotaryEmbedding": 2}
    rotations = [n for n in m.graph if n.op_type == "RotaryEmbedding"]
    assert [n.attributes.get_int("num_heads") for n in rotations] == [4, 2]
    assert all(n.inputs[3] is m.graph.inputs[2] for n in rotations)  # the position ids
    (cos_table, sin_table) = {v.name: v for n in rotations for v in n.inputs[1:3]}.values()
    assert cos_table.const_value is not None and cos_table.const_value.shape == (64, 4)
    np.testing.assert_allclose(
        cos_table.const_value.numpy()[63], np.cos(63 * np.float32([1.0, 0.1, 0.01, 0.001]))
    )
    assert sin_table.const_value is not None
    feeds = _feeds(before)
    for want, got in zip(util.run_ort(before, feeds), util.run_ort(m, feeds), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_rotary_tables_need_constant_frequencies():
    m = util.infer_shapes(util.model(rotary_text(freq="")))
    report = irkit.RewriteReport()
    irkit.optimize(m, rules=rotary_position_table(64), report=report, explain="RotaryPositionTable")
    stats = report.rules["RotaryPositionTable"]
    assert stats.fired == 0
    assert any("not a float32 constant" in r for r in stats.failures), dict(stats.failures)
    assert util.ops(m)["Cos"] == 1


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_rotary_tables_need_a_positive_number_of_positions(bad):
    from irkit.errors import RuleDefinitionError

    with pytest.raises(RuleDefinitionError, match="max_positions"):
        rotary_position_table(bad)


SILU = H.replace('"" : 23', '"" : 23, "com.microsoft" : 1') + (
    "g (float[b, 8] x, float[b, 8] y) => (float[b, 8] z, float[b, 8] w) {\n"
    "  sx = Sigmoid(x)  z = Mul(sx, x)  sy = Sigmoid(y)  w = Mul(x, sy)\n"
    "}"
)


def test_silu_becomes_quick_gelu():
    m = util.infer_shapes(util.model(SILU))
    before = util.clone(m)
    report = irkit.RewriteReport()
    irkit.optimize(m, rules=quick_gelu(), report=report, explain="SiLU")
    assert report.fired["SiLU"] == 1  # x·Sigmoid(x); x·Sigmoid(y) is not SiLU
    assert util.ops(m) == {"QuickGelu": 1, "Sigmoid": 1, "Mul": 1}
    (node,) = [n for n in m.graph if n.op_type == "QuickGelu"]
    assert node.domain == "com.microsoft" and node.attributes.get_float("alpha") == 1.0
    rng = np.random.default_rng(0)
    feeds = {n: 4 * rng.standard_normal((3, 8)).astype(np.float32) for n in ("x", "y")}
    for want, got in zip(util.run_ort(before, feeds), util.run_ort(m, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def mask_text(fill: str = "-3.4028234663852886e+38") -> str:
    """The export's causal ∧ padding mask feeding a cached, head-folded Attention."""
    return H + (
        "g (float[b, s, 32] q, float[b, s, 16] k, float[b, s, 16] v, float[b, 2, p, 8] pk,"
        " float[b, 2, p, 8] pv, int64[b, s] ids, int64[b, t] am)"
        " => (float[b, s, 32] y, float[b, 2, t, 8] ok, float[b, 2, t, 8] ov) {\n"
        "  ss = Shape<start=1, end=2>(ids)  n = Squeeze(ss)\n"
        "  ps = Shape<start=2, end=3>(pk)  past = Squeeze(ps)\n"
        "  total = Add(past, n)  mb = Cast<to=9>(am)\n"
        "  zero = Constant<value=int64 {0}>()  one = Constant<value=int64 {1}>()\n"
        "  r1 = Range(zero, n, one)  qp = Add(r1, past)  r2 = Range(zero, total, one)\n"
        "  a013 = Constant<value=int64[3] {0, 1, 3}>()  a012 = Constant<value=int64[3] {0, 1, 2}>()\n"
        "  qc = Unsqueeze(qp, a013)  kc = Unsqueeze(r2, a012)  causal = LessOrEqual(kc, qc)\n"
        "  one1 = Constant<value=int64[1] {1}>()  zero1 = Constant<value=int64[1] {0}>()\n"
        "  t1 = Reshape(total, one1)  sl = Slice(mb, zero1, t1, one1)\n"
        "  a12 = Constant<value=int64[2] {1, 2}>()  pad = Unsqueeze(sl, a12)\n"
        "  both = And(causal, pad)\n"
        f"  z = Constant<value=float {{0.0}}>()  low = Constant<value=float {{{fill}}}>()\n"
        "  m = Where(both, z, low)\n"
        "  y, ok, ov = Attention<q_num_heads=4, kv_num_heads=2, scale=0.3>(q, k, v, m, pk, pv)\n"
        "}"
    )


def _mask_feeds(seq: int, past: int, pad: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    am = np.ones((2, past + seq), np.int64)
    am[0, :pad] = 0
    return {
        "q": rng.standard_normal((2, seq, 32)).astype(np.float32),
        "k": rng.standard_normal((2, seq, 16)).astype(np.float32),
        "v": rng.standard_normal((2, seq, 16)).astype(np.float32),
        "pk": rng.standard_normal((2, 2, past, 8)).astype(np.float32),
        "pv": rng.standard_normal((2, 2, past, 8)).astype(np.float32),
        "ids": np.zeros((2, seq), np.int64),
        "am": am,
    }


@pytest.mark.parametrize("fill", ["-3.4028234663852886e+38", "-inf"], ids=["lowest", "inf"])
def test_causal_padding_mask_becomes_is_causal(fill):
    m = util.infer_shapes(util.model(mask_text(fill)))
    before = util.clone(m)
    report = irkit.RewriteReport()
    irkit.optimize(m, rules=causal_padding_mask(), report=report)
    assert report.fired["CausalPaddingMask"] == 1
    assert util.ops(m) == {
        "Attention": 1, "Cast": 1, "Concat": 1, "Expand": 1, "Shape": 1, "Unsqueeze": 1,
        "Where": 1,
    }  # fmt: skip
    (att,) = [n for n in m.graph if n.op_type == "Attention"]
    assert att.attributes.get_int("is_causal") == 1
    assert att.attributes.get_float("scale") == pytest.approx(0.3)
    # prefill with a past and fully masked rows (padding 4 > past 2), prefill, decode
    for seq, past, pad in [(3, 2, 4), (4, 0, 2), (1, 6, 3), (1, 5, 0)]:
        feeds = _mask_feeds(seq, past, pad)
        for want, got in zip(util.run_ort(before, feeds), util.run_ort(m, feeds), strict=True):
            if fill == "-inf":  # (lowest: the graph averages a fully masked row, the op 0)
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
            else:
                np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-6)


def test_causal_padding_mask_needs_the_lowest_fill():
    m = util.infer_shapes(util.model(mask_text(fill="-10000.0")))
    report = irkit.RewriteReport()
    irkit.optimize(m, rules=causal_padding_mask(), report=report, explain="CausalPaddingMask")
    assert report.fired.get("CausalPaddingMask", 0) == 0
    assert any("lowest" in r for r in report.rules["CausalPaddingMask"].failures)
    assert util.ops(m)["LessOrEqual"] == 1


def test_quantized_rules_names():
    assert quantized_rules().names() == [
        "SkipSimplifiedLayerNormalizationOffset",
        "SkipSimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SiLU",
        "CausalPaddingMask",
    ]
    assert quantized_rules(max_positions=8).names()[-1] == "RotaryPositionTable"


# --- the tiny Llama's quantized decode step ------------------------------------------------------


def _padded_feeds(lm, batch: int, seq: int, past: int, pad: int) -> dict[str, np.ndarray]:
    """Feeds with the first sequence left-padded by ``pad`` (rows of queries at padded
    positions see no key when ``pad > past``: fully masked)."""
    from irkit.llm import causal_lm_feeds

    feeds = causal_lm_feeds(lm, batch=batch, seq=seq, past=past, seed=pad + past)
    feeds["attention_mask"][0, :pad] = 0
    positions = np.maximum(np.cumsum(feeds["attention_mask"], -1) - 1, 0)
    feeds["position_ids"] = positions[:, past:]
    return feeds


@pytest.mark.slow
def test_tiny_llama_quantized_step_with_skip_norms_and_rotary_tables():
    from tests.helpers import FP32_ATOL, ort_session
    from tests.rules.test_glue import AFTER, _eager_check, _tiny_llama

    lm, flat, _ = _tiny_llama()
    model = irkit.optimize(util.clone(flat))
    assert util.ops(model) == AFTER
    irkit.quantize(model)
    quantized = util.clone(model)
    report = irkit.RewriteReport()
    irkit.optimize(model, rules=quantized_rules(max_positions=256), report=report)
    assert report.fired["SkipSimplifiedLayerNormalization"] == 4  # 2 layers: 2 residual adds
    assert report.fired["RotaryPositionTable"] == 4  # q and k per layer
    assert report.fired["SiLU"] == 2
    assert report.fired["CausalPaddingMask"] == 2  # one per layer, one mask (CSE)
    expected = {
        "Attention": 2,
        "Cast": 1,  # the padding mask: Cast, Unsqueeze, Where, Shape (input_ids), Concat, Expand
        "Concat": 1,
        "Expand": 1,
        "Gather": 1,
        "MatMulNBits": 11,
        "Mul": 2,  # the gate
        "QuickGelu": 2,  # SiLU
        "RMSNormalization": 1,  # the first layer's input norm
        "RotaryEmbedding": 4,
        "Shape": 1,
        "SkipSimplifiedLayerNormalization": 4,
        "Split": 2,
        "Unsqueeze": 1,
        "Where": 1,
    }
    assert util.ops(model) == expected
    assert sum(expected.values()) == sum(AFTER.values()) - 22
    (mask,) = {n.inputs[3] for n in model.graph if n.op_type == "Attention"}
    assert mask.producer().op_type == "Expand"
    _eager_check(lm, model, 0.6)

    # The mask rule alone keeps onnxruntime's numbers: padded rows, fully masked query rows
    # (padding longer than the past), prefill with and without a past, decode.
    masked = util.clone(quantized)
    irkit.optimize(masked, rules=causal_padding_mask())
    new_mask = {"Cast": 1, "Concat": 1, "Expand": 1, "Shape": 1, "Unsqueeze": 1, "Where": 1}
    want = collections.Counter(util.ops(quantized))
    want.subtract(_MASK_CHAIN)
    want.update(new_mask)
    assert util.ops(masked) == {k: n for k, n in want.items() if n}
    # The query rows whose every key is masked (padding longer than the past) are 0 in the
    # graph (the -inf fill and the NaN guard, as torch) and with is_causal and the padding mask
    # (onnxruntime's Attention). Every row and every kept key's present are the same.
    before, after = ort_session(quantized), ort_session(masked)
    for batch, seq, past, pad in [(2, 4, 1, 3), (2, 5, 0, 2), (2, 1, 9, 4), (2, 5, 3, 2)]:
        feeds = _padded_feeds(lm, batch, seq, past, pad)
        kept = feeds["attention_mask"] != 0  # (batch, past + seq)
        outputs = zip(before.run(None, feeds), after.run(None, feeds), strict=True)
        (want, got), *presents = outputs
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        for want, got in presents:
            np.testing.assert_allclose(
                got.transpose(0, 2, 1, 3)[kept], want.transpose(0, 2, 1, 3)[kept], atol=1e-6
            )

    # A fill that is not the lowest value gives fully masked rows other numbers: declined.
    other = util.clone(quantized)
    (where,) = [n for n in other.graph if n.op_type == "Where"]
    fill = ir.Value(name="fill", const_value=ir.tensor(np.float32(-1e4)))
    fill.type, fill.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([])
    other.graph.register_initializer(fill)
    where.replace_input_with(2, fill)
    report = irkit.RewriteReport()
    irkit.optimize(other, rules=causal_padding_mask(), report=report, explain="CausalPaddingMask")
    assert report.fired.get("CausalPaddingMask", 0) == 0
    assert any("lowest" in r for r in report.rules["CausalPaddingMask"].failures)
    assert util.ops(other)["Where"] == 1

    fp32 = irkit.optimize(util.clone(flat))  # the same rules keep a float model's numbers
    irkit.optimize(fp32, rules=quantized_rules(max_positions=256))
    assert util.ops(fp32) == {
        **{k: v for k, v in expected.items() if k != "MatMulNBits"},
        "MatMul": 11,
    }
    _eager_check(lm, fp32, FP32_ATOL)


_MASK_CHAIN = {  # the export's causal ∧ padding mask (17 nodes)
    "Add": 2, "And": 1, "Cast": 1, "LessOrEqual": 1, "Range": 2, "Reshape": 1, "Shape": 2,
    "Slice": 1, "Squeeze": 2, "Unsqueeze": 3, "Where": 1,
}  # fmt: skip
