"""``topk`` (torchlib's ``TopK``) against eager, with and without ties.

MoE routers pick experts with ``topk``. Without ties the lowered indices are torch's. With ties
torch's CPU kernel leaves the order to ``std::nth_element``/``partial_sort`` (no documented
rule; a zero-initialized router such as afmoe's ties every expert), while ONNX ``TopK`` takes
the lower index first: the values agree, and the indices are a valid top-k — the lowest ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import irkit
from tests import helpers


class TopK(torch.nn.Module):
    def __init__(self, k: int, dim: int = -1, largest: bool = True):
        super().__init__()
        self.k, self.dim, self.largest = k, dim, largest

    def forward(self, x):
        return torch.topk(x, self.k, dim=self.dim, largest=self.largest)


def _lowered(module: torch.nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    return helpers.run_ort(irkit.lower(torch.export.export(module, (x,))), [x.numpy()])


@pytest.mark.parametrize(("k", "dim", "largest"), [(6, -1, True), (2, 0, False), (1, 1, True)])
def test_distinct_values_give_torchs_indices(k, dim, largest):
    x = torch.randn(5, 64)
    module = TopK(k, dim, largest)
    values, indices = _lowered(module, x)
    expected = module(x)
    np.testing.assert_array_equal(values, expected.values.numpy())
    np.testing.assert_array_equal(indices, expected.indices.numpy())


def test_ties_give_torchs_values_and_the_lowest_indices():
    # sigmoid(0) for every expert, as afmoe's zero-initialized router scores them; one row
    # with ties only among some values
    x = torch.full((3, 64), 0.5)
    x[2, 10:20] = 0.75
    values, indices = _lowered(TopK(6), x)
    expected = torch.topk(x, 6)
    np.testing.assert_array_equal(values, expected.values.numpy())
    # a valid top-k: the values at the indices are the top values …
    np.testing.assert_array_equal(np.take_along_axis(x.numpy(), indices, 1), values)
    # … and among equal values the lower index comes first (ONNX TopK), as a stable sort gives
    stable = np.argsort(-x.numpy(), axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(indices, stable)
