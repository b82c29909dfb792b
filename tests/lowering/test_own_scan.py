"""``cummax`` / ``cummin`` (``irkit/lowering/_own_scan.py``) and ``nanmedian``
(``_own_ordering.py``): values and indices equal eager PyTorch's — for the running extrema ties
take the last index and a NaN sticks (the index follows each later NaN)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import irkit
from tests import helpers

NAN = float("nan")


class Running(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        high, low = torch.cummax(x, self.dim), torch.cummin(x, self.dim)
        return high.values, high.indices, low.values, low.indices


@pytest.mark.parametrize(
    "x, dim",
    [
        (torch.tensor([[1.0, 3.0, 3.0, 2.0], [NAN, 0.0, NAN, 5.0]]), 1),
        (torch.tensor([[1.0, 3.0, 3.0, 2.0], [NAN, 0.0, NAN, 5.0]]), 0),
        (torch.tensor([[[2, 1], [1, 1], [3, 0]]]), -2),
        (torch.tensor([[True, False, True], [False, False, True]]), 1),
        (torch.tensor(4.0), 0),
    ],
    ids=["float-ties-nan", "float-dim0", "int64-3d", "bool", "scalar"],
)
def test_running_extrema_match_eager(x, dim):
    module = Running(dim)
    model = irkit.lower(torch.export.export(module, (x,)))
    actual = helpers.run_ort(model, [x.numpy()])
    expected = helpers.flatten_outputs(module(x))
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(a, e)  # (NaN equals NaN here)


class NanMedian(torch.nn.Module):
    def forward(self, x):
        rows, cols = torch.nanmedian(x, 1), torch.nanmedian(x, 0, keepdim=True)
        return torch.nanmedian(x), rows.values, rows.indices, cols.values, cols.indices


def test_nanmedian_ignores_nan_and_an_all_nan_slice_is_nan_at_index_0():
    x = torch.tensor([[NAN, NAN, 5.0], [1.0, NAN, 0.0], [3.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    model = irkit.lower(torch.export.export(NanMedian(), (x,)))
    actual = helpers.run_ort(model, [x.numpy()])
    expected = helpers.flatten_outputs(NanMedian()(x))
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(a, e)
