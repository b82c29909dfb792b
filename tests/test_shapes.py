"""``irkit._shapes``: the one home of "the dims a model does not carry".

Tables for the symbolic cases, and properties against numpy for the static ones: what
``reshape_target``, ``unsqueezed``, ``squeezed``, ``transposed`` and ``broadcast`` say is what
numpy (and so onnxruntime) computes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irkit._shapes import (
    broadcast,
    known_dims,
    known_rank,
    reshape_target,
    shape_length,
    squeezed,
    transposed,
    unsqueezed,
)

# --- reshape_target ------------------------------------------------------------------------------

RESHAPES = [
    # (input dims, target, allowzero, output dims or None: invalid)
    ([2, 3, 4], [6, 4], 0, (6, 4)),
    ([2, 3, 4], [0, -1], 0, (2, 12)),
    ([2, 3, 4], [-1], 0, (24,)),
    ([2, 3, 4], [0, 0, 0], 0, (2, 3, 4)),
    ([2, 3, 4], [5, -1], 0, None),  # 24 elements do not divide by 5
    ([2, 3, 4], [5, 5], 0, None),  # 24 elements do not fill 25
    ([2, 3, 4], [-1, -1], 0, None),  # two -1
    ([2, 3, 4], [2, -2, 12], 0, None),  # below -1
    ([2, 3], [0, 0, 0], 0, None),  # a 0 past the input's rank
    ([2, 0, 3], [0, -1], 0, (2, 0)),  # (as numpy)
    ([2, 0, 3], [0, 0, -1], 1, None),  # allowzero: 0 elements, -1 undetermined
    ([2, 3, 4], [0, 0, 0], 1, None),  # allowzero: 0 is a size, and 24 != 0
    ([0, 3], [0, 3], 1, (0, 3)),
    (["B", "S", 64], [0, 0, 4, -1], 0, ("B", "S", 4, 16)),
    (["B", "S", 64], [0, -1, 64], 0, ("B", "S", 64)),  # the symbol is what is left
    (["B", 12], [-1, 3, 4], 0, ("B", 3, 4)),
    (["B", "S", 8], [-1, 8], 0, (None, 8)),  # B·S is not one dim
    (["B", 8], [2, -1], 0, (2, None)),  # B/2 is not a dim
    (["B", 8], [0, 2, -1], 0, ("B", 2, 4)),
    ([None, 8], [0, -1], 0, (None, 8)),  # unknown dims copy as unknown, -1 undetermined
    ([None, 8], [-1, 8], 0, (None, 8)),
    (["B", 4], [3, 5], 0, (3, 5)),  # symbolic: the count cannot be checked
]


@pytest.mark.parametrize(("dims", "target", "allowzero", "expected"), RESHAPES)
def test_reshape_target(dims, target, allowzero, expected):
    assert reshape_target(dims, target, allowzero) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=0, max_size=4),
    st.data(),
)
def test_reshape_target_agrees_with_numpy(dims, data):
    """For static dims: a valid target gives numpy's shape; an invalid one gives ``None``."""
    rank = data.draw(st.integers(0, 4))
    target = data.draw(st.lists(st.integers(-2, 6), min_size=rank, max_size=rank))
    array = np.zeros(dims)
    onnx_target = [dims[i] if t == 0 and i < len(dims) else t for i, t in enumerate(target)]
    valid = not any(t == 0 and i >= len(dims) for i, t in enumerate(target))
    try:
        expected = array.reshape(onnx_target).shape if valid and -2 not in target else None
    except ValueError:  # (two -1, or the elements do not fit)
        expected = None
    assert reshape_target(dims, target) == expected


# --- unsqueezed, squeezed, transposed -----------------------------------------------------------

UNSQUEEZES = [
    ([2, 3], [0], (1, 2, 3)),
    ([2, 3], [-1], (2, 3, 1)),
    ([2, 3], [1, 3], (2, 1, 3, 1)),
    ([2, 3], [3, 1], (2, 1, 3, 1)),
    (["B", 8], [0, -1], (1, "B", 8, 1)),
    ([], [0, 1], (1, 1)),
    ([2, 3], [4], None),  # out of range: the output has rank 3
    ([2, 3], [-4], None),
    ([2, 3], [1, -3], None),  # both name position 1
]


@pytest.mark.parametrize(("dims", "axes", "expected"), UNSQUEEZES)
def test_unsqueezed(dims, axes, expected):
    assert unsqueezed(dims, axes) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4), max_size=4), st.data())
def test_unsqueezed_agrees_with_numpy(dims, data):
    rank = len(dims) + data.draw(st.integers(1, 3))
    count = rank - len(dims)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=count, max_size=count))
    try:
        expected = np.expand_dims(np.zeros(dims), axes).shape
    except ValueError:  # repeated axis
        expected = None
    assert unsqueezed(dims, axes) == expected


SQUEEZES = [
    ([1, 3, 1], [0], (3, 1)),
    ([1, 3, 1], [-1, 0], (3,)),
    ([1, 3, 1], None, (3,)),
    (["B", 1, 8], [1], ("B", 8)),
    ([None, 8], [0], (8,)),  # an unknown dim squeezed: a valid model says it is 1
    ([2, 3], [0], None),  # not 1
    ([1, 3], [2], None),  # out of range
    ([1, 3], [0, -2], None),  # repeated
    (["B", 3], None, None),  # which dims are 1 is not known
]


