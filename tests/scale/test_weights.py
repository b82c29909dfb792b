"""Weightless initializers and ``irkit.save(weights=...)`` on hand-built models (no torch):
matching by name, rename, override, errors that name the initializer and the file, load/check
of a model saved without weights, optimize never reading a weightless tensor."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import save_file

import irkit
from irkit.weights import WeightlessTensor
from tests.helpers import run_ort

TEXT = """<ir_version: 10, opset_import: ["" : 21]>
g (float[2, 80] x) => (float[2, 100] y) {
  wt = Transpose <perm = [1, 0]> (w)
  h = MatMul(x, wt)
  y = Add(h, b)
}"""


def _weightless_model() -> ir.Model:
    model = ir.from_onnx_text(TEXT)
    uses = {"w": model.graph.node(0).inputs[0], "b": model.graph.node(2).inputs[1]}
    for name, shape in (("w", [100, 80]), ("b", [100])):
        value = uses[name]
        assert value is not None and value.name == name
        value.shape, value.type = ir.Shape(shape), ir.TensorType(ir.DataType.FLOAT)
        value.const_value = WeightlessTensor(ir.DataType.FLOAT, shape, name=name)
        model.graph.register_initializer(value)
    return model


W = np.arange(8000, dtype=np.float32).reshape(100, 80) / 1000
B = np.linspace(-1, 1, 100, dtype=np.float32)
X = np.ones((2, 80), dtype=np.float32)


def _expected() -> np.ndarray:
    return X @ W.T + B


def _digest(model: ir.Model, tmp_path) -> str:
    """The model as saved without weights (``ir.to_onnx_text`` would read the weights)."""
    return hashlib.sha256(irkit.save(model, tmp_path / "digest.onnx").read_bytes()).hexdigest()


def test_weightless_tensor_refuses_reads_and_is_no_ir_tensor():
    tensor = _weightless_model().graph.initializers["w"].const_value
    assert not isinstance(tensor, ir.Tensor) and isinstance(tensor, ir.TensorProtocol)
    assert (tensor.nbytes, tensor.size) == (32000, 8000)
    for read in (tensor.numpy, tensor.tobytes, lambda: np.asarray(tensor)):
        with pytest.raises(irkit.WeightsError, match=r"'w' \(FLOAT\[100, 80\]\) has no data"):
            read()


def test_save_streams_a_safetensors_file_and_leaves_the_model_alone(tmp_path):
    save_file({"w": W, "b": B}, tmp_path / "m.safetensors")
    model = _weightless_model()
    before = _digest(model, tmp_path)
    path = irkit.save(
        model, tmp_path / "m.onnx", weights=tmp_path / "m.safetensors", external_data=True
    )
    assert _digest(model, tmp_path) == before
    (got,) = run_ort(path, [X])
    np.testing.assert_allclose(got, _expected(), rtol=0, atol=1e-4)
    first = (tmp_path / "m.onnx").read_bytes(), (tmp_path / "m.onnx.data").read_bytes()
    irkit.save(model, tmp_path / "m.onnx", weights=tmp_path / "m.safetensors", external_data=True)
    assert ((tmp_path / "m.onnx").read_bytes(), (tmp_path / "m.onnx.data").read_bytes()) == first


def test_rename_hook_as_mapping_and_function(tmp_path):
    save_file({"layer.weight": W, "layer.bias": B}, tmp_path / "m.safetensors")
    names = {"w": "layer.weight", "b": "layer.bias"}
    for rename in (names, lambda name: names[name]):
        path = irkit.save(
            _weightless_model(), tmp_path / "m.onnx", weights=tmp_path / "m.safetensors",
            rename=rename,
        )  # fmt: skip
        (got,) = run_ort(path, [X])
        np.testing.assert_allclose(got, _expected(), rtol=0, atol=1e-4)


def test_weights_do_not_override_real_initializers_unless_asked(tmp_path):
    model = _weightless_model()
    model.graph.initializers["b"].const_value = ir.tensor(np.zeros(100, np.float32), name="b")
    weights = {"w": W, "b": B}
    (got,) = run_ort(irkit.save(model, tmp_path / "a.onnx", weights=weights), [X])
    np.testing.assert_allclose(got, X @ W.T, rtol=0, atol=1e-4)
    (got,) = run_ort(irkit.save(model, tmp_path / "b.onnx", weights=weights, override=True), [X])
    np.testing.assert_allclose(got, _expected(), rtol=0, atol=1e-4)


def test_missing_weight_names_the_initializer_its_type_and_the_file(tmp_path):
    save_file({"w": W, "b0": B}, tmp_path / "m.safetensors")
    with pytest.raises(irkit.WeightsError) as info:
        irkit.save(_weightless_model(), tmp_path / "m.onnx", weights=tmp_path / "m.safetensors")
    message = str(info.value)
    assert "'b' FLOAT[100]" in message and "m.safetensors" in message, message
    assert "closest key: 'b0'" in message and "rename=" in message
    assert info.value.names == ["b"]
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize(
    ("w", "found"),
    [(W.T.copy(), "FLOAT[80, 100]"), (W.astype(np.int32), "INT32[100, 80]")],  # (floats convert)
    ids=["shape", "dtype"],
)
def test_mis_shaped_or_mis_typed_weight_names_both_and_the_file(tmp_path, w, found):
    save_file({"w": w, "b": B}, tmp_path / "m.safetensors")
    with pytest.raises(irkit.WeightsError) as info:
        irkit.save(_weightless_model(), tmp_path / "m.onnx", weights=tmp_path / "m.safetensors")
    message = str(info.value)
    assert (
        f"'w': the model expects FLOAT[100, 80], '{tmp_path / 'm.safetensors'}' holds 'w' as {found}"
        in message
    ), message


@pytest.mark.parametrize(
    "weights", ["no_such.safetensors", "README", 42], ids=["missing", "not-safetensors", "int"]
)
def test_unusable_weights_argument(tmp_path, weights):
    (tmp_path / "README").write_text("hello")
    if isinstance(weights, str):
        weights = tmp_path / weights
    with pytest.raises(irkit.WeightsError):
        irkit.save(_weightless_model(), tmp_path / "m.onnx", weights=weights)


def test_model_saved_without_weights_says_so_when_loaded_and_checked(tmp_path, caplog):
    path = irkit.save(_weightless_model(), tmp_path / "g.onnx")
    assert "have no data" in caplog.text
    with pytest.raises(irkit.ModelLoadError, match="saved without weights: 2 initializer"):
        irkit.load(path)
    graph_only = irkit.load(path, load_external_data=False)
    assert isinstance(graph_only.graph.initializers["w"].const_value, WeightlessTensor)
    caplog.clear()
    irkit.check(graph_only)
    assert "irkit.check: 2 initializer(s) have no data (first: 'w')" in caplog.text
    with pytest.raises(Exception, match="w"):  # onnxruntime refuses the data-less tensors
        run_ort(path, [X])
    full = irkit.save(graph_only, tmp_path / "full.onnx", weights={"w": W, "b": B})
    (got,) = run_ort(full, [X])
    np.testing.assert_allclose(got, _expected(), rtol=0, atol=1e-4)


def test_optimize_skips_weightless_tensors_and_still_folds_real_ones(caplog):
    real = _weightless_model()
    real.graph.initializers["w"].const_value = ir.tensor(W, name="w")
    real_ops = [n.op_type for n in irkit.optimize(real).graph]
    model = _weightless_model()
    with caplog.at_level(logging.INFO):
        irkit.optimize(model)
    assert "skipping 2 weightless initializer(s)" in caplog.text
    assert "Skipped deduplication" not in caplog.text
    assert "Transpose" not in real_ops  # folded into the real weight
    # w was never read: its transpose is a derived weightless initializer (computed at save)
    assert [n.op_type for n in model.graph] == real_ops
    kinds = sorted(type(v.const_value).__name__ for v in model.graph.initializers.values())
    assert kinds == ["DerivedTensor", "WeightlessTensor"]  # nothing invented
