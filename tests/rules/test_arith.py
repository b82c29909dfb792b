"""Rule family :mod:`irkit.rules.arith`: each rule fires (golden, numbers) and declines (exact reason)."""

from __future__ import annotations

import onnx_ir as ir

from tests.rewriting import util
from tests.rules.support import fire, no_fire, parse


def test_add_zero_constant_second():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ z = Constant<value=float[3] {0, 0, 0}>()  t = Add(x, z)  y = Relu(t) }"
    )
    fire(m, "AddZero", {"Relu": 1}, "arith_add_zero")


def test_add_zero_constant_first_initializer_broadcast_dims_of_one():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) <float[1,1] z = {0}> { t = Add(z, x)  y = Relu(t) }"
    )
    fire(m, "AddZero", {"Relu": 1})


def test_add_zero_rank0_constant_needs_no_shape():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ z = Constant<value=float {0}>()  u = Relu(x)  t = Add(u, z)  y = Neg(t) }"
    )
    m.graph.node(1).outputs[0].shape = None  # u: shape unknown
    fire(m, "AddZero", {"Neg": 1, "Relu": 1})


def test_sub_zero():
    m = parse(
        "g (int64[4] x) => (int64[4] y) "
        "{ z = Constant<value=int64[1] {0}>()  t = Sub(x, z)  y = Neg(t) }"
    )
    fire(m, "SubZero", {"Neg": 1})


def test_mul_one_weight_first():
    # The shape of an RMS norm's weight that is still all ones: Mul(w, normed).
    m = util.infer_shapes(
        parse(
            "g (float[2,5,8] x) => (float[2,5,8] y) <float[8] w = {1, 1, 1, 1, 1, 1, 1, 1}> "
            "{ r = Sigmoid(x)  y = Mul(w, r) }"
        )
    )
    fire(m, "MulOne", {"Sigmoid": 1}, "arith_mul_one")
    assert [o.name for o in m.graph.outputs] == ["y"]


def test_div_one():
    m = parse(
        "g (double[2,3] x) => (double[2,3] y) "
        "{ one = Constant<value=double[2,1] {1, 1}>()  t = Div(x, one)  y = Relu(t) }"
    )
    fire(m, "DivOne", {"Relu": 1})


def test_add_not_all_zeros_kept():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ z = Constant<value=float[3] {0, 1, 0}>()  y = Add(z, x) }"
    )
    no_fire(m, "AddZero", "the constant is not all 0s")
    assert util.ops(m) == {"Add": 1, "Constant": 1}


def test_mul_not_all_ones_kept():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ w = Constant<value=float[3] {1, 1, 0.5}>()  y = Mul(x, w) }"
    )
    no_fire(m, "MulOne", "the constant is not all 1s")


def test_add_of_two_computed_values_kept():
    m = parse("g (float[2,3] x, float[2,3] z) => (float[2,3] y) { y = Add(x, z) }")
    no_fire(m, "AddZero", "no constant operand")


def test_sub_zero_minus_x_kept():
    # 0 - x is -x, not x: only the second operand of Sub may be the neutral element.
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) { z = Constant<value=float {0}>()  y = Sub(z, x) }"
    )
    no_fire(m, "SubZero", "no constant operand")


def test_div_one_over_x_kept():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) { one = Constant<value=float {1}>()  y = Div(one, x) }"
    )
    no_fire(m, "DivOne", "no constant operand")


def test_zeros_that_add_dimensions_kept():
    m = parse(
        "g (float[3] x) => (float[2,3] y) "
        "{ z = Constant<value=float[2,3] {0, 0, 0, 0, 0, 0}>()  y = Add(x, z) }"
    )
    no_fire(m, "AddZero", "the constant (rank 2) adds dimensions to x (rank 1)")


def test_ones_that_broadcast_a_dim_kept():
    m = parse(
        "g (float[2,1] x) => (float[2,3] y) "
        "{ w = Constant<value=float[1,3] {1, 1, 1}>()  y = Mul(x, w) }"
    )
    no_fire(m, "MulOne", "the constant's dim 3 broadcasts x's dim 1")


def test_unknown_shape_with_a_tensor_constant_kept():
    m = parse(
        "g (float[2,3] x) => (float[2,3] y) "
        "{ z = Constant<value=float[3] {0, 0, 0}>()  u = Relu(x)  y = Add(u, z) }"
    )
    m.graph.node(1).outputs[0].shape = None
    no_fire(m, "AddZero", "x's shape unknown")


def test_overridable_initializer_kept():
    # An initializer that is also a graph input is a default value: the caller may pass another.
    m = parse("g (float[2,3] x, float[3] z) => (float[2,3] y) { y = Add(x, z) }")
    z = m.graph.inputs[1]
    z.const_value = ir.tensor([0.0, 0.0, 0.0], dtype=ir.DataType.FLOAT, name="z")
    m.graph.register_initializer(z)
    no_fire(m, "AddZero", "the constant is a graph input (callers may override it)")


