"""Constant folding inside irkit.optimize: what onnxscript's folder must not see, and whose fault
a failing pass is (found by onnx's backend test data, tests/conformance/test_onnx_backend.py)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxscript.optimizer
import pytest

import irkit
from irkit.rewriting._optimize import hide_from_folder
from tests.helpers import run_ort

_CONCAT = """<ir_version: 8, opset_import: ["" : {opset}]>
g (float[2,3] x, float[2,3] y) => (float[2,3,2] out) {{
  seq = SequenceConstruct(x, y)
  out = ConcatFromSequence<axis=-1, new_axis=1>(seq)
}}"""


def _inputs(model: ir.Model) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal([int(d) for d in v.shape]).astype(np.float32)
        for v in model.graph.inputs
    ]


def _optimized_runs_the_same(text: str) -> ir.Model:
    before = ir.from_onnx_text(text)
    model = irkit.optimize(ir.from_onnx_text(text))
    inputs = _inputs(before)
    for a, e in zip(run_ort(model, inputs), run_ort(before, inputs), strict=True):
        np.testing.assert_array_equal(a, e)
    return model


def test_sequence_ops_of_an_old_opset_are_not_folded_into_newer_forms():
    # The folder would write Unsqueeze with an axes input (opset 13) into an opset-12 model.
    model = _optimized_runs_the_same(_CONCAT.format(opset=12))
    assert [n.op_type for n in model.graph] == ["SequenceConstruct", "ConcatFromSequence"]
    assert all(n.domain == "" for n in model.graph)  # (restored after folding)


def test_sequence_ops_of_a_recent_opset_are_still_folded():
    model = _optimized_runs_the_same(_CONCAT.format(opset=18))
    assert sorted(n.op_type for n in model.graph) == ["Concat", "Unsqueeze", "Unsqueeze"]


def test_split_to_sequence_with_dynamic_scalar_split_is_left_to_the_runtime():
    # onnxscript's evaluator fails on a 0-d split that is not a constant (onnx's
    # test_split_to_sequence_1); it was refused as "malformed" though irkit.check accepts it.
    text = """<ir_version: 10, opset_import: ["" : 24]>
    g (float[3,6] data, int64 split) => (seq(float[3,?]) out) {
      out = SplitToSequence<axis=1>(data, split)
    }"""
    model = irkit.optimize(ir.from_onnx_text(text))
    irkit.check(model)
    assert [n.op_type for n in model.graph] == ["SplitToSequence"]
    data = np.arange(18, dtype=np.float32).reshape(3, 6)
    (pieces,) = run_ort(model, {"data": data, "split": np.array(2, dtype=np.int64)})
    assert [p.shape for p in pieces] == [(3, 2)] * 3


def test_hidden_nodes_come_back_on_error():
    model = ir.from_onnx_text(_CONCAT.format(opset=12))
    with pytest.raises(ZeroDivisionError), hide_from_folder(model) as hidden:
        assert [n.op_type for n in hidden] == ["ConcatFromSequence"]
        assert hidden[0].domain != ""
        raise ZeroDivisionError
    assert all(n.domain == "" for n in model.graph)


def _failing_folder(model, **kwargs):
    raise RuntimeError("Error during constant folding for node 'n' (::Relu)")


def test_a_pass_failing_on_a_valid_model_is_the_pass_s_fault(monkeypatch):
    monkeypatch.setattr(onnxscript.optimizer, "fold_constants", _failing_folder)
    model = ir.from_onnx_text(_CONCAT.format(opset=18))
    with pytest.raises(irkit.RewriteError) as info:
        irkit.optimize(model)
    message = str(info.value)
    assert "on a model irkit.check accepts: a bug in that pass, not in the model" in message
    assert "fold_constants=False" in message and "--no-fold" in message


def test_a_pass_failing_on_a_malformed_model_says_what_check_says(monkeypatch):
    monkeypatch.setattr(onnxscript.optimizer, "fold_constants", _failing_folder)
    model = ir.from_onnx_text("""<ir_version: 10, opset_import: ["" : 21]>
      g (float[2] x) => (float[2] y) { y = NoSuchOp(x) }""")
    with pytest.raises(irkit.RewriteError, match="malformed: irkit.check says: irkit.lint found"):
        irkit.optimize(model)


_TILE = """<ir_version: {ir}, opset_import: ["" : 9]>
g (float[1,2] x) => (float[2,4] y) {{
  reps = Constant<value=int64[2] {{2, 2}}>()
  y = Tile(x, reps)
}}"""


@pytest.mark.parametrize("ir_version", [3, 10])
def test_constants_are_lifted_only_where_initializers_need_no_input(ir_version):
    """Before IR 4 an initializer must also be a graph input: onnx.checker rejects a lifted one
    (onnx's pytorch-converted/test_PixelShuffle, IR 3)."""
    model = _optimized_runs_the_same(_TILE.format(ir=ir_version))
    irkit.check(model)
    assert [n.op_type for n in model.graph] == (
        ["Constant", "Tile"] if ir_version < 4 else ["Tile"]
    )
    assert len(model.graph.initializers) == (0 if ir_version < 4 else 1)
