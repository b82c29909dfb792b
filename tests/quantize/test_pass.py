"""irkit.quantize on hand-built models: each form, shared functions, the report, bad input."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import irkit
from irkit.errors import QuantizationError
from tests.helpers import op_histogram, run_ort
from tests.quantize import support
from tests.quantize.support import FLOAT, fake_quant

K, N = 80, 24  # K is not a multiple of the block: the last block is padded


def _single(form: str):
    """``y = x @ W (+ b)`` written as ``form``; returns the model and the (K, N) weight, bias."""
    (w, b) = support.weights((K, N), (1, N))
    b = b[0]
    x3 = {"x": (FLOAT, [2, 3, K])}
    if form == "matmul":
        return (
            support.model([helper.make_node("MatMul", ["x", "w"], ["y"])], x3, ["y"], {"w": w}),
            w,
            None,
        )
    if form == "transpose":
        nodes = [
            helper.make_node("Transpose", ["wt"], ["t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "t"], ["y"]),
        ]
        return support.model(nodes, x3, ["y"], {"wt": w.T.copy()}), w, None
    if form == "constant":
        nodes = [
            helper.make_node(
                "Constant",
                [],
                ["w"],
                value=helper.make_tensor("c", TensorProto.FLOAT, w.shape, w.ravel()),
            ),
            helper.make_node("MatMul", ["x", "w"], ["y"]),
        ]
        return support.model(nodes, x3, ["y"], {}), w, None
    if form == "fused":
        node = helper.make_node("FusedMatMul", ["x", "wt"], ["y"], domain="com.microsoft", transB=1)
        return support.model([node], x3, ["y"], {"wt": w.T.copy()}), w, None
    if form == "bias":  # a biased Linear: the Add joins MatMulNBits (irkit.rules.quantize._bias)
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["p"]),
            helper.make_node("Add", ["b", "p"], ["y"]),
        ]
        return support.model(nodes, x3, ["y"], {"w": w, "b": b}), w, b
    assert form == "gemm"
    node = helper.make_node("Gemm", ["x", "wt", "b"], ["y"], transB=1)
    return support.model([node], {"x": (FLOAT, [3, K])}, ["y"], {"wt": w.T.copy(), "b": b}), w, b


@pytest.mark.parametrize("form", ["matmul", "transpose", "constant", "fused", "gemm", "bias"])
@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (8, False)])
def test_each_form_becomes_matmulnbits_and_computes_with_the_packed_weight(form, bits, symmetric):
    model, w, b = _single(form)
    x = (
        np.random.default_rng(2)
        .standard_normal([d for d in model.graph.inputs[0].shape.numpy()])
        .astype(np.float32)
    )
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=bits, symmetric=symmetric, accuracy_level=0, report=report)
    assert op_histogram(model.graph) == {"com.microsoft::MatMulNBits": 1}
    (node,) = model.graph
    assert {k: a.value for k, a in node.attributes.items()} == {
        "K": K,
        "N": N,
        "bits": bits,
        "block_size": 32,
        "accuracy_level": 0,
    }
    assert len(report.quantized) == 1 and report.skipped == []
    expected = x @ fake_quant(w, bits=bits, symmetric=symmetric) + (0 if b is None else b)
    (y,) = run_ort(model, [x])
    np.testing.assert_allclose(y, expected, atol=1e-4, rtol=1e-4)
    if form != "constant":
        assert set(model.graph.initializers) - {"b"} == {
            n
            for n in model.graph.initializers
            if n.endswith(("_Q4", "_Q8", "_scales", "_zero_points"))
        }  # the float weight is gone


def test_an_add_that_is_no_bias_stays():
    """Only a 1-D ``[N]`` addend of a product nothing else reads joins ``MatMulNBits``: a
    residual ``[2, 3, N]`` add and a product also returned keep their ``Add``."""
    (w, r) = support.weights((K, N), (2, 3, N))
    (b,) = support.weights((N,))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "r"], ["y"]),
        helper.make_node("MatMul", ["x", "w2"], ["q"]),
        helper.make_node("Add", ["q", "b"], ["z"]),
    ]
    model = support.model(
        nodes, {"x": (FLOAT, [2, 3, K])}, ["y", "z", "q"], {"w": w, "r": r, "w2": w, "b": b}
    )
    irkit.quantize(model, bits=4, accuracy_level=0)
    assert op_histogram(model.graph) == {"com.microsoft::MatMulNBits": 2, "Add": 2}
    assert all(len(n.inputs) == 3 for n in model.graph if n.op_type == "MatMulNBits")


def test_a_biased_linear_function_takes_its_bias_input_into_matmulnbits():
    """``Lin(x, w, b) = MatMul(x, w) + b`` called twice: the body's bias is a function input
    with no type of its own (as read from a file); each call passes a ``[N]`` initializer, so
    the body's ``Add`` joins ``MatMulNBits`` and onnxruntime gives the fake-quantized numbers."""
    (w1, w2) = support.weights((64, 64), (64, 64))  # (one body: weights of one shape)
    (b1,) = support.weights((64,), seed=5)
    (b2,) = support.weights((64,), seed=6)
    body = helper.make_function(
        "local",
        "Lin",
        ["x", "w", "b"],
        ["y"],
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
        [helper.make_opsetid("", 21)],
    )
    calls = [
        helper.make_node("Lin", ["x", "w1", "b1"], ["h"], domain="local"),
        helper.make_node("Lin", ["h", "w2", "b2"], ["y"], domain="local"),
    ]
    model = support.model(
        calls,
        {"x": (FLOAT, [2, 3, 64])},
        ["y"],
        {"w1": w1, "b1": b1, "w2": w2, "b2": b2},
        functions=[body],
    )
    x = np.random.default_rng(7).standard_normal((2, 3, 64)).astype(np.float32)
    irkit.quantize(model, bits=4, accuracy_level=0)
    (function,) = model.functions.values()
    assert op_histogram(function) == {"com.microsoft::MatMulNBits": 1}
    (y,) = run_ort(model, [x])
    h = x @ fake_quant(w1) + b1
    np.testing.assert_allclose(y, h @ fake_quant(w2) + b2, atol=1e-4, rtol=1e-4)


