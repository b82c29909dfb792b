"""irkit.rules.fp32_islands.keep_fp32: named ops computed in float32 inside a float16 graph.

The root mean square of values near 1000 overflows in float16 (``x²`` is past 65504) and is
exact with the island; the Casts sit only at the island's border; function bodies too.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from irkit.rules.fp32_islands import OVERFLOW_OPS, keep_fp32
from tests.helpers import run_ort
from tests.rewriting import util

RMS = """<ir_version: 10, opset_import: ["" : 18]>
g (float16[2,8] x) => (float[2,1] y, float16[2,1] r, float16[2,8] z) {
  two = Constant<value=float {2.0}>()  ax = Constant<value=int64[1] {-1}>()
  p = Pow(x, two)  m = ReduceMean(p, ax)  y = Cast<to=1>(m)  r = Sqrt(m)  z = Relu(x) }"""

X = (np.random.default_rng(0).uniform(900, 1100, (2, 8)) * np.array([1, -1] * 4)).astype(np.float16)
MEAN_SQUARE = np.mean(X.astype(np.float32) ** 2, axis=-1, keepdims=True)


def _model(text: str = RMS) -> ir.Model:
    return util.infer_shapes(ir.from_onnx_text(text))  # (the pass reads the values' types)


def test_mean_square_overflows_in_fp16_and_not_in_the_island():
    model = _model()
    with np.errstate(over="ignore"):
        assert np.isinf(np.mean(X**2, axis=-1)).all()  # x² > 65504: inf in float16 arithmetic
    assert keep_fp32(model) == 3
    util.assert_valid(model)
    # in: x → float; out: after Sqrt; the model's Cast to float reads the float32 mean directly
    assert util.ops(model) == {
        "Cast": 3,
        "Constant": 2,
        "Pow": 1,
        "ReduceMean": 1,
        "Relu": 1,
        "Sqrt": 1,
    }
    assert [v.dtype for v in model.graph.outputs] == [
        ir.DataType.FLOAT,
        ir.DataType.FLOAT16,
        ir.DataType.FLOAT16,
    ]
    assert [v.name for v in model.graph.outputs] == ["y", "r", "z"]
    y, r, z = run_ort(model, [X])
    np.testing.assert_allclose(y, MEAN_SQUARE, rtol=1e-5)
    np.testing.assert_allclose(r.astype(np.float32), np.sqrt(MEAN_SQUARE), rtol=1e-3)
    np.testing.assert_array_equal(z, np.maximum(X, 0))


def test_only_the_named_ops_move():
    model = _model()
    assert keep_fp32(model, ["Sqrt"]) == 1
    assert util.ops(model)["Cast"] == 3  # the model's own, Sqrt's in and out
    assert "Relu" not in OVERFLOW_OPS and keep_fp32(model, ["Relu"]) == 1


def test_float32_graph_is_left_alone():
    model = _model(RMS.replace("float16", "float"))
    assert keep_fp32(model) == 0
    assert util.ops(model) == {
        "Cast": 1,
        "Constant": 2,
        "Pow": 1,
        "ReduceMean": 1,
        "Relu": 1,
        "Sqrt": 1,
    }


def test_function_bodies():
    text = """<ir_version: 10, opset_import: ["" : 18, "local" : 1]>
g (float16[2,8] x) => (float[2,1] y) { y = local.MeanSquare(x) }
<domain: "local", opset_import: ["" : 18]>
MeanSquare (a) => (b) {
  two = Constant<value=float {2.0}>()  ax = Constant<value=int64[1] {-1}>()
  p = Pow(a, two)  m = ReduceMean(p, ax)  b = Cast<to=1>(m) }"""
    model = ir.from_onnx_text(text)
    # (a function's values have no types in ONNX text: give them, as irkit's functions have)
    body = next(iter(model.functions.values()))
    half = ir.DataType.FLOAT16
    body.inputs[0].dtype = half
    for node in body:
        if node.op_type in ("Pow", "ReduceMean"):
            node.outputs[0].dtype = half
    assert keep_fp32(model) == 2
    assert util.ops(body) == {"Cast": 2, "Constant": 2, "Pow": 1, "ReduceMean": 1}
    (y,) = run_ort(model, [X])
    np.testing.assert_allclose(y, MEAN_SQUARE, rtol=1e-5)
