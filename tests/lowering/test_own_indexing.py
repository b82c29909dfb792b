"""irkit's own lowerings of take, put, index_reduce, nonzero (of a scalar), nonzero_static and
empty_permuted, circular pad, unique_consecutive, bool scatter_reduce amax/amin
(``irkit/lowering/_own_indexing.py``) and searchsorted with a sorter
(``_own_ordering.py``): onnxruntime numbers against eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import irkit
from tests import helpers


class Take(torch.nn.Module):
    def forward(self, x, index):
        return torch.take(x, index)


class Put(torch.nn.Module):
    def __init__(self, accumulate: bool):
        super().__init__()
        self.accumulate = accumulate

    def forward(self, x, index, source):
        return torch.put(x, index, source, accumulate=self.accumulate)


class NonzeroStatic(torch.nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, x):
        return torch.nonzero_static(x, size=self.size, fill_value=-7)


def _check(module, *args):
    model = irkit.lower(torch.export.export(module, args))
    actual = helpers.run_ort(model, [a.numpy() for a in args])
    expected = helpers.flatten_outputs(module(*args))
    assert [a.shape for a in actual] == [e.shape for e in expected]
    helpers.assert_close(actual, expected, 0.0)
    return model


def test_take_with_negative_indices():
    x = torch.arange(12.0).reshape(3, 4)
    _check(Take(), x, torch.tensor([[0, -1], [5, -12]]))


@pytest.mark.parametrize("accumulate", [False, True])
def test_put(accumulate):
    x = torch.arange(12).reshape(3, 4)
    index = torch.tensor([1, -1, 4]) if not accumulate else torch.tensor([1, 1, -12])
    _check(Put(accumulate), x, index, torch.tensor([100, 200, 300]))


@pytest.mark.parametrize("size", [2, 6])  # cut and padded
def test_nonzero_static(size):
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]])
    model = _check(NonzeroStatic(size), x)
    assert helpers.op_histogram(model.graph)["NonZero"] == 1


def test_nonzero_static_of_a_scalar_has_no_coordinates():
    _check(NonzeroStatic(3), torch.tensor(2.0))


class EmptyPermuted(torch.nn.Module):
    def forward(self, x):
        e = torch.empty_permuted((2, 3, 4), (0, 2, 1), dtype=torch.int64)
        return x + e.shape[1], e.fill_(5)


def test_empty_permuted_has_its_shape_and_dtype():
    x = torch.ones(2)
    model = irkit.lower(torch.export.export(EmptyPermuted(), (x,)))
    out, filled = helpers.run_ort(model, [x.numpy()])
    np.testing.assert_array_equal(out, [4.0, 4.0])
    assert filled.shape == (2, 3, 4) and filled.dtype == np.int64
    assert (filled == 5).all()


class IndexReduce(torch.nn.Module):
    def __init__(self, dim: int, reduce: str, include_self: bool):
        super().__init__()
        self.dim, self.reduce, self.include_self = dim, reduce, include_self

    def forward(self, x, index, source):
        return x.index_reduce(self.dim, index, source, self.reduce, include_self=self.include_self)


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_reduce(reduce, include_self, dtype):
    x = torch.tensor([[-7, 5, 3], [2, -4, 9]], dtype=dtype)
    source = torch.tensor([[-2, 4, 1, 6], [3, -5, 8, 2]], dtype=dtype)
    index = torch.tensor([0, 0, 2, 2])  # slot 1 untouched, the others twice
    _check(IndexReduce(1, reduce, include_self), x, index, source)


class Nonzero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x)


@pytest.mark.parametrize("value", [2.5, 0.0])
def test_nonzero_of_a_scalar_has_no_coordinates(value):
    _check(Nonzero(), torch.tensor(value))


class SearchSorted(torch.nn.Module):
    def forward(self, boundaries, values, sorter):
        return torch.searchsorted(boundaries, values, sorter=sorter, right=True)


def test_searchsorted_with_a_sorter():
    boundaries = torch.tensor([[5.0, 1.0, 3.0], [2.0, 0.0, 4.0]])
    sorter = torch.argsort(boundaries, dim=-1)
    _check(SearchSorted(), boundaries, torch.tensor([[3.0, 0.5], [4.0, 9.0]]), sorter)


class PadCircular(torch.nn.Module):
    def __init__(self, pad: tuple[int, ...]):
        super().__init__()
        self.pad = pad

    def forward(self, x):
        return torch.nn.functional.pad(x, self.pad, mode="circular")


@pytest.mark.parametrize("pad", [(1, 2), (-1, 2), (2, -1), (1, 1, 2, 0), (0, -2, -1, 1)])
def test_circular_pad_wraps_after_cutting(pad):
    x = torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(2, 3, 5)
    if len(pad) == 4:  # (torch pads the last two dims of a 3-D or 4-D input)
        x = x.unsqueeze(0)
    model = _check(PadCircular(pad), x)
    assert "Pad" not in helpers.op_histogram(model.graph)


class UniqueConsecutive(torch.nn.Module):
    def __init__(self, inverse: bool, counts: bool):
        super().__init__()
        self.inverse, self.counts = inverse, counts

    def forward(self, x):
        out = torch.unique_consecutive(x, return_inverse=self.inverse, return_counts=self.counts)
        return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("inverse, counts", [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize(
    "x",
    [
        torch.tensor([[1.0, 1.0, float("nan")], [float("nan"), 2.0, 2.0]]),  # NaNs are distinct
        torch.tensor([True, True, False, True]),
    ],
    ids=["float-nan", "bool"],
)
def test_unique_consecutive(x, inverse, counts):
    module = UniqueConsecutive(inverse, counts)
    model = irkit.lower(torch.export.export(module, (x,)))
    actual = helpers.run_ort(model, [x.numpy()])
    expected = helpers.flatten_outputs(module(x))
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(a, e)


class BoolScatterExtremum(torch.nn.Module):
    def __init__(self, reduce: str, include_self: bool):
        super().__init__()
        self.reduce, self.include_self = reduce, include_self

    def forward(self, x, index, src):
        return x.scatter_reduce(1, index, src, self.reduce, include_self=self.include_self)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_scatter_reduce_extremum_of_bool(reduce, include_self):
    x = torch.tensor([[True, False, True], [False, False, True]])
    index = torch.tensor([[0, 0, 2, 2], [1, 1, 0, 2]])
    src = torch.tensor([[False, True, False, False], [True, False, True, False]])
    _check(BoolScatterExtremum(reduce, include_self), x, index, src)