def test_fused_matmul_transposing_a_becomes_transpose_and_matmulnbits():
    """``FusedMatMul(A, Wᵀ, transA=1, transB=1)`` (LFM2's conv ``out_proj`` over its
    channels-first output): a ``Transpose`` of A's last two axes, then ``MatMulNBits``;
    onnxruntime's numbers are the fake-quantized product."""
    (w,) = support.weights((K, N))
    node = helper.make_node(
        "FusedMatMul", ["xt", "wt"], ["y"], domain="com.microsoft", transA=1, transB=1
    )
    model = support.model([node], {"xt": (FLOAT, [2, K, 3])}, ["y"], {"wt": w.T.copy()})
    xt = np.random.default_rng(4).standard_normal((2, K, 3)).astype(np.float32)
    report = irkit.QuantizeReport()
    irkit.quantize(model, bits=4, accuracy_level=0, report=report)
    assert op_histogram(model.graph) == {"Transpose": 1, "com.microsoft::MatMulNBits": 1}
    assert len(report.quantized) == 1 and report.skipped == []
    (y,) = run_ort(model, [xt])
    expected = xt.transpose(0, 2, 1) @ fake_quant(w, bits=4, symmetric=True)
    np.testing.assert_allclose(y, expected, atol=1e-4, rtol=1e-4)


def test_shared_function_body_is_quantized_once_and_stays_shared():
    model, inits = support.shared_blocks()
    x = np.random.default_rng(3).standard_normal((2, 3, 64)).astype(np.float32)
    report = irkit.QuantizeReport()
    irkit.quantize(model, accuracy_level=0, report=report)
    assert len(model.functions) == 2
    lin = model.functions[("local", "Lin", "")]
    assert op_histogram(lin) == {"com.microsoft::MatMulNBits": 1}
    assert [v.name for v in lin.inputs] == ["x", "w_Q4", "w_scales"]
    block = model.functions[("local", "Block", "")]
    assert [v.name for v in block.inputs] == ["x", "w1_Q4", "w1_scales", "w2_Q4", "w2_scales"]
    assert sorted(model.graph.initializers) == sorted(
        f"{n}{s}" for n in ("a1", "a2", "b1", "b2") for s in ("_Q4", "_scales")
    )
    (q,) = report.quantized
    assert q.where == "local::Lin"
    assert sorted(q.modules) == ["block0.fc1", "block0.fc2", "block1.fc1", "block1.fc2"]
    assert report.functions == ["local::Block", "local::Lin"]
    (y,) = run_ort(model, [x])
    np.testing.assert_allclose(y, support.shared_blocks_reference(x, inits), atol=1e-3, rtol=1e-4)


