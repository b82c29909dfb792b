"""Structural keys of bodies and regions (irkit.hierarchy._dedupe), and scope frames."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from irkit import metadata as md
from irkit.hierarchy._dedupe import canonical_key, region_key, remember_entries

F32 = ir.DataType.FLOAT


def _value(name: str, shape: tuple[int, ...] = (2, 3), dtype: ir.DataType = F32) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(list(shape)))


def _typed(node: ir.Node, shape: tuple[int, ...] = (2, 3)) -> ir.Node:
    for out in node.outputs:
        out.type, out.shape = ir.TensorType(F32), ir.Shape(list(shape))
    return node


def _region(tag: str, scale: np.ndarray | None = None):
    """``outside → [Constant, Mul, Relu, Add] → consumer``: a region of 4 nodes between an
    outside producer and an outside consumer; ``w`` is read twice, ``x`` once."""
    x, w = _value(f"{tag}x"), _value(f"{tag}w")
    scale = np.full((2, 3), 2.0, np.float32) if scale is None else scale
    const = _typed(ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(scale))]))
    mul = _typed(ir.Node("", "Mul", [x, const.outputs[0]], name=f"{tag}mul"))
    relu = _typed(ir.Node("", "Relu", [mul.outputs[0]]))
    add = _typed(ir.Node("", "Add", [relu.outputs[0], w]))
    sub = _typed(ir.Node("", "Sub", [add.outputs[0], w]))  # (inside too: reads w again)
    after = _typed(ir.Node("", "Neg", [sub.outputs[0]]))  # outside consumer
    side = _typed(ir.Node("", "Abs", [relu.outputs[0]]))  # outside consumer of an inner value
    body = [const, mul, relu, add, sub]
    return x, w, body, after, side


def test_region_key_finds_the_boundary_in_first_use_order():
    x, w, body, after, side = _region("a")
    key, inputs, input_uses, outputs = region_key(body, set(body), [0] * len(body))
    assert inputs == [x, w]
    assert input_uses == [(body[1], 0), (body[3], 1), (body[4], 1)]
    assert outputs == [body[2].outputs[0], body[4].outputs[0]]  # used by Abs, by Neg
    assert key[0] == ((F32, (2, 3)), (F32, (2, 3)))  # input types close over the boundary
    assert key[-1] == (2, 4)  # output numbers: Relu's and Sub's
    assert [entry[1] for entry in key[1:-1]] == ["Constant", "Mul", "Relu", "Add", "Sub"]
    assert [entry[5] for entry in key[1:-1]] == [(), (-2, 0), (1,), (2, -3), (3, -3)]


def test_region_keys_ignore_names_and_see_content_types_and_labels():
    _, _, body_a, _, _ = _region("a")
    _, _, body_b, _, _ = _region("b")
    labels = [0, 0, 1, 1, 1]
    key_a = region_key(body_a, set(body_a), labels)[0]
    assert key_a == region_key(body_b, set(body_b), labels)[0]
    assert hash(key_a) == hash(region_key(body_b, set(body_b), labels)[0])
    assert key_a != region_key(body_b, set(body_b), [0, 0, 1, 1, 2])[0]  # other scopes

    changed = np.full((2, 3), 2.0, np.float32)
    changed[1, 2] = 2.5  # one element of the constant
    _, _, body_c, _, _ = _region("c", changed)
    assert key_a != region_key(body_c, set(body_c), labels)[0]

    same_bytes = np.full((2, 3), 2.0, np.float32).view(np.int32)  # same bytes, other dtype
    _, _, body_d, _, _ = _region("d", same_bytes)
    assert key_a != region_key(body_d, set(body_d), labels)[0]


def test_large_tensor_attributes_are_keyed_by_digest():
    big = np.arange(1000, dtype=np.float32).reshape(1000)
    other = big.copy()
    other[-1] = -1.0
    keys = []
    for array in (big, big.copy(), other):
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(array))])
        keys.append(canonical_key([], [node], node.outputs))
    assert keys[0] == keys[1] != keys[2]
    content = keys[0][1][3][0][2][2]  # entry → attributes → ("value", kind, (dtype, dims, …))
    assert isinstance(content, bytes) and len(content) == 20  # SHA-1, not 4000 bytes


def test_remembered_entries_give_the_same_keys_as_fresh_ones():
    x, w, body, _, _ = _region("a")
    flat = region_key(body, set(body), [7] * len(body))[0]
    memo: dict[ir.Node, tuple[object, ...]] = {}
    remember_entries(flat, body, memo)
    inner = body[1:3]  # Mul, Relu
    fresh = canonical_key([x, body[0].outputs[0]], inner, [inner[-1].outputs[0]])
    cached = canonical_key([x, body[0].outputs[0]], inner, [inner[-1].outputs[0]], memo=memo)
    assert cached == fresh
    assert set(memo) == set(body)


def test_remember_entries_rejects_a_key_of_other_nodes():
    _, _, body, _, _ = _region("a")
    flat = region_key(body, set(body), [0] * len(body))[0]
    with pytest.raises(ValueError):
        remember_entries(flat, body[:2], {})


def test_frames_hash_compare_and_sort_as_tuples():
    a0, a1 = md.Frame("a", 0, "m.A"), md.Frame("a", 1, "m.A")
    assert sorted([a1, md.Frame("b", 0, "m.B"), a0]) == [a0, a1, md.Frame("b", 0, "m.B")]
    assert {(a0,): 1}[(md.Frame("a", 0, "m.A"),)] == 1  # scopes key dicts by value
    assert a1.call_id == "a@1" and a0.class_name == "A"
    assert md.decode_scope(md.encode_scope((a0, a1))) == (a0, a1)
    with pytest.raises(AttributeError):
        a0.path = "b"  # type: ignore[misc]
