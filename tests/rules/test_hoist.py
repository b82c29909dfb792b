""":mod:`irkit.rules.hoist`: layer-invariant nodes leave the layer functions.

A hand-written model calls a ``Layer`` function twice through a ``Model`` function (as irkit's
hierarchy calls a decoder layer per layer): each layer turns the model-wide boolean mask into an
additive one (``Where``) and slices the model's input table, then mixes in its own weight. After
:func:`hoist_invariants` the mask is computed once in ``Model`` and the slice once in the main
graph (the graphs that hold what they read), the layers read them from new inputs, and
onnxruntime gives the same numbers.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from irkit.rules.hoist import Threader, hoist_invariants

TEXT = """
<ir_version: 10, opset_import: ["" : 23, "local" : 1]>
g (float[2,4] x, bool[2,4] keep, float[2,8] table) => (float[2,4] y) <float[4] w0, float[4] w1> {
    w0 = Constant<value=float[4] {1.0, 2.0, 3.0, 4.0}>()
    w1 = Constant<value=float[4] {0.5, 0.25, 0.125, 2.0}>()
    y = local.Model(x, keep, table, w0, w1)
}
<domain: "local", opset_import: ["" : 23, "local" : 1]>
Model (x, keep, table, w0, w1) => (y) {
    negated = Not(keep)
    h = local.Layer(x, negated, table, w0)
    y = local.Layer(h, negated, table, w1)
}
<domain: "local", opset_import: ["" : 23]>
Layer (x, drop, table, w) => (y) {
    zero = Constant<value=float {0.0}>()
    low = Constant<value=float {-1e4}>()
    mask = Where(drop, low, zero)
    start = Constant<value_ints=[0]>()
    end = Constant<value_ints=[4]>()
    axis = Constant<value_ints=[1]>()
    part = Slice(table, start, end, axis)
    scaled = Mul(x, w)
    shifted = Add(scaled, part)
    y = Add(shifted, mask)
}
"""


def _ops(function: ir.Function) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in function if n.op_type != "Constant")


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]  # type: ignore[no-any-return]


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((2, 4)).astype(np.float32),
        "keep": rng.random((2, 4)) > 0.3,
        "table": rng.standard_normal((2, 8)).astype(np.float32),
    }


def test_invariants_move_to_the_graph_that_holds_their_inputs():
    model = ir.from_onnx_text(TEXT)
    before = _run(model, _feeds())
    layer = model.functions[("local", "Layer", "")]
    outer = model.functions[("local", "Model", "")]
    assert _ops(layer) == {"Where": 1, "Slice": 1, "Mul": 1, "Add": 2}
    assert hoist_invariants(model) == 2
    assert _ops(layer) == {"Mul": 1, "Add": 2}  # the layer's own work only
    assert _ops(outer) == {"Not": 1, "Where": 1, "Layer": 2}  # the mask: once, in Model
    main = collections.Counter(n.op_type for n in model.graph if n.op_type != "Constant")
    assert main == {"Slice": 1, "Model": 1}  # the table is the main graph's: sliced there
    assert len(layer.inputs) == 6 and len(outer.inputs) == 6
    np.testing.assert_array_equal(_run(model, _feeds()), before)


def test_threader_binds_what_every_call_passes():
    model = ir.from_onnx_text(TEXT)
    threader = Threader(model)
    layer = model.functions[("local", "Layer", "")]
    bound = threader.bound[("local", "Layer", "")]
    names = {str(f.name): bound.get(id(f)) for f in layer.inputs}
    assert names["x"] is None and names["w"] is None  # differs between the two calls
    assert names["drop"] is not None and names["drop"][0] == ("local", "Model", "")
    assert names["table"] is not None and names["table"][0] is None  # the main graph's input
    assert threader.runs(("local", "Layer", "")) == 2


def test_a_function_run_once_keeps_its_nodes():
    model = ir.from_onnx_text(TEXT.replace("y = local.Layer(h, negated, table, w1)", "y = Relu(h)"))
    assert hoist_invariants(model) == 0
    assert _ops(model.functions[("local", "Layer", "")])["Where"] == 1


def test_a_hoisted_contrib_op_brings_its_domain():
    text = (
        TEXT.replace("part = Slice(table, start, end, axis)", "part = com.microsoft.Gelu(table)")
        .replace("float[2,8] table", "float[2,4] table")
        .replace(
            '<domain: "local", opset_import: ["" : 23]>',
            '<domain: "local", opset_import: ["" : 23, "com.microsoft" : 1]>',
        )
    )
    model = ir.from_onnx_text(text)
    before = _run(model, _feeds() | {"table": _feeds()["table"][:, :4].copy()})
    assert "com.microsoft" not in model.opset_imports
    assert hoist_invariants(model) == 2
    assert model.opset_imports["com.microsoft"] == 1  # Gelu now runs in the main graph
    assert [n.op_type for n in model.graph if n.domain == "com.microsoft"] == ["Gelu"]
    after = _run(model, _feeds() | {"table": _feeds()["table"][:, :4].copy()})
    np.testing.assert_array_equal(after, before)


TWO_BODIES = """
<ir_version: 10, opset_import: ["" : 23, "local" : 1]>
g (float[2,4] x, float[2,8] table) => (float[2,4] y) {
    a = local.Even(x, table)
    b = local.Even(a, table)
    c = local.Odd(b, table)
    y = local.Odd(c, table)
}
<domain: "local", opset_import: ["" : 23]>
Even (x, table) => (y) {
    start = Constant<value_ints=[0]>()
    end = Constant<value_ints=[4]>()
    axis = Constant<value_ints=[1]>()
    part = Slice(table, start, end, axis)
    y = Add(x, part)
}
<domain: "local", opset_import: ["" : 23]>
Odd (x, table) => (y) {
    start = Constant<value_ints=[0]>()
    end = Constant<value_ints=[4]>()
    axis = Constant<value_ints=[1]>()
    part = Slice(table, start, end, axis)
    y = Mul(x, part)
}
"""


def test_equal_invariants_of_two_bodies_are_computed_once():
    """Two functions (a windowed and a full-attention layer, say) that each derive the same
    value from a model-wide input: one copy in the main graph after hoisting."""
    model = ir.from_onnx_text(TWO_BODIES)
    feeds = {k: v for k, v in _feeds().items() if k in ("x", "table")}
    before = _run(model, feeds)
    assert hoist_invariants(model) == 2
    main = collections.Counter(n.op_type for n in model.graph if n.op_type != "Constant")
    assert main == {"Slice": 1, "Even": 2, "Odd": 2}
    np.testing.assert_array_equal(_run(model, feeds), before)