def test_exclude_and_bits_for_by_module_path():
    model, inits = support.shared_blocks()
    report = irkit.QuantizeReport()
    irkit.quantize(model, exclude=["block*"], report=report)
    assert [s.reason for s in report.skipped] == ["excluded by exclude="]
    assert len(model.functions) == 2

    model, inits = support.shared_blocks()
    irkit.quantize(model, bits_for={"*.fc?": 8}, accuracy_level=0, report=report)
    assert [q.bits for q in report.quantized] == [8]
    assert len(model.functions) == 2
    x = np.ones((2, 3, 64), np.float32)
    (y,) = run_ort(model, [x])
    expected = support.shared_blocks_reference(x, inits, bits=8)
    np.testing.assert_allclose(y, expected, atol=1e-3, rtol=1e-4)


def test_calls_of_a_shared_body_wanting_different_settings_get_their_own_copies():
    """block1 is excluded: Block and Lin are copied for it (at the level of calls that parts
    the two settings: the main graph's calls of Block); block0 keeps the quantized originals."""
    model, inits = support.shared_blocks()
    report = irkit.QuantizeReport()
    irkit.quantize(model, exclude="block1", accuracy_level=0, report=report)
    assert [(s.where, s.modules, s.reason) for s in report.skipped] == [
        ("local::Lin", ("block1.fc1", "block1.fc2"), "excluded by exclude=")
    ]
    ((q),) = report.quantized
    assert (q.where, q.modules) == ("local::Lin_q4", ("block0.fc1", "block0.fc2"))
    assert report.notes == [
        "local::Block copied as Block_q4 for the calls that want 4 bits",
        "local::Lin copied as Lin_q4 for the calls that want 4 bits",
    ]
    assert sorted(f.name for f in model.functions.values()) == [
        "Block",
        "Block_q4",
        "Lin",
        "Lin_q4",
    ]
    assert [n.op_type for n in model.graph] == ["Block_q4", "Block"]
    x = np.ones((2, 3, 64), np.float32)
    (y,) = run_ort(model, [x])
    expected = support.shared_blocks_reference(x, inits, float_weights=("b1", "b2"))
    np.testing.assert_allclose(y, expected, atol=1e-3, rtol=1e-4)

    model, inits = support.shared_blocks()  # the two Lin calls of Block part at level 1
    irkit.quantize(model, bits_for={"*.fc2": 8}, accuracy_level=0, report=report)
    assert sorted((q.where, q.bits) for q in report.quantized) == [
        ("local::Lin", 8),
        ("local::Lin_q4", 4),
    ]
    assert len(model.functions) == 3
    (y,) = run_ort(model, [x])
    np.testing.assert_allclose(y, _mixed_reference(x, inits), atol=1e-3, rtol=1e-4)


def _mixed_reference(x: np.ndarray, inits) -> np.ndarray:
    def lin(h: np.ndarray, name: str, bits: int) -> np.ndarray:
        return h @ fake_quant(np.ascontiguousarray(inits[name].T), bits=bits)

    h = lin(np.maximum(lin(x, "a1", 4), 0), "a2", 8)
    return lin(np.maximum(lin(h, "b1", 4), 0), "b2", 8)


def test_settings_no_level_of_calls_parts_are_reported():
    model, _ = support.shared_blocks()
    report = irkit.QuantizeReport()
    irkit.quantize(model, exclude=["block0.fc2", "block1.fc1"], report=report)  # a "xor"
    (skipped,) = report.skipped
    assert skipped.reason.startswith(
        "a shared function body whose calls want different settings (block0.fc1: 4 bits, "
        "block1.fc1: excluded, block0.fc2: excluded, block1.fc2: 4 bits) and that no level"
    )
    assert op_histogram(model.functions[("local", "Lin", "")]) == {"MatMul": 1, "Transpose": 1}


