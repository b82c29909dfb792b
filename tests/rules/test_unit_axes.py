"""Rule family :mod:`irkit.rules.unit_axes` (part of the ``"ort"`` target's shape rules).

Hand-written graphs: the exact ops after the rewrite, onnxruntime's numbers before and after
(integer masks: equal), and the reasons each rule declines. The twin masks of a state model's
padding glue (an ``Unsqueeze`` and a ``Reshape`` of the same mask) become one after the rewrite
and irkit's common-subexpression elimination.
"""

from __future__ import annotations

import pytest

from irkit.rules import unit_axes
from tests.rewriting import util
from tests.rules.support import parse

H = '<ir_version: 10, opset_import: ["" : 18]>'


def _rewrite(text: str):
    m = util.infer_shapes(util.model(H + text))
    before = util.clone(m)
    report = util.rewrite(m, unit_axes.rules)
    util.assert_valid(m)
    util.assert_same_numbers(before, m)
    return m, report


def test_reshape_appending_unit_dims_is_the_unsqueeze_beside_it():
    """``view(b, s, 1)`` beside ``m[..., None]``: one Unsqueeze and one Cast after CSE."""
    m, report = _rewrite(
        "g (int64[b, s] mask) => (float[b, s, 1] y, float[b, s, 1] z) {\n"
        "  a = Constant<value=int64[1] {2}>()  t = Constant<value=int64[3] {0, 0, 1}>()\n"
        "  u = Unsqueeze(mask, a)  y = Cast<to=1>(u)\n"
        "  r = Reshape(mask, t)  z = Cast<to=1>(r)\n"
        "}"
    )
    assert report.fired["ReshapeAsUnsqueeze"] == 1
    assert util.ops(m) == {"Constant": 2, "Unsqueeze": 2, "Cast": 2}
    util.optimize(m, target="onnx")  # (folding + CSE: the twins merge; z is y's copy)
    assert util.ops(m) == {"Cast": 1, "Identity": 1, "Unsqueeze": 1}


def test_unsqueeze_of_a_reduction_keeps_its_dims():
    """``amax(m · arange, dim=1).unsqueeze(1)`` → ``ReduceMax(keepdims=1)``."""
    m, report = _rewrite(
        "g (int64[b, s] x) => (int64[b, 1] y) {\n"
        "  a = Constant<value=int64[1] {-1}>()  u = Constant<value=int64[1] {1}>()\n"
        "  r = ReduceMax<keepdims=0>(x, a)  y = Unsqueeze(r, u)\n"
        "}"
    )
    assert report.fired["ReduceKeepdims"] == 1
    assert util.ops(m) == {"Constant": 1, "ReduceMax": 1}
    (reduce,) = [n for n in m.graph if n.op_type == "ReduceMax"]
    assert reduce.attributes["keepdims"].as_int() == 1


@pytest.mark.parametrize("negated", [True, False])
def test_a_length_squeezed_and_reshaped_back_is_the_one_element_vector(negated):
    """``attention_mask[:, -S:]`` as ``torch.export`` writes it: ``S`` read as a scalar
    (``Squeeze(Shape(x, 1, 2))``), negated, reshaped to ``[1]`` for the ``Slice``."""
    v, neg = ("n", "  n = Neg(q)") if negated else ("q", "")
    m, report = _rewrite(
        "g (int64[b, s] x, int64[b, t] mask, float[b, t] f) => (int64[b, z] y, float[b, w] g) {\n"
        f"  sh = Shape<start=1, end=2>(x)  q = Squeeze(sh){neg}\n"
        "  one = Constant<value=int64[1] {1}>()  far = Constant<value=int64[1] {1000000}>()\n"
        f"  r = Reshape({v}, one)  y = Slice(mask, r, far, one)\n"
        f"  r2 = Reshape({v}, one)  g = Slice(f, r2, far, one)\n}}"  # (the mask sliced twice)
    )
    assert report.fired["ScalarRoundTrip"] == 2
    assert util.ops(m) == {"Shape": 1, "Constant": 2, "Slice": 2, **({"Neg": 2} if negated else {})}


@pytest.mark.parametrize(
    ("body", "rule", "reason"),
    [
        (  # the 1 goes in the middle: not an append
            "g (float[b, s] x) => (float[b, 1, s] y) {\n"
            "  t = Constant<value=int64[3] {0, 1, -1}>()  y = Reshape(x, t)\n}",
            "ReshapeAsUnsqueeze",
            "does not end in unit dims",
        ),
        (  # a 0 copies a dim of another size: allowzero makes it a zero-sized dim
            "g (float[b, s] x) => (float[b, s, 1] y) {\n"
            "  t = Constant<value=int64[3] {0, 0, 1}>()  y = Reshape<allowzero=1>(x, t)\n}",
            "ReshapeAsUnsqueeze",
            "allowzero=1",
        ),
        (  # two elements squeezed: not a scalar's round trip (a Squeeze of [1, 2] stays)
            "g (int64[1, 2] x) => (int64[2] y) {\n"
            "  one = Constant<value=int64[1] {-1}>()  q = Squeeze(x)  y = Reshape(q, one)\n}",
            "ScalarRoundTrip",
            "not of static shape [1]",
        ),
        (  # the unsqueezed axis is not the reduced one
            "g (float[b, s, 4] x) => (float[1, b, 4] y) {\n"
            "  a = Constant<value=int64[1] {1}>()  u = Constant<value=int64[1] {0}>()\n"
            "  r = ReduceSum<keepdims=0>(x, a)  y = Unsqueeze(r, u)\n}",
            "ReduceKeepdims",
            "not the reduced axes",
        ),
        (  # the reduction's output is read elsewhere too
            "g (float[b, s] x) => (float[b, 1] y, float[b] r) {\n"
            "  a = Constant<value=int64[1] {1}>()\n"
            "  r = ReduceMax<keepdims=0>(x, a)  y = Unsqueeze(r, a)\n}",
            "ReduceKeepdims",
            "used elsewhere",
        ),
    ],
)
def test_declines(body, rule, reason):
    m = util.infer_shapes(parse(body))
    report = util.rewrite(m, unit_axes.rules)
    stats = report.rules[rule]
    assert stats.fired == 0 and stats.tried >= 1
    assert any(reason in failure for failure in stats.failures), dict(stats.failures)


def test_a_shape_of_one_dim_is_one_element_without_shape_inference():
    """Under ``irkit.optimize`` a ``Shape``'s output often has no inferred shape yet: one read
    with ``start``/``end`` one dim apart is one element all the same."""
    m = parse(
        "g (int64[b, s] x, int64[b, t] mask) => (int64[b, z] y) {\n"
        "  sh = Shape<start=-1, end=2>(x)  q = Squeeze(sh)  n = Neg(q)\n"
        "  one = Constant<value=int64[1] {1}>()  far = Constant<value=int64[1] {1000000}>()\n"
        "  r = Reshape(n, one)  y = Slice(mask, r, far, one)\n}"
    )
    (shape,) = [n for n in m.graph if n.op_type == "Shape"]
    shape.outputs[0].shape = None  # (as the lowering leaves it)
    before = util.clone(m)
    report = util.rewrite(m, unit_axes.rules)
    assert report.fired["ScalarRoundTrip"] == 1
    util.assert_same_numbers(before, m)
