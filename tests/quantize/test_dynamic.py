"""Dynamic int8 (``irkit.quantize(..., activations="dynamic")``): DynamicQuantizeMatMul inside
shared functions, numbers against the kernel's arithmetic, the report, bad input."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import irkit
from irkit.errors import QuantizationError
from irkit.rules.quantize import Activations
from irkit.weights import WeightlessTensor
from irkit.weights.packing import quantize_columns_int8
from tests.helpers import op_histogram, run_ort
from tests.quantize import support
from tests.quantize.support import FLOAT

DQMM = "com.microsoft::DynamicQuantizeMatMul"


def _has_vnni() -> bool:
    """Whether this CPU adds u8×s8 products without 16-bit saturation (full-range codes exact)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return "vnni" in f.read()
    except OSError:
        return False


def kernel_reference(x: np.ndarray, w: np.ndarray, reduce_range: bool = True) -> np.ndarray:
    """``x @ w`` as DynamicQuantizeMatMul computes it: ``x`` to uint8 per tensor
    (DynamicQuantizeLinear: range widened to 0, zero point rounded half to even), ``w`` (K, N)
    to int8 per column, an exact integer product, then both scales."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((hi - lo) / 255) if hi > lo else np.float32(1)
    zero = np.clip(np.round(-lo / scale), 0, 255)
    xq = np.clip(np.round(x / scale) + zero, 0, 255).astype(np.int64) - int(zero)
    wq, ws = quantize_columns_int8(w, reduce_range=reduce_range)
    return (xq @ wq.astype(np.int64)).astype(np.float64) * float(scale) * ws


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, atol=1e-4 * float(np.abs(want).max()), rtol=1e-4)


def test_columns_round_symmetric_per_column():
    (w,) = support.weights((64, 24))
    w[:, 3] = 0.0  # an all-zero column keeps scale 1
    for reduce_range, limit in [(True, 64), (False, 127)]:
        q, scale = quantize_columns_int8(w, reduce_range=reduce_range)
        assert q.dtype == np.int8 and scale.shape == (24,) and scale.dtype == np.float32
        assert np.abs(q).max() == limit and q.min() >= -limit
        assert np.all(np.abs(q[:, [0, 1, 2]]).max(axis=0) == limit)  # each column's peak
        assert scale[3] == 1.0 and not q[:, 3].any()
        assert np.abs(q * scale - w).max() <= scale.max() / 2 + 1e-7
    with pytest.raises(QuantizationError, match="float32"):
        quantize_columns_int8(w.astype(np.float16))


def _single(form: str) -> tuple[ir.Model, np.ndarray, np.ndarray | None, np.ndarray]:
    """``y = x @ W (+ b)`` written as ``form``: the model, the (K, N) weight, bias, an input."""
    k, n = 48, 24  # (no block: any K)
    w, b = support.weights((k, n), (1, n))
    rank3 = {"x": (FLOAT, [2, 3, k])}
    if form == "matmul":
        model = support.model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], rank3, ["y"], {"w": w}
        )
    elif form == "transpose":
        nodes = [
            helper.make_node("Transpose", ["wt"], ["t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "t"], ["y"]),
        ]
        model = support.model(nodes, rank3, ["y"], {"wt": w.T.copy()})
    elif form == "fused":
        node = helper.make_node("FusedMatMul", ["x", "wt"], ["y"], domain="com.microsoft", transB=1)
        model = support.model([node], rank3, ["y"], {"wt": w.T.copy()})
    else:
        node = helper.make_node("Gemm", ["x", "wt", "b"], ["y"], transB=1)
        inputs = {"x": (FLOAT, [3, k])}
        model = support.model([node], inputs, ["y"], {"wt": w.T.copy(), "b": b[0]})
        x = np.random.default_rng(4).standard_normal((3, k)).astype(np.float32)
        return model, w, b[0], x
    x = np.random.default_rng(4).standard_normal((2, 3, k)).astype(np.float32)
    return model, w, None, x


@pytest.mark.parametrize("form", ["matmul", "transpose", "fused", "gemm"])
@pytest.mark.parametrize("activations", list(Activations)[1:])
def test_each_form_becomes_dynamic_int8_and_computes_as_the_kernel(form, activations):
    model, w, b, x = _single(form)
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=8, activations=activations.value, report=report)
    assert op_histogram(model.graph) == {DQMM: 1}
    (node,) = model.graph
    assert not node.attributes
    names = [v.name if v is not None else None for v in node.inputs]
    weight = "w" if form == "matmul" else "wt"
    tail = [None, "b"] if b is not None else []
    assert names == ["x", f"{weight}_Q8", f"{weight}_scales", *tail]
    assert set(model.graph.initializers) == {f"{weight}_Q8", f"{weight}_scales"} | (
        {"b"} if b is not None else set()
    )  # the float weight is gone
    codes = model.graph.initializers[f"{weight}_Q8"].const_value.numpy()
    assert codes.dtype == np.int8 and codes.shape == w.shape
    reduce_range = activations is Activations.DYNAMIC
    assert np.abs(codes).max() == (64 if reduce_range else 127)
    (y,) = run_ort(model, [x])
    if reduce_range or _has_vnni():  # (full range saturates on AVX2: the reason for 7 bits)
        _close(y, kernel_reference(x, w, reduce_range) + (0 if b is None else b))
    assert report.into == "DynamicQuantizeMatMul" and report.skipped == []


def _blocks_reference(x: np.ndarray, inits, float_weights=()) -> np.ndarray:
    """support.shared_blocks' output, each Linear as the kernel computes it."""

    def lin(h: np.ndarray, name: str) -> np.ndarray:
        w = np.ascontiguousarray(inits[name].T)
        return h @ w if name in float_weights else kernel_reference(h, w).astype(np.float32)

    h = lin(np.maximum(lin(x, "a1"), 0), "a2")
    return lin(np.maximum(lin(h, "b1"), 0), "b2")


