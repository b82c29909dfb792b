"""``irkit optimize`` runs ONNX shape inference first: rules whose preconditions are shapes fire
on files whose intermediate values have none (as the stock exporter writes them)."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit.cli import infer_shapes, main
from tests import helpers

# `u` has no shape in the file: whether Add(u, zeros[3]) broadcasts u cannot be decided without
# shape inference, so AddZero fires only after it.
_NO_SHAPES = """<ir_version: 10, opset_import: ["" : 20]>
g (float[2,3] x) => (float[2,3] y) {
  z = Constant<value=float[3] {0, 0, 0}>()  u = Relu(x)  t = Add(u, z)  y = Neg(t) }"""


@pytest.fixture
def no_shapes(tmp_path):
    path = tmp_path / "no_shapes.onnx"
    irkit.save(ir.from_onnx_text(_NO_SHAPES), path)
    return path


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)


def test_shape_inference_lets_shape_rules_fire(no_shapes, capsys):
    digest = hashlib.sha256(no_shapes.read_bytes()).hexdigest()
    out_path = no_shapes.parent / "out.onnx"
    assert main(["optimize", str(no_shapes), "-o", str(out_path)]) == 0
    text = capsys.readouterr().out
    assert "  nodes       4 → 2 in the main graph\n" in text
    assert "    AddZero                          ×1\n" in text
    assert " s optimize (shape inference " in text
    out = irkit.load(out_path)
    assert [n.op_type for n in out.graph] == ["Relu", "Neg"]
    np.testing.assert_array_equal(
        helpers.run_ort(out, [_x()])[0], helpers.run_ort(no_shapes, [_x()])[0]
    )
    assert hashlib.sha256(no_shapes.read_bytes()).hexdigest() == digest


def test_no_shape_inference_leaves_the_shape_rule_undecided(no_shapes, capsys):
    out_path = no_shapes.parent / "out.onnx"
    args = ["optimize", str(no_shapes), "-o", str(out_path), "--no-shape-inference", "-v"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "  nodes       4 → 3 in the main graph\n" in text  # (the Constant is lifted)
    assert "shape inference" not in text
    assert "x's shape unknown" in text  # AddZero's reason in the per-rule statistics
    assert [n.op_type for n in irkit.load(out_path).graph] == ["Relu", "Add", "Neg"]


def test_infer_shapes_fills_only_what_it_can():
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 20, "custom" : 1]>
g (float[2,3] x) => (float[2,3] y) { u = Relu(x)  v = custom.Opaque(u)  y = Neg(v) }"""
    )
    infer_shapes(m)
    u, v = (n.outputs[0] for n in list(m.graph)[:2])
    assert u.shape == ir.Shape([2, 3]) and u.dtype == ir.DataType.FLOAT
    assert v.shape is None  # an op ONNX does not know: left unknown, no error


def test_infer_shapes_never_replaces_a_known_shape():
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 20]>
g (float[2,3] x) => (float[2,3] y) { u = Relu(x)  v = Relu(u)  y = Neg(v) }"""
    )
    u, v = (n.outputs[0] for n in list(m.graph)[:2])
    u.shape = ir.Shape(["rows", 3])  # what the model says; inference would say [2, 3]
    infer_shapes(m)
    assert u.shape == ir.Shape(["rows", 3])
    assert v.shape is not None and v.shape[1] == 3


def test_infer_shapes_failing_leaves_the_model_unchanged(monkeypatch, caplog):
    import onnx

    def reject(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] rejected")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", reject)
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 20]>
g (float[2,3] x) => (float[2,3] y) { u = Relu(x)  y = Neg(u) }"""
    )
    infer_shapes(m)
    assert m.graph.node(0).outputs[0].shape is None
    assert [v.name for v in m.graph.inputs] == ["x"]  # the helper restored the inputs
    assert "shape inference failed, the model keeps its shapes: [ShapeInferenceError] rejected" in (
        caplog.text
    )


# --- the same from Python: irkit.optimize infers shapes when the model lacks them -----------------


def test_python_optimize_infers_missing_shapes_by_default():
    m = ir.from_onnx_text(_NO_SHAPES)
    report = irkit.RewriteReport()
    irkit.optimize(m, report=report)
    assert [n.op_type for n in m.graph] == ["Relu", "Neg"]
    assert report.fired["AddZero"] == 1
    assert "infer_shapes" in report.passes


def test_python_optimize_infer_shapes_false_leaves_the_rule_undecided():
    m = ir.from_onnx_text(_NO_SHAPES)
    irkit.optimize(m, infer_shapes=False)
    assert [n.op_type for n in m.graph] == ["Relu", "Add", "Neg"]


def test_python_optimize_skips_inference_when_shapes_are_known(monkeypatch):
    import irkit._pipeline as pipeline

    def forbidden(model):
        raise AssertionError("shape inference ran on a model with its shapes")

    monkeypatch.setattr(pipeline, "infer_shapes", forbidden)
    m = ir.from_onnx_text(_NO_SHAPES)
    for node in m.graph:  # every value with a shape, as irkit.lower writes them
        for value in node.outputs:
            value.shape = ir.Shape([2, 3] if node.op_type != "Constant" else [3])
    report = irkit.RewriteReport()
    irkit.optimize(m, report=report)
    assert [n.op_type for n in m.graph] == ["Relu", "Neg"]
    assert "infer_shapes" not in report.passes


def test_python_optimize_trusts_the_shapes_of_a_lowered_model(monkeypatch):
    import irkit._pipeline as pipeline

    monkeypatch.setattr(pipeline, "infer_shapes", lambda model: pytest.fail("inference ran"))
    m = ir.from_onnx_text(_NO_SHAPES)
    m.producer_name = "irkit"  # what irkit.lower writes: torch's shapes, no inference needed
    irkit.optimize(m)
    assert [n.op_type for n in m.graph] == ["Relu", "Add", "Neg"]