@pytest.mark.parametrize(("dims", "axes", "expected"), SQUEEZES)
def test_squeezed(dims, axes, expected):
    assert squeezed(dims, axes) == expected


TRANSPOSES = [
    ([2, 3, 4], [0, 2, 1], (2, 4, 3)),
    (["B", 3, 4], None, (4, 3, "B")),
    ([2, 3], [0, 0], None),
    ([2, 3], [0, 1, 2], None),
]


@pytest.mark.parametrize(("dims", "perm", "expected"), TRANSPOSES)
def test_transposed(dims, perm, expected):
    assert transposed(dims, perm) == expected


BROADCASTS = [
    ([(2, 1, 4), (3, 1)], (2, 3, 4)),
    ([("B", 1, 8), (4, 1)], ("B", 4, 8)),
    ([("B", 8), ("B", 8)], ("B", 8)),
    ([("B", 8), ("S", 8)], (None, 8)),  # two symbols: not settled
    ([(2, 3), (None,)], (2, None)),
    ([(1,), ()], (1,)),
    ([(2, 3), None], None),
    ([], None),
]


@pytest.mark.parametrize(("shapes", "expected"), BROADCASTS)
def test_broadcast(shapes, expected):
    assert broadcast(shapes) == expected


# --- known_dims: through the producers ----------------------------------------------------------


def _const(values: list[int]) -> ir.Value:
    return ir.Value(name=f"c{values}", const_value=ir.tensor(values, dtype=ir.DataType.INT64))


def _out(op_type: str, inputs: list[ir.Value | None], **attributes: object) -> ir.Value:
    return ir.node(op_type, inputs, attributes).outputs[0]


X = ir.val("x", ir.DataType.FLOAT, ["B", "S", 64])
KNOWN = [
    ("its own shape", X, ("B", "S", 64)),
    ("Reshape with 0 and -1", _out("Reshape", [X, _const([0, 0, 4, -1])]), ("B", "S", 4, 16)),
    ("Reshape to positive dims", _out("Reshape", [ir.Value(name="u"), _const([2, 8])]), (2, 8)),
    ("Reshape to a computed shape", _out("Reshape", [X, ir.Value(name="s")]), None),
    ("Expand", _out("Expand", [X, _const([3, 1, 1, 1])]), (3, "B", "S", 64)),
    ("Unsqueeze (input axes)", _out("Unsqueeze", [X, _const([1])]), ("B", 1, "S", 64)),
    ("Unsqueeze (attribute)", _out("Unsqueeze", [X], axes=[0]), (1, "B", "S", 64)),
    ("Transpose", _out("Transpose", [X], perm=[0, 2, 1]), ("B", 64, "S")),
    ("broadcast", _out("Add", [X, ir.val("b", ir.DataType.FLOAT, [64])]), ("B", "S", 64)),
    ("elementwise", _out("Relu", [_out("Transpose", [X], perm=[2, 1, 0])]), (64, "S", "B")),
    ("unknown op", _out("TopK", [X, _const([2])]), None),
    ("no producer", ir.Value(name="free"), None),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in KNOWN], ids=[c[0] for c in KNOWN])
def test_known_dims(value, expected):
    assert known_dims(value) == expected


def test_known_dims_squeezes_and_stops_at_its_depth():
    squeezed_value = _out("Squeeze", [_out("Unsqueeze", [X, _const([1])]), _const([1])])
    assert known_dims(squeezed_value) == ("B", "S", 64)
    chain = X
    for _ in range(10):
        chain = _out("Relu", [chain])
    assert known_dims(chain) is None and known_dims(chain, depth=10) == ("B", "S", 64)


# --- known_rank and shape_length: the rank where only a computed target shape says it -----------

_SHAPE = _out("Shape", [X])
_HEADS = _out("Shape", [X], start=1, end=2)
RANKS = [
    ("its dims", X, 3),
    ("Reshape to Shape(x)", _out("Reshape", [ir.Value(name="u"), _SHAPE]), 3),
    (
        "Reshape to Concat(Shape(x), Shape(x)[1:2], [-1])",
        _out(
            "Reshape", [ir.Value(name="u"), _out("Concat", [_SHAPE, _HEADS, _const([-1])], axis=0)]
        ),
        5,
    ),
    ("Expand of a known rank", _out("Expand", [X, _out("Shape", [X], start=-2)]), 3),
    ("Expand of an unknown rank", _out("Expand", [ir.Value(name="u"), _SHAPE]), None),
    ("Reshape to a free value", _out("Reshape", [X, ir.Value(name="s")]), None),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in RANKS], ids=[c[0] for c in RANKS])
def test_known_rank(value, expected):
    assert known_rank(value) == expected


@pytest.mark.parametrize(
    ("start", "end", "expected"), [(0, None, 3), (1, 2, 1), (-2, None, 2), (2, 1, 0), (-9, 9, 3)]
)
def test_shape_length_of_a_shape_slice_is_numpy_s(start, end, expected):
    attributes = {"start": start} if end is None else {"start": start, "end": end}
    assert shape_length(_out("Shape", [X], **attributes)) == expected
    assert expected == len(np.zeros((2, 3, 4)).shape[start:end])
