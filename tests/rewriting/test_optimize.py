"""irkit.optimize on real lowered models: fusions fire, numbers agree with eager PyTorch."""

from __future__ import annotations

import collections

import onnx_ir as ir
import pytest

import irkit
from tests import zoo
from tests.helpers import FP32_ATOL, assert_close, flatten_outputs, run_ort
from tests.rewriting import util


def _optimized(name: str, **kwargs):
    zm = zoo.load(name)
    model = irkit.lower(zoo.export(name), functions=False)
    report = util.optimize(model, **kwargs)
    util.assert_valid(model)
    out = run_ort(model, [a.numpy() for a in zm.args])
    assert_close(out, flatten_outputs(zm.eager()), FP32_ATOL)
    return model, report


def _count(model: ir.Model, op_type: str) -> int:
    return collections.Counter(n.op_type for n in model.graph)[op_type]


@pytest.mark.slow
def test_llama_rms_norm_fuses():
    model, report = _optimized("llama")
    # 2 layers × (input, post-attention) + the final norm
    assert report.fired["RMSNormalization"] == 5
    assert _count(model, "RMSNormalization") == 5
    assert {"Pow", "Sqrt", "Reciprocal", "ReduceMean"}.isdisjoint(n.op_type for n in model.graph)
    scopes = {
        n.metadata_props.get("irkit.scope") for n in model.graph if n.op_type == "RMSNormalization"
    }
    assert len(scopes) == 5  # each fused node keeps its own module scope


@pytest.mark.slow
def test_gpt2_tanh_gelu_and_gemm():
    model, report = _optimized("gpt2")
    assert report.fired["GeluTanh"] == 2
    assert _count(model, "Gelu") == 2
    assert _count(model, "Gemm") == 8
    assert _count(model, "Constant") == 0  # lifted to initializers


@pytest.mark.slow
def test_opset_cap_keeps_gelu_decomposed():
    model, report = _optimized("gpt2", opset=18)
    assert "GeluTanh" not in report.fired
    assert _count(model, "Tanh") == 2


def test_unknown_target():
    model = util.model(
        '<ir_version: 10, opset_import: ["" : 18]>\ng (float[2] x) => (float[2] y) { y = Relu(x) }'
    )
    with pytest.raises(irkit.RewriteError) as info:
        irkit.optimize(model, target="tpu")
    assert str(info.value) == "unknown optimize target 'tpu'; known targets: ['onnx', 'ort']"


@pytest.mark.slow
def test_llama_after_outlining_fuses_inside_the_shared_body():
    """lower → outline → optimize: the norm is fused once in the LlamaRMSNorm function body."""
    if not hasattr(irkit, "outline"):
        pytest.skip("irkit.outline is not on this branch yet")
    zm = zoo.load("llama")
    model = irkit.lower(zoo.export("llama"), functions=False)
    irkit.outline(model)
    functions_before = set(model.functions)
    report = util.optimize(model)
    assert report.fired["RMSNormalization"] == 1
    assert report.rules["RMSNormalization"].where == {"transformers.models.llama::LlamaRMSNorm": 1}
    assert set(model.functions) == functions_before  # the hierarchy survives
    body = model.functions[("transformers.models.llama", "LlamaRMSNorm", "")]
    assert [n.op_type for n in body if n.op_type != "Constant"] == ["RMSNormalization"]
    out = run_ort(model, [a.numpy() for a in zm.args])
    assert_close(out, flatten_outputs(zm.eager()), FP32_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "fired"),
    [
        ("cnn", {}),
        ("t5", {"RMSNormalization": 12}),
        ("whisper", {"GeluErf": 6}),
        ("gpt2_dynamic", {"GeluTanh": 2}),
    ],
)
def test_zoo_models_stay_correct(name, fired):
    """Valid, same numbers as eager PyTorch, and the expected fusions fired (dynamic dims too)."""
    zm = zoo.load(name)
    model = irkit.lower(zoo.export(name), functions=False)
    report = util.optimize(model)
    util.assert_valid(model)
    for rule, count in fired.items():
        assert report.fired[rule] == count
    assert report.nodes_after <= report.nodes_before  # cnn lowers to an already minimal graph
    values = [*zm.args, *zm.kwargs.values()]
    feeds = {i.name: v.numpy() for i, v in zip(model.graph.inputs, values, strict=True)}
    assert_close(run_ort(model, feeds), flatten_outputs(zm.eager()), 2e-4)


def test_an_if_branch_constant_named_like_a_main_graph_value_is_renamed():
    """The lift makes an ``If`` branch's ``Constant`` an initializer of the branch, named as the
    constant was (``val_3``, also a main-graph value): optimize leaves every name once in the
    main graph's scope (onnx-ir 0.1.16's name pass failed on it: the oldest lane), and the
    model computes what it did."""
    import numpy as np
    import onnx
    import onnx_ir.passes.common as common_passes
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from irkit.rewriting._optimize import _rename_subgraph_initializers

    def branch(name: str, value: float) -> onnx.GraphProto:
        three = helper.make_tensor("t", TensorProto.FLOAT, [1], [value])
        return helper.make_graph(
            [
                helper.make_node("Constant", [], ["val_3"], value=three),
                helper.make_node("Add", ["x", "val_3"], [f"{name}_out"]),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1])],
        )

    graph = helper.make_graph(
        [
            helper.make_node("Neg", ["x"], ["val_3"]),
            helper.make_node("Greater", ["val_3", "x"], ["c"]),
            helper.make_node(
                "If", ["c"], ["y"], then_branch=branch("then", 1.0), else_branch=branch("else", 2.0)
            ),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    model = ir.serde.deserialize_model(proto)
    common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    _rename_subgraph_initializers(model)
    (node,) = [n for n in model.graph if n.op_type == "If"]
    names = [v.name for attr in ("then_branch", "else_branch")
             for v in node.attributes[attr].value.initializers.values()]  # fmt: skip
    assert len(set(names)) == 2 and "val_3" not in names
    checked = ir.serde.serialize_model(model)
    onnx.checker.check_model(checked, full_check=True)
    session = ort.InferenceSession(checked.SerializeToString())
    for x, want in ((-1.0, 0.0), (1.0, 3.0)):  # (-x > x: then, x + 1; else x + 2)
        (got,) = session.run(None, {"x": np.array([x], np.float32)})
        np.testing.assert_allclose(got, [want])
