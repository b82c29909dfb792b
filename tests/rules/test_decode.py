"""Rule set :func:`irkit.rules.decode.quantized_rules`: a quantized decode step's last fusions.

Hand-written graphs (fast): the rotary angles become tables read at the position ids, with
onnxruntime's numbers unchanged, and the reasons the rule declines. The tiny Llama (slow): exact
op histograms after ``irkit.quantize`` and the rules; onnxruntime against eager transformers.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit.rules.decode import quantized_rules, rotary_position_table
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


def test_quantized_rules_names():
    assert quantized_rules().names() == [
        "SkipSimplifiedLayerNormalization",
        "SkipLayerNormalization",
    ]
    assert quantized_rules(max_positions=8).names()[-1] == "RotaryPositionTable"


# --- the tiny Llama's quantized decode step ------------------------------------------------------


@pytest.mark.slow
def test_tiny_llama_quantized_step_with_skip_norms_and_rotary_tables():
    from tests.helpers import FP32_ATOL
    from tests.rules.test_glue import AFTER, _eager_check, _tiny_llama

    lm, flat, _ = _tiny_llama()
    model = irkit.optimize(util.clone(flat))
    assert util.ops(model) == AFTER
    irkit.quantize(model)
    report = irkit.RewriteReport()
    irkit.optimize(model, rules=quantized_rules(max_positions=256), report=report)
    assert report.fired["SkipSimplifiedLayerNormalization"] == 4  # 2 layers: 2 residual adds
    assert report.fired["RotaryPositionTable"] == 4  # q and k per layer
    expected = {
        **{k: v for k, v in AFTER.items() if k not in ("MatMul", "Cos", "Sin")},
        "Add": 2,  # the mask's position arithmetic
        "Cast": 1,  # the mask's (the positions' went with the angles)
        "MatMulNBits": 9,
        "Mul": 4,  # SiLU and the gate (the angles' went)
        "RMSNormalization": 1,  # the first layer's input norm
        "SkipSimplifiedLayerNormalization": 4,
        "Unsqueeze": 3,
    }
    assert util.ops(model) == expected
    assert sum(expected.values()) == sum(AFTER.values()) - 9
    _eager_check(lm, model, 0.6)

    fp32 = irkit.optimize(util.clone(flat))  # the same rules keep a float model's numbers
    irkit.optimize(fp32, rules=quantized_rules(max_positions=256))
    assert util.ops(fp32) == {
        **{k: v for k, v in expected.items() if k != "MatMulNBits"},
        "MatMul": 9,
    }
    _eager_check(lm, fp32, FP32_ATOL)
