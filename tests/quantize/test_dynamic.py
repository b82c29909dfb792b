"""Dynamic int8 (:mod:`irkit.rules.quantize_dynamic`): DynamicQuantizeMatMul, numbers, reasons."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from irkit.errors import QuantizationError
from irkit.rules.quantize_dynamic import DynamicQuantizeReport, quantize_dynamic, quantize_weight
from tests.helpers import op_histogram, run_ort
from tests.quantize import support


def _two_linears() -> tuple[ir.Model, dict[str, np.ndarray]]:
    """``y = (x @ w0.T) @ w1``: irkit's Linear form, then a plain MatMul."""
    w0, w1 = support.weights((48, 64), (48, 32))
    nodes = [
        helper.make_node("Transpose", ["w0"], ["t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "t"], ["h"], name="fc0"),
        helper.make_node("MatMul", ["h", "w1"], ["y"], name="fc1"),
    ]
    inits = {"w0": w0, "w1": w1}
    return support.model(nodes, {"x": (support.FLOAT, [2, 5, 64])}, ["y"], inits), inits


def test_weights_round_per_column_symmetric():
    (w,) = support.weights((64, 24))
    w[:, 3] = 0.0  # an all-zero column keeps scale 1
    for reduce_range, limit in [(True, 64), (False, 127)]:
        q, scale = quantize_weight(w, reduce_range)
        assert q.dtype == np.int8 and scale.shape == (24,) and scale.dtype == np.float32
        assert np.abs(q).max() == limit and q.min() >= -limit
        assert np.all(np.abs(q[:, [0, 1, 2]]).max(axis=0) == limit)  # each column's peak
        assert scale[3] == 1.0 and not q[:, 3].any()
        assert np.abs(q * scale - w).max() <= scale.max() / 2 + 1e-7


def test_every_constant_weight_matmul_becomes_dynamic_int8():
    model, inits = _two_linears()
    report = DynamicQuantizeReport()
    assert quantize_dynamic(model, report=report) is model
    assert op_histogram(model.graph) == {"com.microsoft::DynamicQuantizeMatMul": 2}
    assert [name for _, name in report.quantized] == ["fc0", "fc1"] and report.skipped == []
    assert sorted(model.graph.initializers) == ["fc0_Wq8", "fc0_Wscale", "fc1_Wq8", "fc1_Wscale"]
    assert report.bytes_after < report.bytes_before / 3

    x = np.random.default_rng(1).standard_normal((2, 5, 64)).astype(np.float32)
    (got,) = run_ort(model, [x])
    exact = (x @ inits["w0"].T) @ inits["w1"]
    q0, s0 = quantize_weight(np.ascontiguousarray(inits["w0"].T))
    q1, s1 = quantize_weight(inits["w1"])
    weights_rounded = (x @ (q0 * s0)) @ (q1 * s1)
    # the kernel also rounds x (uint8 per call): within 2% of the output's range of both
    span = np.abs(exact).max()
    assert np.abs(got - weights_rounded).max() < 0.02 * span
    assert np.abs(got - exact).max() < 0.03 * span
    assert "2 MatMul → DynamicQuantizeMatMul, 0 skipped" in str(report)


def test_weights_that_are_not_constants_are_reported():
    (w,) = support.weights((64, 16))
    lin = helper.make_function(
        "local",
        "Lin",
        ["x", "w"],
        ["y"],
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [helper.make_opsetid("", 21)],
    )
    inner = helper.make_function(
        "local",
        "Fixed",
        ["x"],
        ["y"],
        [
            helper.make_node(
                "Constant", [], ["w"], value=numpy_helper.from_array(w, "w"), name="wc"
            ),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="fixed"),
        ],
        [helper.make_opsetid("", 21)],
    )
    nodes = [
        helper.make_node("Lin", ["x", "w"], ["a"], domain="local", name="call"),
        helper.make_node("Fixed", ["x"], ["b"], domain="local", name="call2"),
        helper.make_node("MatMul", ["x", "g"], ["c"], name="fed"),
        helper.make_node("MatMul", ["x", "w"], ["d"], name="kept"),
    ]
    inputs = {"x": (support.FLOAT, [3, 64]), "g": (support.FLOAT, [64, 16])}
    model = support.model(nodes, inputs, ["a", "b", "c", "d"], {"w": w}, [lin, inner])
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    g = np.random.default_rng(3).standard_normal((64, 16)).astype(np.float32)
    expected = run_ort(model, [x, g])

    report = DynamicQuantizeReport()
    quantize_dynamic(model, exclude=["kept"], report=report)
    skipped = {name: why for _, name, why in report.skipped}
    assert skipped == {
        "mm": "weight 'w' is an input of the function (lower with functions=False so weights "
        "are constants)",
        "fed": "weight 'g' is a graph input (it can be fed at run time)",
        "kept": "excluded by exclude=",
    }
    assert report.quantized == [("local::Fixed", "fixed")]  # a Constant inside a body
    body = model.functions[("local", "Fixed", "")]
    assert op_histogram(body) == {"Constant": 2, "com.microsoft::DynamicQuantizeMatMul": 1}
    got = run_ort(model, [x, g])
    for i in (0, 2, 3):  # the skipped products are untouched
        np.testing.assert_array_equal(got[i], expected[i])
    assert np.abs(got[1] - expected[1]).max() < 0.03 * np.abs(expected[1]).max()


def test_bad_input_is_an_irkit_error():
    model, _ = _two_linears()
    with pytest.raises(QuantizationError, match="one string"):
        quantize_dynamic(model, exclude="fc0")  # type: ignore[arg-type]
    quantize_dynamic(model)
    with pytest.raises(QuantizationError, match="already holds DynamicQuantizeMatMul"):
        quantize_dynamic(model)


@pytest.mark.slow
def test_tiny_llama_prefill_and_decode_in_dynamic_int8():
    import irkit
    from irkit.llm import causal_lm_feeds, run_eager
    from tests.helpers import ort_session
    from tests.rules.test_glue import _tiny_llama

    lm, flat, _ = _tiny_llama()
    model = irkit.optimize(ir.serde.deserialize_model(ir.serde.serialize_model(flat)))
    report = DynamicQuantizeReport()
    quantize_dynamic(model, report=report)
    # q/k/v and gate/up packed: 2 layers × (qkv, o, gate/up, down) + lm_head
    assert len(report.quantized) == 9 and report.skipped == []
    assert op_histogram(model.graph)["com.microsoft::DynamicQuantizeMatMul"] == 9
    session = ort_session(model)
    for batch, seq, past in [(1, 16, 0), (1, 1, 15)]:
        feeds = causal_lm_feeds(lm, batch=batch, seq=seq, past=past, seed=past)
        got, want = session.run(None, feeds)[0], run_eager(lm, feeds)[0]
        cosine = float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want))
        assert np.abs(got - want).max() < 0.3 and cosine > 0.99, (batch, seq, past, cosine)
