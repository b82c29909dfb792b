"""``irkit.llm._logits.last_token_logits``: the logits of each row's last real new token, in
onnxruntime, against the full logits at that position (right-padded rows, a softcap tail)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from irkit.llm._logits import last_token_logits

_SOFTCAPPED = """
<ir_version: 10, opset_import: ["" : 23]>
g (int64[b, s] input_ids, int64[b, t] attention_mask, float[b, s, 8] h)
    => (float[b, s, 5] logits) {
  w = Constant <value: tensor = float[8, 5] {WEIGHTS}> ()
  cap = Constant <value: tensor = float {30.0}> ()
  z = MatMul(h, w)
  d = Div(z, cap)
  th = Tanh(d)
  logits = Mul(th, cap)
}
"""


def _model(seed: int = 0) -> ir.Model:
    rng = np.random.default_rng(seed)
    weights = ", ".join(f"{x:.6f}" for x in rng.standard_normal(40) * 20)
    return ir.from_onnx_text(_SOFTCAPPED.replace("WEIGHTS", weights))


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(["logits"], feeds)[0]


@pytest.mark.parametrize("past", [0, 3])
def test_each_rows_last_real_token(past):
    rng = np.random.default_rng(1)
    new = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=np.int64)  # right-padded
    feeds = {
        "input_ids": np.zeros((3, 4), dtype=np.int64),
        "attention_mask": np.concatenate([np.ones((3, past), np.int64), new], axis=1),
        "h": rng.standard_normal((3, 4, 8)).astype(np.float32),
    }
    full = _run(_model(), feeds)
    model = _model()
    assert last_token_logits(model)
    assert [d if isinstance(d, int) else str(d) for d in model.graph.outputs[0].shape] == [
        "b",
        1,
        5,
    ]
    last = _run(model, feeds)
    expected = full[np.arange(3), new.sum(axis=1) - 1][:, None, :]
    np.testing.assert_allclose(last, expected, rtol=1e-6, atol=1e-6)


def test_left_as_it_is_without_a_product_before_the_tail():
    model = ir.from_onnx_text("""
<ir_version: 10, opset_import: ["" : 23]>
g (int64[b, s] input_ids, int64[b, t] attention_mask, float[b, s, 5] h)
    => (float[b, s, 5] logits) { logits = Softmax<axis=1>(h) }""")
    assert not last_token_logits(model)
    assert str(model.graph.outputs[0].shape[1]) == "s"


def test_left_as_it_is_without_an_attention_mask():
    model = ir.from_onnx_text("""
<ir_version: 10, opset_import: ["" : 23]>
g (int64[b, s] input_ids, float[b, s, 4] h, float[4, 6] w) => (float[b, s, 6] logits) {
  logits = MatMul(h, w) }""")
    assert not last_token_logits(model)