def test_weights_of_a_shared_body_become_its_inputs_and_the_body_stays_shared():
    """Two identical blocks (one Block body, one Lin body, four Linears): quantized once, the
    int8 weights and scales passed down the calls."""
    model, inits = support.shared_blocks()
    x = np.random.default_rng(3).standard_normal((2, 3, 64)).astype(np.float32)
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=8, activations="dynamic", report=report)
    assert len(model.functions) == 2  # still one Block and one Lin
    lin = model.functions[("local", "Lin", "")]
    assert op_histogram(lin) == {DQMM: 1}
    assert [v.name for v in lin.inputs] == ["x", "w_Q8", "w_scales"]
    block = model.functions[("local", "Block", "")]
    assert [v.name for v in block.inputs] == ["x", "w1_Q8", "w1_scales", "w2_Q8", "w2_scales"]
    assert op_histogram(block) == {"local::Lin": 2, "Relu": 1}
    assert op_histogram(model.graph) == {"local::Block": 2}
    assert sorted(model.graph.initializers) == sorted(
        f"{n}{s}" for n in ("a1", "a2", "b1", "b2") for s in ("_Q8", "_scales")
    )
    (q,) = report.quantized
    assert (q.where, q.op_type, q.k, q.n, q.bits) == ("local::Lin", "MatMul", 64, 64, 8)
    assert sorted(q.modules) == ["block0.fc1", "block0.fc2", "block1.fc1", "block1.fc2"]
    assert report.functions == ["local::Block", "local::Lin"]
    assert report.bytes_after == 4 * (64 * 64 + 64 * 4)
    (y,) = run_ort(model, [x])
    _close(y, _blocks_reference(x, inits))