def test_report_lists_every_matmul_left_alone_with_why():
    (w, small, w64) = support.weights((64, 8), (8, 8), (64, 8))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="ok"),
        helper.make_node("MatMul", ["x", "x_t"], ["b"], name="computed"),
        helper.make_node("MatMul", ["a8", "small"], ["c"], name="tiny"),
        helper.make_node("Gemm", ["x2", "w", "bias"], ["d"], name="scaled", alpha=2.0),
        helper.make_node("MatMul", ["x", "fed"], ["e"], name="graph_input"),
        helper.make_node("Cast", ["w"], ["w64"], to=TensorProto.DOUBLE),
        helper.make_node("MatMul", ["x64", "wd"], ["f"], name="double"),
    ]
    model = support.model(
        nodes,
        {
            "x": (FLOAT, [2, 64]),
            "x_t": (FLOAT, [64, 8]),
            "a8": (FLOAT, [2, 8]),
            "x2": (FLOAT, [2, 64]),
            "fed": (FLOAT, [64, 8]),
            "x64": (TensorProto.DOUBLE, [2, 64]),
        },
        ["a", "b", "c", "d", "e", "f"],
        {
            "w": w,
            "small": small,
            "bias": np.zeros(8, np.float32),
            "fed": w64,
            "wd": w64.astype(np.float64),
        },
    )
    report = irkit.QuantizeReport()
    irkit.quantize(model, report=report)
    assert [q.node for q in report.quantized] == ["ok"]
    reasons = {s.node: s.reason for s in report.skipped}
    assert reasons == {
        "computed": "weight 'x_t' is not a constant",
        "tiny": "K=8 is smaller than one block (32)",
        "scaled": "Gemm with alpha or beta != 1",
        "graph_input": "weight 'fed' is a graph input (it can be fed at run time)",
        "double": "weight dtype DOUBLE is not float32/float16",
    }
    assert "Gemm scaled in <main>: Gemm with alpha or beta != 1" in str(report)
    # w is still read by the Gemm left alone: kept beside its packed form
    assert "w" in model.graph.initializers
    assert any("'w' in <main> is also read by Cast, Gemm" in n for n in report.notes)


def test_tied_weight_is_packed_once_and_kept_for_its_other_use():
    (emb,) = support.weights((40, 64))  # (vocab, hidden): a Gather table and, transposed, lm_head
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h"]),
        helper.make_node("Transpose", ["emb"], ["t"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "t"], ["y"]),
    ]
    model = support.model(nodes, {"ids": (TensorProto.INT64, [2, 3])}, ["y"], {"emb": emb})
    report = irkit.QuantizeReport()
    irkit.quantize(model, accuracy_level=0, report=report)
    assert op_histogram(model.graph) == {"Gather": 1, "com.microsoft::MatMulNBits": 1}
    assert sorted(model.graph.initializers) == ["emb", "emb_Q4", "emb_scales"]
    ids = np.array([[0, 5, 39], [1, 2, 3]], np.int64)
    (y,) = run_ort(model, [ids])
    np.testing.assert_allclose(y, emb[ids] @ fake_quant(emb.T.copy()), atol=1e-4)


