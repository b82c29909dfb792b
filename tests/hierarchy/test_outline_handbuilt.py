"""Outlining hand-built onnx-ir models that carry irkit scope metadata (no torch needed)."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx_ir as ir
import pytest

import irkit
from irkit import metadata as md
from tests.helpers import run_ort
from tests.hierarchy import builders as B
from tests.hierarchy.golden import check_golden

X = np.random.default_rng(1).standard_normal((3, B.STACK_D)).astype(np.float32)


def outline_and_compare(model: ir.Model, inputs, **kwargs) -> ir.Model:
    """Outline ``model``; assert checker + topological order + identical numbers in ORT."""
    before = run_ort(model, inputs)
    irkit.outline(model, **kwargs)
    irkit.check(irkit.lint(model))
    assert_sorted(model)
    after = run_ort(model, inputs)
    for a, b in zip(after, before, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    return model


def assert_sorted(model: ir.Model) -> None:
    for body in (model.graph, *model.functions.values()):
        seen = set(body.inputs) | set(getattr(body, "initializers", {}).values())
        for node in body:
            for v in node.inputs:
                assert v is None or v in seen or v.producer() is None, (
                    f"{node.name} before its input"
                )
            seen.update(node.outputs)


def calls(model: ir.Model) -> list[tuple[str, str]]:
    return [(n.name, n.op_type) for n in model.graph if n.op_identifier() in model.functions]


def test_stack_dedupes_to_one_block_function():
    model = outline_and_compare(B.stack(4), [X])
    assert [f.name for f in model.functions.values()] == ["Linear", "ReLU", "Block"]
    assert calls(model) == [(f"layers.{i}", "Block") for i in range(4)]
    block = model.functions[("mypkg", "Block", "")]
    # Weights are function inputs; call sites pass their own.
    assert [v.name for v in block.inputs] == [
        "x",
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    assert [v.name for v in model.graph.node("layers.2").inputs] == [
        "add_12",
        "layers.2.fc1.weight",
        "layers.2.fc1.bias",
        "layers.2.fc2.weight",
        "layers.2.fc2.bias",
    ]
    assert model.opset_imports == {"": 21, "torch.nn.modules": 1, "mypkg": 1}
    assert block.opset_imports == {"": 21, "torch.nn.modules": 1}
    check_golden("stack4_tree.txt", irkit.function_tree(model))
    check_golden("stack4.onnx.txt", ir.to_onnx_text(model, exclude_initializers=True))


def test_call_node_and_body_metadata():
    model = irkit.outline(B.stack(2))
    call = model.graph.node("layers.1")
    assert json.loads(call.metadata_props[md.CALL_MODULE]) == ["layers.1", 0, B.BLOCK]
    assert md.node_scope(call.metadata_props) == ()
    block = model.functions[("mypkg", "Block", "")]
    inner = [n for n in block if n.op_type == "Linear"][0]
    assert md.node_scope(inner.metadata_props) == (md.Frame("layers.0", 0, B.BLOCK),)
    linear = model.functions[("torch.nn.modules", "Linear", "")]
    assert [n.metadata_props[md.SOURCE] for n in linear] == ["model.py:1", "model.py:2"]
    assert md.decode_scope(block.metadata_props[md.OUTLINE_ORIGIN]) == (
        md.Frame("layers.0", 0, B.BLOCK),
    )


def test_different_bodies_of_one_class_get_suffixed_names():
    model = outline_and_compare(B.stack(3, first_bias=False), [X])
    assert calls(model) == [("layers.0", "Block"), ("layers.1", "Block_1"), ("layers.2", "Block_1")]
    assert sorted(f.name for f in model.functions.values()) == [
        "Block",
        "Block_1",
        "Linear",
        "Linear_1",
        "ReLU",
    ]
    assert len(model.functions[("torch.nn.modules", "Linear", "")]) == 1  # MatMul only
    assert all(f.overload == "" for f in model.functions.values())


def test_dynamic_batch_dim_survives_in_function_types():
    model = outline_and_compare(B.stack(2, batch="batch"), [X])
    block = model.functions[("mypkg", "Block", "")]
    assert str(block.inputs[0].shape) == "[batch,8]"
    assert str(block.outputs[0].shape) == "[batch,8]"
    assert "float[batch,8] x" in ir.to_onnx_text(model, exclude_initializers=True)


def test_one_module_called_twice_shares_one_function():
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    w = (b.weight("enc.weight", [B.STACK_D, B.STACK_D]), b.weight("enc.bias", [B.STACK_D]))
    h = B.linear(b, "enc", x, 0, 0, weights=w)
    h = b.op("Tanh", h)  # a functional op of the root between the two calls
    y = B.linear(b, "enc", h, 0, 0, call=1, weights=w)
    model = outline_and_compare(b.model([y]), [X])
    assert calls(model) == [("enc", "Linear"), ("enc@1", "Linear")]
    assert len(model.functions) == 1
    assert json.loads(model.graph.node("enc@1").metadata_props[md.CALL_MODULE]) == [
        "enc",
        1,
        B.LINEAR,
    ]


def test_non_convex_region_is_split_into_convex_parts_with_a_note():
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    with b.module("c", "mypkg.Child"):
        a = b.op("Relu", x)
    n = b.op("Neg", a)  # parent op: consumes the child's first piece, feeds its second
    with b.module("c", "mypkg.Child"):
        y = b.op("Add", n, a)
    with b.module("d", "mypkg.Other"):
        z = b.op("Sigmoid", y)
    expected = (
        "module call 'c' (mypkg.Child) split into 2 convex parts: its region is not convex "
        "(a path leaves it and re-enters it through 'neg_2'; one call node would create a cycle)"
    )
    with pytest.warns(irkit.OutlineWarning, match=re.escape(expected)):
        model = outline_and_compare(b.model([z]), [X])
    assert calls(model) == [("c/part0", "Child"), ("c/part1", "Child_1"), ("d", "Other")]
    assert [n.op_type for n in model.graph] == ["Child", "Neg", "Child_1", "Other"]
    assert model.graph.node("c/part1").metadata_props[md.OUTLINE_NOTE] == expected
    assert md.OUTLINE_NOTE not in model.graph.node("neg_2").metadata_props
    check_golden("non_convex_tree.txt", irkit.function_tree(model))


def test_disconnected_siblings_that_would_form_a_cycle():
    # A = {a1, a2} and B = {b1, b2} are each convex, but A feeds B (a1→b1) and B feeds A (b2→a2):
    # one call node each would make a cycle, so B (second) is split around A's call node.
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    with b.module("a", "mypkg.A"):
        a1 = b.op("Relu", x)
    with b.module("b", "mypkg.B"):
        b1 = b.op("Neg", a1)
        b2 = b.op("Sigmoid", x)
    with b.module("a", "mypkg.A"):
        a2 = b.op("Add", b2, x)
    y = b.op("Mul", a2, b1)
    with pytest.warns(
        irkit.OutlineWarning, match=r"module call 'b' \(mypkg.B\) split into 2 convex parts"
    ):
        model = outline_and_compare(b.model([y]), [X])
    assert calls(model) == [("b/part0", "B"), ("a", "A"), ("b/part1", "B_1")]
    assert [f.name for f in model.functions.values()] == ["A", "B", "B_1"]


def test_unused_output_dropped_and_tuple_outputs_kept_in_order():
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    with b.module("heads", "mypkg.Heads"):
        p = b.op("Relu", x)
        q = b.op("Neg", x)
        unused = b.op("Sigmoid", x)
    y = b.op("Sub", q, p)  # uses the outputs in reverse order
    model = outline_and_compare(b.model([y, p]), [X])
    heads = model.functions[("mypkg", "Heads", "")]
    assert [v.name for v in heads.outputs] == ["relu_1", "neg_2"]  # production order, no sigmoid
    assert [v.name for v in model.graph.node("heads").outputs] == ["relu_1", "neg_2"]
    assert model.graph.outputs[1] is model.graph.node("heads").outputs[0]
    assert unused.name == "sigmoid_3"


def test_call_signatures_order_inputs_and_outputs():
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    z = b.input("z", [3, B.STACK_D])
    with b.module("m", "mypkg.M"):
        p = b.op("Add", x, z)
        q = b.op("Mul", x, z)
    y = b.op("Sub", p, q)
    model = outline_and_compare(
        b.model([y]), [X, X], call_signatures={"m": (["z", "x"], ["mul_2", "add_1"])}
    )
    fn = model.functions[("mypkg", "M", "")]
    assert [v.name for v in fn.inputs] == ["z", "x"]
    assert [v.name for v in fn.outputs] == ["mul_2", "add_1"]


def test_tied_weights_and_constants():
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    w = b.weight("emb.weight", [B.STACK_D, B.STACK_D])
    with b.module("emb", "mypkg.Emb"):
        h = b.op("MatMul", x, w)
    with b.module("head", "mypkg.Head"):
        two = b.op("Constant", value=ir.tensor(np.array(2.0, np.float32)))
        y = b.op("Mul", b.op("MatMul", h, w), two)  # the same (tied) weight
    model = outline_and_compare(b.model([y]), [X])
    head = model.functions[("mypkg", "Head", "")]
    assert [v.name for v in head.inputs] == ["matmul_1", "emb.weight"]
    assert [n.op_type for n in head] == ["Constant", "MatMul", "Mul"]  # the constant stays inside
    assert list(model.graph.initializers) == ["emb.weight"]


def test_outlining_twice_is_stable():
    model = irkit.outline(B.stack(2))
    text = ir.to_onnx_text(model, exclude_initializers=True)
    irkit.outline(model)
    assert ir.to_onnx_text(model, exclude_initializers=True) == text


def test_functions_false_and_max_depth_zero_are_no_ops():
    for kwargs in ({"functions": False}, {"max_depth": 0}):
        model = B.stack(2)
        text = ir.to_onnx_text(model, exclude_initializers=True)
        irkit.outline(model, **kwargs)
        assert ir.to_onnx_text(model, exclude_initializers=True) == text


def test_shared_constant_is_copied_into_each_call():
    """After CSE one Constant (in layers.0's scope) serves every layer: it is copied into each
    layer so layer 0 does not export it, and the layers still share one function."""
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    h = x
    with b.module("layers.0", B.BLOCK):
        two = b.op("Constant", value=ir.tensor(np.full((B.STACK_D,), 2.0, np.float32)))
    for i in range(3):
        with b.module(f"layers.{i}", B.BLOCK):
            h = b.op("Add", b.op("Mul", h, two), h)
    model = outline_and_compare(b.model([h]), [X])
    assert [f.name for f in model.functions.values()] == ["Block"]
    block = model.functions[("mypkg", "Block", "")]
    assert [n.op_type for n in block] == ["Constant", "Mul", "Add"]
    assert [len(n.inputs) for n in model.graph] == [1, 1, 1]


def test_large_constants_are_not_copied():
    b = B.Builder()
    x = b.input("x", [3, 8192])
    with b.module("a", "m.A"):
        big = b.op("Constant", value=ir.tensor(np.ones((8192,), np.float32)))
        y = b.op("Mul", x, big)
    with b.module("b", "m.B"):
        z = b.op("Add", y, big)
    model = outline_and_compare(b.model([z]), [np.ones((3, 8192), np.float32)])
    assert [len(n.outputs) for n in model.graph] == [2, 1]  # a exports the big constant


def test_control_flow_is_outlined_with_captured_values_as_inputs():
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    with b.module("gate", "m.Gate"):
        cond = b.op("ReduceSum", x, keepdims=0)
        cond = b.op("Greater", cond, b.op("Constant", value=ir.tensor(np.array(0.0, np.float32))))
    branch = lambda op: ir.Graph(  # noqa: E731
        [], [out := ir.Node("", op, [x]).outputs[0]], nodes=[out.producer()], name=op
    )
    with b.module("sel", "m.Select"):
        y = b.op("If", cond, then_branch=branch("Relu"), else_branch=branch("Neg"))
    model = outline_and_compare(b.model([y]), [X])
    assert calls(model) == [("gate", "Gate"), ("sel", "Select")]
    select = model.functions[("m", "Select", "")]
    # x is read by name inside both branches: it is an input of the function, and the
    # branches read the function's input
    assert len(select.inputs) == 2
    [if_node] = list(select)
    branch_reads = {n.inputs[0] for a in if_node.attributes.values() for n in a.value}
    assert branch_reads == {select.inputs[1]}


def test_values_captured_by_subgraphs_are_dataflow_edges():
    # c = {relu, add}; an If at the root captures relu's output inside its branch and feeds add:
    # without the captured edge c would look convex and outlining it would create a cycle.
    b = B.Builder()
    x = b.input("x", [3, B.STACK_D])
    with b.module("c", "m.C"):
        r = b.op("Relu", x)
    cond = b.op("Constant", value=ir.tensor(np.array(True)))
    inner = ir.Node("", "Neg", [r])
    then = ir.Graph([], inner.outputs, nodes=[inner], name="then")
    inner2 = ir.Node("", "Identity", [r])
    other = ir.Graph([], inner2.outputs, nodes=[inner2], name="else")
    f = b.op("If", cond, then_branch=then, else_branch=other)
    with b.module("c", "m.C"):
        y = b.op("Add", f, x)
    with pytest.warns(
        irkit.OutlineWarning, match=r"module call 'c' \(m.C\) split into 2 convex parts"
    ):
        model = outline_and_compare(b.model([y]), [X])
    assert [n.op_type for n in model.graph] == ["C", "Constant", "If", "C_1"]


def test_bodies_in_another_node_order_share_one_function():
    """Two calls of one class whose nodes were emitted in different orders (so their inputs and
    outputs come in different first-use/production orders): found by WL hash + isomorphism, the
    call passes its inputs and takes its outputs permuted. Sub is not commutative: a wrong
    permutation would change the numbers."""
    b = B.Builder()
    p = b.input("p", [3, B.STACK_D])
    q = b.input("q", [3, B.STACK_D])
    with b.module("m", "m.Two"):
        t = b.op("Relu", p)
        u = b.op("Neg", q)
        y1, z1 = b.op("Sub", t, u), b.op("Mul", t, u)
    with b.module("m", "m.Two", call_index=1):
        u = b.op("Neg", z1)
        t = b.op("Relu", y1)
        z2 = b.op("Mul", t, u)
        y2 = b.op("Sub", t, u)
    model = outline_and_compare(b.model([y2, z2]), [X, 2 * X])
    assert calls(model) == [("m", "Two"), ("m@1", "Two")]
    assert len(model.functions) == 1
    second = model.graph.node("m@1")
    assert [v.name for v in second.inputs] == ["sub_3", "mul_4"]  # (p, q) order of the function
    assert [v.name for v in second.outputs] == ["sub_8", "mul_7"]  # (Sub, Mul) order