def test_exclude_parts_a_shared_body_into_copies():
    model, inits = support.shared_blocks()
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=8, activations="dynamic", exclude="block1", report=report)
    assert [(s.where, s.modules, s.reason) for s in report.skipped] == [
        ("local::Lin", ("block1.fc1", "block1.fc2"), "excluded by exclude=")
    ]
    (q,) = report.quantized
    assert (q.where, q.modules) == ("local::Lin_q8", ("block0.fc1", "block0.fc2"))
    assert sorted(f.name for f in model.functions.values()) == [
        "Block",
        "Block_q8",
        "Lin",
        "Lin_q8",
    ]
    assert op_histogram(model.functions[("local", "Lin_q8", "")]) == {DQMM: 1}
    assert op_histogram(model.functions[("local", "Lin", "")]) == {"MatMul": 1, "Transpose": 1}
    x = np.random.default_rng(5).standard_normal((2, 3, 64)).astype(np.float32)
    (y,) = run_ort(model, [x])
    _close(y, _blocks_reference(x, inits, float_weights=("b1", "b2")))


def test_report_lists_every_matmul_left_alone_with_why():
    (w, small) = support.weights((64, 8), (8, 8))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="ok"),
        helper.make_node("MatMul", ["a", "small"], ["b"], name="tiny"),  # (K=8: no block needed)
        helper.make_node("MatMul", ["x", "x_t"], ["c"], name="computed"),
        helper.make_node("MatMul", ["x", "fed"], ["d"], name="graph_input"),
        helper.make_node("MatMul", ["h", "wh"], ["e"], name="half"),
        helper.make_node("MatMul", ["x", "w"], ["f"], name="kept"),
    ]
    model = support.model(
        nodes,
        {
            "x": (FLOAT, [2, 64]),
            "x_t": (FLOAT, [64, 8]),
            "fed": (FLOAT, [64, 8]),
            "h": (TensorProto.FLOAT16, [2, 64]),
        },
        ["a", "b", "c", "d", "e", "f"],
        {"w": w, "small": small, "fed": w, "wh": w.astype(np.float16)},
    )
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=8, activations="dynamic", exclude="kept", report=report)
    assert [q.node for q in report.quantized] == ["ok", "tiny"]
    assert {s.node: s.reason for s in report.skipped} == {
        "computed": "weight 'x_t' is not a constant",
        "graph_input": "weight 'fed' is a graph input (it can be fed at run time)",
        "half": "weight dtype FLOAT16 is not float32 (DynamicQuantizeMatMul takes float32)",
        "kept": "excluded by exclude=",
    }
    assert op_histogram(model.graph) == {DQMM: 2, "MatMul": 4}
    lines = str(report).splitlines()
    assert lines[0].startswith(
        "quantize: 2 node(s) → DynamicQuantizeMatMul, 4 skipped, 0 function(s) changed, weights"
    )
    assert lines[1] == (
        "  note: dynamic int8: weights int8 with one scale per output column (7-bit codes, "
        "exact on every x86 CPU); the kernel quantizes the activations to uint8 per call "
        "(prefill-fast; decode reads 8-bit weights)"
    )
    assert lines[2] == "  note: 'w' in <main> is also read by MatMul: kept beside its packed form"
    assert "  ✗ MatMul half in <main>: weight dtype FLOAT16 is not float32" in str(report)