def test_fusions_win_over_neutral_weight_and_bias():
    # A LayerNorm whose weight is all ones and bias all zeros still fuses as a whole: the arith
    # family runs after the fusions, so the Mul(·, 1) and Add(·, 0) are not taken apart first.
    m = parse(
        """g (float[2,5,4] x) => (float[2,5,4] y) <float[4] w = {1, 1, 1, 1}, float[4] b = {0, 0, 0, 0}> {
  ax = Constant<value=int64[1] {-1}>()  two = Constant<value=float {2.0}>()
  eps = Constant<value=float {1e-5}>()
  m = ReduceMean(x, ax)  d = Sub(x, m)  p = Pow(d, two)  v = ReduceMean(p, ax)  ve = Add(v, eps)
  s = Sqrt(ve)  n = Div(d, s)  nw = Mul(w, n)  y = Add(nw, b) }""",
    )
    report = fire(m, "LayerNormalization", {"LayerNormalization": 1})
    assert report.rules["MulOne"].fired == 0 and report.rules["AddZero"].fired == 0
    (ln,) = list(m.graph)
    assert [v.name for v in ln.inputs] == ["x", "w", "b"]


W43 = "float[4,3] w = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}"


def test_scale_into_matmul_weight():
    m = parse(
        f"g (float[2,4] x) => (float[2,3] y) <{W43}> "
        "{ s = Constant<value=float {0.25}>()  p = MatMul(x, w)  y = Mul(p, s) }"
    )
    fire(m, "ScaleIntoMatMulWeight", {"Constant": 1, "MatMul": 1}, "arith_scale_into_matmul")
    (const,) = [n for n in m.graph if n.op_type == "Constant"]
    assert const.attributes["value"].as_tensor().numpy()[0].tolist() == [0.25, 0.5, 0.75]


def test_scale_into_matmul_weight_and_bias_scale_first_per_column():
    m = parse(
        f"g (float[2,5,4] x) => (float[2,5,3] y) <{W43}, float[3] b = {{1, -1, 2}}, "
        "float[1,3] s = {0.5, 2, -1}> { p = MatMul(x, w)  q = Add(b, p)  y = Mul(s, q) }"
    )
    fire(m, "ScaleIntoMatMulWeight", {"Add": 1, "Constant": 2, "MatMul": 1})
    (add,) = [n for n in m.graph if n.op_type == "Add"]
    assert add.inputs[1].const_value.numpy().tolist() == [[0.5, -2.0, -2.0]]  # b · s: [1, 3]


def test_scale_of_a_shared_weight_kept():
    m = parse(
        f"g (float[2,4] x) => (float[2,3] y, float[2,3] z) <{W43}> "
        "{ s = Constant<value=float {0.25}>()  p = MatMul(x, w)  y = Mul(p, s)  z = MatMul(x, w) }"
    )
    no_fire(m, "ScaleIntoMatMulWeight", "the weight has other uses (folding would duplicate it)")


def test_computed_scale_kept():
    m = parse(
        f"g (float[2,4] x, float s) => (float[2,3] y) <{W43}> {{ p = MatMul(x, w)  y = Mul(p, s) }}"
    )
    no_fire(m, "ScaleIntoMatMulWeight", "the scale is not a constant")


def test_per_row_scale_kept():
    m = parse(
        f"g (float[2,4] x) => (float[2,3] y) <{W43}, float[2,1] s = {{2, 3}}> "
        "{ p = MatMul(x, w)  y = Mul(p, s) }"
    )
    no_fire(m, "ScaleIntoMatMulWeight", "the scale (shape [2, 1]) does not scale whole columns")


def test_computed_weight_kept():
    m = parse(
        "g (float[2,4] x, float[4,3] w) => (float[2,3] y) "
        "{ s = Constant<value=float {0.25}>()  p = MatMul(x, w)  y = Mul(p, s) }"
    )
    no_fire(m, "ScaleIntoMatMulWeight", "the MatMul weight is not a constant")


def test_integer_weight_kept():
    m = parse(
        "g (int64[2,2] x) => (int64[2,2] y) <int64[2,2] w = {1, 2, 3, 4}, int64 s = {3}> "
        "{ p = MatMul(x, w)  y = Mul(p, s) }"
    )
    no_fire(m, "ScaleIntoMatMulWeight", "the weight is not a rank-2 float tensor (int64, rank 2)")


def test_rank2_scale_of_a_vector_product_kept():
    # x @ W is [3] here; times a [1, 3] scale it is [1, 3]: folding would drop that dimension.
    m = parse(
        f"g (float[4] x) => (float[1,3] y) <{W43}, float[1,3] s = {{2, 2, 2}}> "
        "{ p = MatMul(x, w)  y = Mul(p, s) }"
    )
    no_fire(
        m,
        "ScaleIntoMatMulWeight",
        "the rank-2 scale may add a dimension to the product (x's rank < 2 or unknown)",
    )


def test_integer_add_then_sub_of_one_constant_cancels():
    m = parse(
        "g (int64[b] x) => (int64[b, 1] y) {\n"
        "  k = Constant<value=int64 {3}>()  k2 = Constant<value=int64 {3}>()\n"
        "  one = Constant<value=int64[1] {1}>()  t = Add(x, k)  u = Unsqueeze(t, one)\n"
        "  v = Sub(u, k2)  y = Neg(v)\n}"
    )
    fire(m, "IntegerAddSub", {"Constant": 1, "Neg": 1, "Unsqueeze": 1})


def test_float_add_then_sub_is_kept():
    m = parse(
        "g (float[2] x) => (float[2] y) {\n"
        "  k = Constant<value=float {3}>()  t = Add(x, k)  v = Sub(t, k)  y = Neg(v)\n}"
    )
    no_fire(m, "IntegerAddSub", "not an integer (rounding would not cancel)")
