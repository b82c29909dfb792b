"""PackedMatMul (Q/K/V, gate/up): fire (onnxruntime numbers on random shapes, fp32 and fp16,
each weight copied once) and decline (the reason, visible in ``explain``)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rules.ort.support import TYPES, fire, no_fire, parse, rewrite


def _qkv(t: str, b: int, s: int, k: int, sizes: list[int], transposed: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    outs = ", ".join(f"{t}[{b},{s},{n}] y{i}" for i, n in enumerate(sizes))
    if transposed:
        body = "  ".join(
            f"wt{i} = Transpose<perm=[1,0]>(w{i})  y{i} = MatMul(x, wt{i})"
            for i in range(len(sizes))
        )
    else:
        body = "  ".join(f"y{i} = MatMul(x, w{i})" for i in range(len(sizes)))
    m = parse(f"g ({t}[{b},{s},{k}] x) => ({outs}) {{ {body} }}")
    for i, n in enumerate(sizes):
        shape = (n, k) if transposed else (k, n)
        arr = rng.standard_normal(shape).astype(TYPES[t])
        v = ir.Value(
            name=f"w{i}",
            type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
            shape=ir.Shape(shape),
            const_value=ir.tensor(arr, name=f"w{i}"),
        )
        m.graph.register_initializer(v)
        for node in m.graph:
            for j, inp in enumerate(node.inputs):
                if inp is not None and inp.name == f"w{i}" and inp is not v:
                    node.replace_input_with(j, v)
    return m


@settings(max_examples=4, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 4),
    st.sampled_from([4, 8]),
    st.lists(st.integers(1, 8), min_size=3, max_size=4),
    st.booleans(),
    st.sampled_from(["float", "float16"]),
)
def test_packed_matmul(b, s, k, sizes, transposed, t):
    m = _qkv(t, b, s, k, sizes, transposed)
    fire(m, "PackedMatMul", {"Constant": 2, "MatMul": 1, "Split": 1}, t)


def test_packed_weight_is_the_concatenation():
    m = _qkv("float", 1, 2, 4, [3, 2, 2], transposed=True)
    weights = [m.graph.initializers[f"w{i}"].const_value.numpy() for i in range(3)]
    rewrite(m)
    matmul = next(n for n in m.graph if n.op_type == "MatMul")
    packed = matmul.inputs[1].const_value.numpy()
    np.testing.assert_array_equal(packed, np.concatenate([w.T for w in weights], axis=1))


def test_packed_declines_function_parameter_weights():
    m = parse("""g (float[2,4] x, float[4,3] w0, float[4,3] w1) => (float[2,3] y0, float[2,3] y1) {
      y0 = MatMul(x, w0)  y1 = MatMul(x, w1) }""")
    no_fire(m, "PackedMatMul", "weight 'w1' is not a constant (a function input?)")


def test_packed_reads_a_lazy_weight():  # (weightless ones: tests/test_weights_derived.py)
    m = _qkv("float", 1, 2, 4, [3, 3, 2], transposed=False)
    w = m.graph.initializers["w1"]
    data = w.const_value.numpy()
    w.const_value = ir.LazyTensor(lambda: ir.tensor(data), dtype=w.dtype, shape=w.shape)
    w0, w2 = (m.graph.initializers[n].const_value.numpy() for n in ("w0", "w2"))
    rewrite(m)
    matmul = next(n for n in m.graph if n.op_type == "MatMul")
    packed = matmul.inputs[1].const_value.numpy()
    np.testing.assert_array_equal(packed, np.concatenate([w0, data, w2], axis=1))


def test_packed_declines_two_products():  # (gate/up: two kernels either way, plus the copy)
    m = _qkv("float", 1, 2, 4, [3, 3], transposed=False)
    no_fire(
        m,
        "PackedMatMul",
        "2 products of the same input: packing fewer than 3 saves no kernel and adds the "
        "Split's copy",
    )


def test_packed_declines_single_product():
    m = _qkv("float", 1, 2, 4, [3], transposed=False)
    no_fire(m, "PackedMatMul", "no other product of the same input with a constant weight")


@pytest.mark.parametrize("t", ["float", "float16"])
def test_packed_matmul_with_biases(t):
    m = _qkv(t, 2, 3, 8, [4, 2, 2], transposed=True)
    rng = np.random.default_rng(3)
    for i, out in enumerate(list(m.graph.outputs)):
        n = out.shape[-1]
        bias = ir.Value(
            name=f"b{i}",
            type=out.type,
            shape=ir.Shape([n]),
            const_value=ir.tensor(rng.standard_normal(n).astype(TYPES[t]), name=f"b{i}"),
        )
        m.graph.register_initializer(bias)
        add = ir.Node("", "Add", [out, bias])
        add.outputs[0].type, add.outputs[0].shape = out.type, out.shape
        m.graph.append(add)
        m.graph.outputs[i] = add.outputs[0]
        add.outputs[0].name, out.name = f"z{i}", f"y{i}"
    fire(m, "PackedMatMul", {"Add": 1, "Constant": 3, "MatMul": 1, "Split": 1}, t)


def _attention_and_more(others: list[int], bias: bool):
    """x read by q, k, v (into GroupQueryAttention: 2 query heads, 1 key/value head of 16) and by
    ``others`` more products, each output a graph output."""
    t, heads, h, s, k = "float", 2, 16, 3, 32
    sizes = [heads * h, h, h, *others]
    m = _qkv(t, 1, s, k, sizes, transposed=False)
    y = [m.graph.outputs[i] for i in range(len(sizes))]
    if bias:  # x @ Wᵢ + bᵢ: the biases are packed too, and cut with the weights
        rng = np.random.default_rng(5)
        for i, out in enumerate(list(y)):
            b = ir.Value(
                name=f"b{i}",
                type=out.type,
                shape=ir.Shape([sizes[i]]),
                const_value=ir.tensor(
                    rng.standard_normal(sizes[i]).astype(np.float32), name=f"b{i}"
                ),
            )
            m.graph.register_initializer(b)
            add = ir.Node("", "Add", [out, b])
            add.outputs[0].type, add.outputs[0].shape = out.type, out.shape
            m.graph.append(add)
            y[i] = add.outputs[0]
    past = [
        ir.Value(name=n, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 1, 0, h]))
        for n in ("past_key", "past_value")
    ]
    lengths = [
        ir.Value(name="seqlens_k", type=ir.TensorType(ir.DataType.INT32), shape=ir.Shape([1])),
        ir.Value(name="total", type=ir.TensorType(ir.DataType.INT32), shape=ir.Shape([])),
    ]
    m.graph.inputs.extend([*past, *lengths])
    gqa = ir.Node(
        "com.microsoft",
        "GroupQueryAttention",
        [*y[:3], *past, *lengths],
        attributes=[ir.AttrInt64("num_heads", heads), ir.AttrInt64("kv_num_heads", 1)],
        num_outputs=3,
    )
    m.graph.append(gqa)
    gqa.outputs[0].type, gqa.outputs[0].shape = y[0].type, y[0].shape
    m.graph.outputs.clear()
    m.graph.outputs.extend([gqa.outputs[0], *y[3:]])
    for i, value in enumerate(m.graph.outputs):
        value.name = value.name if value.name else f"out{i}"
    inputs = {
        "x": np.random.default_rng(0).standard_normal((1, s, k)).astype(np.float32),
        "past_key": np.zeros((1, 1, 0, h), np.float32),
        "past_value": np.zeros((1, 1, 0, h), np.float32),
        "seqlens_k": np.array([s - 1], np.int32),
        "total": np.array(s, np.int32),
    }
    return m, inputs


@pytest.mark.parametrize(
    ("others", "bias", "kernels"),
    [
        # phi's fc1: the rest one product
        ([48], False, {"MatMul": 2, "Split": 0}),
        ([48], True, {"MatMul": 2, "Split": 0}),
        # two more (Cohere's gate and up): a product each, never packed as two
        ([24, 24], False, {"MatMul": 3, "Split": 0}),
        # three more: still one pack, its Split on the rest only
        ([8, 8, 16], False, {"MatMul": 2, "Split": 1}),
    ],
)
def test_wider_pack_is_cut_so_the_attention_reads_its_part_whole(others, bias, kernels):
    from tests.helpers import run_ort
    from tests.rules.ort.support import clone

    m, inputs = _attention_and_more(others, bias)
    before = clone(m)
    report = rewrite(m)
    assert report.fired.get("PackedMatMul") == 1, str(report)
    assert report.fired.get("PackedQKVAttentionOfWiderPack") == 1, str(report)
    (gqa,) = [n for n in m.graph if n.op_type == "GroupQueryAttention"]
    assert gqa.inputs[1] is None and gqa.inputs[2] is None  # the packed [Q | K | V] whole
    assert gqa.inputs[0].producer().op_type == ("Add" if bias else "MatMul")
    counts = {op: sum(1 for n in m.graph if n.op_type == op) for op in kernels}
    assert counts == kernels
    for got, want in zip(run_ort(m, inputs), run_ort(before, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_wider_pack_is_kept_where_q_has_another_reader():
    from tests.rules.ort.support import clone

    m, _ = _attention_and_more([48], False)
    (gqa,) = [n for n in m.graph if n.op_type == "GroupQueryAttention"]
    m.graph.outputs.append(gqa.inputs[0])  # (q read outside the attention too)
    report = rewrite(clone(m), explain="PackedQKVAttentionOfWiderPack")
    stats = report.rules["PackedQKVAttentionOfWiderPack"]
    assert stats.fired == 0 and "Q, K or V is read by more than the attention" in str(
        dict(stats.failures)
    )


def _packed_pair(t: str, sizes: list[int], transposed: bool, split: str, bias: bool = False):
    """x @ W (+ b) of a constant ``W`` packing ``sizes`` columns, split in two on the last axis
    (``split``: by a sizes input or ``num_outputs``), both halves graph outputs."""
    b, s, k = 2, 3, 8
    m = _qkv(t, b, s, k, [sum(sizes)], transposed)
    product = m.graph.outputs[0]
    m.graph.outputs.clear()
    y = product
    if bias:
        rng = np.random.default_rng(7)
        data = rng.standard_normal(sum(sizes)).astype(TYPES[t])
        value = ir.Value(
            name="b", type=product.type, shape=ir.Shape([sum(sizes)]), const_value=ir.tensor(data)
        )
        m.graph.register_initializer(value)
        add = ir.Node("", "Add", [product, value])
        add.outputs[0].type, add.outputs[0].shape = product.type, product.shape
        m.graph.append(add)
        y = add.outputs[0]
    if split == "sizes":
        counts = ir.Value(
            name="sizes",
            type=ir.TensorType(ir.DataType.INT64),
            shape=ir.Shape([2]),
            const_value=ir.tensor(np.array(sizes, dtype=np.int64)),
        )
        m.graph.register_initializer(counts)
        node = ir.Node("", "Split", [y, counts], [ir.AttrInt64("axis", -1)], num_outputs=2)
    else:
        attrs = [ir.AttrInt64("axis", 2), ir.AttrInt64("num_outputs", 2)]
        node = ir.Node("", "Split", [y], attrs, num_outputs=2)
    m.graph.append(node)
    for i, (out, n) in enumerate(zip(node.outputs, sizes, strict=True)):
        out.name, out.type, out.shape = f"half{i}", product.type, ir.Shape([b, s, n])
        m.graph.outputs.append(out)
    return m


@pytest.mark.parametrize(
    ("sizes", "transposed", "split", "t"),
    [
        ([6, 6], True, "num_outputs", "float"),  # (phi3's gate_up_proj.chunk(2, -1))
        ([5, 3], False, "sizes", "float"),
        ([4, 4], True, "sizes", "float16"),
    ],
)
def test_a_packed_pair_is_two_products(sizes, transposed, split, t):
    m = _packed_pair(t, sizes, transposed, split)
    fire(m, "UnpackedMatMulPair", {"Constant": 2, "MatMul": 2}, t)
    halves = [n.inputs[1].const_value.numpy().shape for n in m.graph if n.op_type == "MatMul"]
    assert halves == [(8, sizes[0]), (8, sizes[1])]


def test_a_packed_pair_with_its_bias_is_two_biased_products():
    m = _packed_pair("float", [6, 6], True, "num_outputs", bias=True)
    fire(m, "UnpackedMatMulPair", {"Add": 2, "Constant": 4, "MatMul": 2})


def test_a_split_into_three_stays_packed():
    m = _qkv("float", 1, 2, 4, [6], transposed=False)
    y = m.graph.outputs.pop()
    m.graph.append(ir.Node("", "Split", [y], [ir.AttrInt64("axis", -1)], num_outputs=3))
    split = m.graph[-1]
    split.attributes["num_outputs"] = ir.AttrInt64("num_outputs", 3)
    for i, out in enumerate(split.outputs):
        out.name, out.type, out.shape = f"p{i}", y.type, ir.Shape([1, 2, 2])
        m.graph.outputs.append(out)
    no_fire(m, "UnpackedMatMulPair", "a Split into 3: three or more stay packed (PackedMatMul)")


def test_a_pair_whose_product_is_read_elsewhere_stays_packed():
    m = _packed_pair("float", [6, 6], False, "sizes")
    product = next(n for n in m.graph if n.op_type == "MatMul").outputs[0]
    product.name = "whole"
    m.graph.outputs.append(product)
    no_fire(
        m,
        "UnpackedMatMulPair",
        "the split value is not a node's output read only by the Split",
    )
