"""Float32 RMS-norm islands of a float16 graph → the float16 norm (``half_norms=True``, CUDA):
fire (exact op histograms; onnxruntime's float16 kernel vs the float32 island) and decline."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit.rewriting import RewriteReport
from irkit.rules import ort
from tests.helpers import run_ort
from tests.rules.ort.support import clone, feeds, ops, parse

# Qwen3.5's / Gemma's norm in half: upcast whole, scale 1 + w in float32, one rounding at the end
# (the export folds Cast(w, to=float) of the float16 weight into a float32 constant)
ISLAND = """g (float16[2,5,16] x, float16[2,5,16] r) => (float16[2,5,16] y, float16[2,5,16] z)
  <float[16] w = {{{w}}}> {{
  one = Constant<value=float {{{c}}}>()
  z = Add(x, r)  z32 = Cast<to=1>(z)  s = Add(w, one)
  n = RMSNormalization<axis=-1, epsilon=1e-6>(z32, s)  y = Cast<to=10>(n) }}"""

W = np.random.default_rng(3).standard_normal(16).astype(np.float16).astype(np.float32)


def _model(w: np.ndarray = W, c: float = 1.0, skip: bool = True) -> ir.Model:
    text = ISLAND.format(w=", ".join(repr(float(v)) for v in w), c=repr(c))
    if not skip:  # the sum is no output: only the norm reads it
        text = text.replace(", float16[2,5,16] z)", ")")
    return parse(text)


def _rewrite(model: ir.Model, explain: str | None = None) -> RewriteReport:
    report = RewriteReport()
    rules = ort.default_rules(skip_norm=True, half_norms=True)
    irkit.rewrite(model, rules, report=report, explain=explain)
    return report


def _same_numbers(before: ir.Model, after: ir.Model) -> None:
    inputs = [v * 8 for v in feeds(before)]  # (|x| > 256 squared: float16 would overflow)
    for got, want in zip(run_ort(after, inputs), run_ort(before, inputs), strict=True):
        assert got.dtype == want.dtype == np.float16
        # the float32 statistics of the island; the scale 1 + w rounded to float16 once more
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3
        )


def _loaded_ops(model: ir.Model, tmp_path) -> list[str]:
    """The op types onnxruntime runs after its load-time folding (basic level, CPU)."""
    import onnx
    import onnxruntime

    ir.save(model, tmp_path / "m.onnx")
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), options)
    return sorted(n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx")).graph.node)


@pytest.mark.parametrize("skip", [True, False])
def test_half_island_with_residual_fires(skip, tmp_path):
    """The island of a residual sum (an output too, or the norm's input only) and the sum:
    ``SkipSimplifiedLayerNormalization`` with the float16 scale ``w + 1``."""
    model = _model(skip=skip)
    before = clone(model)
    report = _rewrite(model)
    assert report.fired.get("HalfSkipSimplifiedLayerNormalizationOffset") == 1, str(report)
    # the scale Cast(w + 1, to=float16): a float32 constant expression onnxruntime folds
    expected = {"Add": 1, "Cast": 1, "Constant": 1, "SkipSimplifiedLayerNormalization": 1}
    assert ops(model) == expected
    assert _loaded_ops(model, tmp_path) == ["SkipSimplifiedLayerNormalization"]
    _same_numbers(before, model)


def test_half_island_alone_fires(tmp_path):
    """The norm of a value that is no residual sum: the float16 norm, no Casts left."""
    model = parse(
        ISLAND.format(w=", ".join(repr(float(v)) for v in W), c="1.0").replace(
            "z = Add(x, r)  z32 = Cast<to=1>(z)", "z = Mul(x, r)  z32 = Cast<to=1>(z)"
        )
    )
    before = clone(model)
    report = _rewrite(model)
    assert report.fired.get("HalfRMSNormalizationOffset") == 1, str(report)
    assert ops(model) == {"Add": 1, "Cast": 1, "Constant": 1, "Mul": 1, "RMSNormalization": 1}
    # (the CPU wraps its float16 Mul in Casts: it has no float16 kernel; the scale is folded)
    assert "Add" not in _loaded_ops(model, tmp_path)
    norm = next(n for n in model.graph if n.op_type == "RMSNormalization")
    assert norm.inputs[0].dtype == ir.DataType.FLOAT16
    _same_numbers(before, model)


def test_half_island_declines_a_scale_float16_cannot_hold():
    """A float32 weight with more bits than float16 keeps its island (no silent rounding)."""
    w = W + np.float32(2**-20)
    report = _rewrite(model := _model(w=w), explain="HalfSkipSimplifiedLayerNormalizationOffset")
    stats = report.rules["HalfSkipSimplifiedLayerNormalizationOffset"]
    assert stats.fired == 0 and stats.tried >= 1
    reason = "neither a Cast of float16 nor a constant float16 holds"
    assert any(reason in r for r in stats.failures), dict(stats.failures)
    assert ops(model)["Cast"] == 2


def test_half_norms_are_off_by_default():
    model = _model()
    report = RewriteReport()
    irkit.rewrite(model, ort.default_rules(skip_norm=True), report=report)
    assert "HalfRMSNormalizationOffset" not in report.rules
    assert ops(model)["Cast"] == 2


def test_half_island_of_a_cast_weight_fires():
    """The scale a ``Cast`` of a float16 weight (not folded): the weight itself, exactly."""
    model = parse("""g (float16[2,5,16] x, float16[16] w) => (float16[2,5,16] y) {
      x32 = Cast<to=1>(x)  w32 = Cast<to=1>(w)
      n = RMSNormalization<axis=-1, epsilon=1e-6>(x32, w32)  y = Cast<to=10>(n) }""")
    before = clone(model)
    report = _rewrite(model)
    assert report.fired.get("HalfRMSNormalization") == 1, str(report)
    assert ops(model) == {"RMSNormalization": 1}
    _same_numbers(before, model)


GATED = """g (float16[2,5,16] x, float16[16] w, float16[2,5,16] g) => (float16[2,5,16] y) {
  n = RMSNormalization<axis=-1, epsilon=1e-6>(x, w)  n32 = Cast<to=1>(n)  g32 = Cast<to=1>(g)
  sg = Sigmoid(g32)  silu = Mul(g32, sg)  m = Mul(n32, silu)  y = Cast<to=10>(m) }"""


def test_half_gated_norm_fires():
    """Qwen3.5's gated output norm in half (the gate's SiLU in float32): ``GatedRMSNorm`` in
    float16, which computes in float32 inside; the Cast pair after it goes too."""
    model = parse(GATED)
    before = clone(model)
    report = _rewrite(model)
    assert report.fired.get("HalfGatedRMSNorm") == 1, str(report)
    assert report.fired.get("HalfRoundTripCast") == 1, str(report)
    assert ops(model) == {"GatedRMSNorm": 1}
    _same_numbers(before, model)


def test_half_gated_norm_declines_a_float32_reader():
    """The float32 product read as float32 (not rounded to half): the fused op would round it."""
    model = parse(GATED.replace("(float16[2,5,16] y)", "(float16[2,5,16] y, float[2,5,16] m)"))
    report = _rewrite(model, explain="HalfGatedRMSNorm")
    stats = report.rules["HalfGatedRMSNorm"]
    assert stats.fired == 0
    assert any("read by more than Casts to float16" in r for r in stats.failures), stats.failures