def test_quantizing_twice_is_a_noop_with_a_note(tmp_path):
    model, _ = support.shared_blocks()
    irkit.quantize(model)
    before = ir.serde.serialize_model(model).SerializeToString()
    report = irkit.QuantizeReport()
    irkit.quantize(model, report=report)
    assert ir.serde.serialize_model(model).SerializeToString() == before
    assert report.quantized == [] and report.skipped == []
    assert report.notes == [
        "the model already holds 1 MatMulNBits node(s)",
        "nothing was quantized",
    ]
    irkit.save(model, tmp_path / "q.onnx")
    (y,) = run_ort(tmp_path / "q.onnx", [np.ones((2, 3, 64), np.float32)])
    assert y.shape == (2, 3, 64)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bits": 3}, "bits=3"),
        ({"block_size": 48}, "block_size=48"),
        ({"accuracy_level": 7}, "accuracy_level=7"),
        ({"bits_for": {"lm_head": 2}}, "bits=2"),
        ({"method": "gptq"}, "method='gptq'"),
    ],
)
def test_bad_options_are_quantization_errors(kwargs, message):
    model, _ = support.shared_blocks()
    before = ir.serde.serialize_model(model).SerializeToString()
    with pytest.raises(QuantizationError, match=message):
        irkit.quantize(model, **kwargs)
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_constant_weight_inside_a_function_body_and_a_matmul_inside_an_if_body():
    (w, w2) = support.weights((64, 16), (64, 16))
    const = helper.make_tensor("c", TensorProto.FLOAT, w.shape, w.ravel())
    body = helper.make_function(
        "local",
        "Proj",
        ["x"],
        ["y"],
        [
            helper.make_node("Constant", [], ["w"], value=const),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
        ],
        [helper.make_opsetid("", 21)],
    )
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w2"], ["z"], name="in_branch")],
        "then",
        [],
        [helper.make_tensor_value_info("z", FLOAT, [2, 16])],
    )
    nodes = [
        helper.make_node("Proj", ["x"], ["y"], domain="local"),
        helper.make_node("If", ["cond"], ["b"], then_branch=branch, else_branch=branch),
    ]
    inputs = {"x": (FLOAT, [2, 64]), "cond": (TensorProto.BOOL, [])}
    model = support.model(nodes, inputs, ["y", "b"], {"w2": w2}, [body])
    report = irkit.QuantizeReport()
    irkit.quantize(model, accuracy_level=0, report=report)
    proj = model.functions[("local", "Proj", "")]
    assert op_histogram(proj) == {"Constant": 2, "com.microsoft::MatMulNBits": 1}
    assert [(s.node, s.reason) for s in report.skipped] == [
        ("in_branch", "inside an If/Loop/Scan body")
    ] * 2  # (then and else)
    x = np.ones((2, 64), np.float32)
    y, b = run_ort(model, [x, np.array(True)])
    np.testing.assert_allclose(y, x @ fake_quant(w), atol=1e-4)
    np.testing.assert_allclose(b, x @ w2, atol=1e-4)


def test_a_weight_with_nan_is_reported_and_nothing_else_changes_for_it():
    (w, bad) = support.weights((64, 8), (64, 8))
    bad[3, 1] = np.nan
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="fine"),
        helper.make_node("MatMul", ["x", "bad"], ["b"], name="nan"),
    ]
    model = support.model(nodes, {"x": (FLOAT, [2, 64])}, ["a", "b"], {"w": w, "bad": bad})
    report = irkit.QuantizeReport()
    irkit.quantize(model, report=report)
    assert [q.node for q in report.quantized] == ["fine"]
    assert [(s.node, s.reason) for s in report.skipped] == [
        ("nan", "the weight holds inf or NaN values: no finite scale fits them")
    ]
    assert op_histogram(model.graph) == {"MatMul": 1, "com.microsoft::MatMulNBits": 1}


def _tied(hidden: int):
    """``y = Gather(E, ids) @ E^T``: an embedding tied to its lm_head (``MatMul 'lm'``)."""
    (emb,) = support.weights((40, hidden))
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h"], name="embed"),
        helper.make_node("Transpose", ["emb"], ["et"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "et"], ["y"], name="lm"),
    ]
    return support.model(nodes, {"ids": (TensorProto.INT64, [2, 3])}, ["y"], {"emb": emb}), emb


IDS = np.array([[0, 5, 39], [1, 2, 3]], np.int64)


@pytest.mark.parametrize("hidden", [64, 80], ids=["whole-blocks", "padded"])
@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (4, False), (8, True)])
def test_tied_embedding_and_lm_head_share_one_packed_initializer(hidden, bits, symmetric):
    model, emb = _tied(hidden)
    report = irkit.QuantizeReport()
    irkit.quantize(
        model, bits=bits, symmetric=symmetric, embeddings=True, accuracy_level=0, report=report
    )
    hist = op_histogram(model.graph)
    assert hist["com.microsoft::GatherBlockQuantized"] == 1
    assert hist["com.microsoft::MatMulNBits"] == 1 and "Gather" not in hist
    assert hist.get("Slice", 0) == (hidden % 32 != 0)  # the padded rows are sliced off
    packed = [f"emb_Q{bits}", "emb_scales"] + ([] if symmetric else ["emb_zero_points"])
    assert sorted(model.graph.initializers) == sorted(packed)
    gbq = next(n for n in model.graph if n.op_type == "GatherBlockQuantized")
    mnb = next(n for n in model.graph if n.op_type == "MatMulNBits")
    assert gbq.inputs[0].producer().inputs[0] is mnb.inputs[1]  # Reshape of the same bytes
    assert gbq.inputs[2] is mnb.inputs[2]
    assert [(q.node, q.op_type) for q in report.quantized] == [
        ("embed", "Gather"),
        ("lm", "MatMul"),
    ]
    assert report.notes == [
        f"tied 'emb': one packed initializer for GatherBlockQuantized at {bits} bits, "
        f"MatMulNBits at {bits} bits"
    ]
    (y,) = run_ort(model, [IDS])
    table = fake_quant(emb.T.copy(), bits=bits, symmetric=symmetric).T
    np.testing.assert_allclose(y, table[IDS] @ table.T, atol=1e-4)