def test_quantizing_twice_is_a_noop_with_a_note():
    model, _ = support.shared_blocks()
    irkit.quantize(model, bits=8, activations="dynamic")
    before = ir.serde.serialize_model(model).SerializeToString()
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=8, activations="dynamic", report=report)
    assert ir.serde.serialize_model(model).SerializeToString() == before
    assert report.quantized == [] and report.skipped == []
    assert report.notes[1:] == [
        "the model already holds 1 DynamicQuantizeMatMul node(s)",
        "nothing was quantized",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "bits=4: its weights are int8, pass bits=8"),
        ({"bits": 8, "block_size": 64}, "block_size=64: .* no blocks"),
        ({"bits": 8, "symmetric": False}, "symmetric=False"),
        ({"bits": 8, "accuracy_level": 4}, "accuracy_level=4: it always computes in int8"),
        ({"bits": 8, "method": "kquant"}, "method='kquant'"),
        ({"bits": 8, "embeddings": True}, "embeddings='all': GatherBlockQuantized is weight-only"),
        ({"bits": 8, "embeddings": "tied"}, "embeddings='tied': GatherBlockQuantized is weight"),
        ({"bits": 4, "embeddings": "some"}, "embeddings='some' is not supported"),
        ({"bits": 8, "bits_for": {"lm_head": 4}}, "exclude= instead"),
        ({"bits": 8, "activations": "static"}, "activations='static' is not supported"),
    ],
)
def test_options_the_dynamic_path_does_not_take_are_errors(kwargs, message):
    model, _ = support.shared_blocks()
    before = ir.serde.serialize_model(model).SerializeToString()
    kwargs.setdefault("activations", "dynamic")
    with pytest.raises(QuantizationError, match=message):
        irkit.quantize(model, **kwargs)
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_a_weightless_model_is_refused_before_any_change():
    """A meta-device model's weights have no data: dynamic int8 is not derived while saving
    (MatMulNBits is), so it is refused, naming the fix."""
    model, _ = support.shared_blocks()
    for value in model.graph.initializers.values():
        shape = list(value.const_value.shape.numpy())
        value.const_value = WeightlessTensor(ir.DataType.FLOAT, shape, name=value.name)
    before = ir.serde.serialize_model(model).SerializeToString()
    with pytest.raises(QuantizationError) as caught:
        irkit.quantize(model, bits=8, activations="dynamic", exclude="block1")
    assert str(caught.value) == (
        "quantize: MatMul 'mm' in local::Lin: weight 'a1' has no data (a model lowered from the "
        "meta device): the int8 weights of DynamicQuantizeMatMul are not derived while saving. "
        "Fix: lower the model with its weights, or quantize with activations=None (MatMulNBits, "
        "packed while irkit.save streams the checkpoint)"
    )
    assert ir.serde.serialize_model(model).SerializeToString() == before
    irkit.quantize(model, bits=8)  # the weight-only path takes it (derived recipes)
    assert op_histogram(model.functions[("local", "Lin", "")]) == {"com.microsoft::MatMulNBits": 1}


def test_quantize_dynamic_is_a_deprecated_alias():
    from irkit.rules.quantize_dynamic import quantize_dynamic

    model, _ = support.shared_blocks()
    expected, _ = support.shared_blocks()
    irkit.quantize(expected, bits=8, activations="dynamic-full-range", exclude=["block0"])
    report = irkit.QuantizeReport()
    with pytest.warns(DeprecationWarning, match="activations='dynamic'"):
        quantize_dynamic(model, exclude=["block0"], reduce_range=False, report=report)
    as_bytes = ir.serde.serialize_model
    assert as_bytes(model).SerializeToString() == as_bytes(expected).SerializeToString()
    assert report.into == "DynamicQuantizeMatMul" and len(report.quantized) == 1
    with pytest.raises(QuantizationError, match="one string"), pytest.warns(DeprecationWarning):
        quantize_dynamic(model, exclude="fc0")  # type: ignore[arg-type]


@pytest.mark.slow
def test_tiny_llama_prefill_and_decode_in_dynamic_int8():
    from irkit.llm import causal_lm_feeds, run_eager
    from tests.helpers import ort_session
    from tests.rules.test_glue import _tiny_llama

    lm, flat, _ = _tiny_llama()
    model = irkit.optimize(ir.serde.deserialize_model(ir.serde.serialize_model(flat)))
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=8, activations="dynamic", report=report)
    # q/k/v packed: 2 layers × (qkv, o, gate, up, down) + lm_head
    assert len(report.quantized) == 11 and report.skipped == []
    assert op_histogram(model.graph)[DQMM] == 11
    session = ort_session(model)
    for batch, seq, past in [(1, 16, 0), (1, 1, 15)]:
        feeds = causal_lm_feeds(lm, batch=batch, seq=seq, past=past, seed=past)
        got, want = session.run(None, feeds)[0], run_eager(lm, feeds)[0]
        cosine = float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want))
        assert np.abs(got - want).max() < 0.3 and cosine > 0.99, (batch, seq, past, cosine)
