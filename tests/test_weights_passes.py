"""The weightless passes are onnx-ir passes: they run alone, in a ``PassManager``, and say whether
they changed the model (the pipeline runs them inside ``irkit.optimize``)."""

from __future__ import annotations

import onnx_ir as ir

from irkit import metadata
from irkit.rewriting import RewriteBuilder, weight_constant
from irkit.weights import (
    DedupeDerivedPass,
    DerivedTensor,
    FoldWeightlessPass,
    LiftWeightlessConstantsPass,
    Transpose,
    WeightlessTensor,
    transpose,
)

TEXT = """<ir_version: 10, opset_import: ["" : 21]>
g (float[2, 4] x) => (float[2, 3] y) { t = Transpose <perm = [1, 0]> (w)  y = MatMul(x, t) }"""


def _model() -> ir.Model:
    model = ir.from_onnx_text(TEXT)
    w = next(v for n in model.graph for v in n.inputs if v is not None and v.name == "w")
    w.type, w.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([3, 4])
    w.const_value = WeightlessTensor(ir.DataType.FLOAT, [3, 4], name="w")
    model.graph.register_initializer(w)
    return model


def test_fold_weightless_pass_turns_the_transpose_into_a_derived_initializer():
    model = _model()
    result = ir.passes.PassManager([FoldWeightlessPass()])(model)
    assert result.modified and result.model is model
    assert [n.op_type for n in model.graph] == ["MatMul"]
    (folded,) = model.graph.initializers.values()
    assert folded.name == "t" and isinstance(folded.const_value, DerivedTensor)
    assert folded.const_value.recipe == Transpose(folded.const_value.recipe.source, (1, 0))
    assert not FoldWeightlessPass()(model).modified  # (nothing left to fold)


def test_fold_weightless_pass_follows_the_folding_policy():
    model = _model()
    assert not FoldWeightlessPass(lambda node: False)(model).modified
    assert [n.op_type for n in model.graph] == ["Transpose", "MatMul"]


def test_lift_and_dedupe_passes():
    model = _model()
    w = model.graph.initializers["w"].const_value
    op = RewriteBuilder()
    a, b = (weight_constant(op, transpose(w, [1, 0])) for _ in range(2))
    mm = model.graph.node(1)
    model.graph.insert_before(mm, op.nodes)
    s = ir.node("Add", [a, b])
    model.graph.insert_before(mm, [s])
    mm.replace_input_with(1, s.outputs[0])
    model.graph.remove(model.graph.node(0), safe=True)

    assert LiftWeightlessConstantsPass()(model).modified
    assert not LiftWeightlessConstantsPass()(model).modified
    derived = [v for v in model.graph.initializers.values() if v.name != "w"]
    assert [type(v.const_value) for v in derived] == [DerivedTensor, DerivedTensor]
    assert metadata.DERIVED_KEY in derived[0].const_value.metadata_props

    assert DedupeDerivedPass()(model).modified  # (the same recipe twice: one initializer)
    assert not DedupeDerivedPass()(model).modified
    assert s.inputs[0] is s.inputs[1] and len(model.graph.initializers) == 2