def test_tied_table_at_two_bit_widths_is_packed_twice_and_reported():
    model, emb = _tied(64)
    report = irkit.QuantizeReport()
    irkit.quantize(model, embeddings=True, bits_for={"lm": 8}, accuracy_level=0, report=report)
    assert sorted(model.graph.initializers) == ["emb_Q4", "emb_Q8", "emb_scales", "emb_scales_1"]
    assert report.notes == [
        "tied 'emb': packed once per bit width (GatherBlockQuantized at 4 bits, MatMulNBits at "
        "8 bits): give both one setting to share one initializer"
    ]
    (y,) = run_ort(model, [IDS])
    t4, t8 = (fake_quant(emb.T.copy(), bits=b).T for b in (4, 8))
    np.testing.assert_allclose(y, t4[IDS] @ t8.T, atol=1e-4)


def test_embeddings_off_by_default_and_excluded_or_odd_gathers_are_reported():
    model, emb = _tied(64)
    irkit.quantize(model)
    assert op_histogram(model.graph)["Gather"] == 1
    model, _ = _tied(64)
    report = irkit.QuantizeReport()
    irkit.quantize(model, embeddings=True, exclude="embed", report=report)
    assert [(s.node, s.reason) for s in report.skipped] == [("embed", "excluded by exclude=")]
    assert sorted(model.graph.initializers) == ["emb", "emb_Q4", "emb_scales"]
    (rows,) = support.weights((40, 64))
    node = helper.make_node("Gather", ["t", "ids"], ["y"], name="cols", axis=1)
    model = support.model([node], {"ids": (TensorProto.INT64, [3])}, ["y"], {"t": rows})
    irkit.quantize(model, embeddings=True, report=report)
    assert [(s.node, s.reason) for s in report.skipped] == [
        ("cols", "Gather on an axis other than 0 (GatherBlockQuantized gathers rows here)")
    ]


def test_tied_embeddings_quantize_only_the_table_the_lm_head_multiplies_by():
    """``embeddings="tied"`` (what ``irkit export`` passes): the tied table becomes one packed
    initializer for both ops; an untied table (a position table beside it) stays in float, and
    the report says why."""
    model, emb = _tied(64)
    (positions,) = support.weights((8, 64))
    pos_ids = helper.make_tensor_value_info("pos", TensorProto.INT64, [2, 3])
    model.graph.inputs.append(ir.serde.deserialize_value_info_proto(pos_ids, None))
    table = ir.Value(
        name="wpe",
        type=ir.TensorType(ir.DataType.FLOAT),
        shape=ir.Shape(positions.shape),
        const_value=ir.tensor(positions, name="wpe"),
    )
    model.graph.register_initializer(table)
    gather = ir.Node("", "Gather", [table, model.graph.inputs[-1]], name="position")
    model.graph.append(gather)
    model.graph.outputs.append(gather.outputs[0])
    gather.outputs[0].name = "p"
    report = irkit.QuantizeReport()
    irkit.quantize(model, embeddings="tied", accuracy_level=0, report=report)
    hist = op_histogram(model.graph)
    assert hist["com.microsoft::GatherBlockQuantized"] == 1 and hist["Gather"] == 1
    assert sorted(model.graph.initializers) == ["emb_Q4", "emb_scales", "wpe"]
    assert [(s.node, s.reason) for s in report.skipped] == [
        ("position", "a table no quantized product multiplies by (embeddings='tied')")
    ]
    y, p = run_ort(model, [IDS, IDS % 8])
    quantized = fake_quant(emb.T.copy()).T
    np.testing.assert_allclose(y, quantized[IDS] @ quantized.T, atol=1e-4)
    np.testing.assert_array_equal(p, positions[IDS % 8])
