"""Pooling (``irkit/lowering/_own_pool.py``), ``LSTM`` with a projection (``_own_rnn.py``) and
``cross_entropy`` with label smoothing or no batch dim (torch's decomposition, ``_registry.py``):
values and indices equal eager PyTorch's, ties resolved as torch does (the first maximum in
row-major order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import irkit
from tests import helpers

nn = torch.nn


def _check(module: nn.Module, *args: object, atol: float = 1e-5, dynamic=None) -> None:
    module = module.eval()
    model = irkit.lower(torch.export.export(module, args, dynamic_shapes=dynamic))
    actual = helpers.run_ort(model, [a.numpy() for a in torch.utils._pytree.tree_leaves(args)])
    expected = helpers.flatten_outputs(module(*args))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, a.shape, e.dtype, e.shape)
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol)


def _ties(*shape: int) -> torch.Tensor:
    return torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(0)).float()


@pytest.mark.parametrize(
    "module, shape",
    [
        (nn.AdaptiveMaxPool1d(3, return_indices=True), (2, 3, 7)),
        (nn.AdaptiveMaxPool2d((3, 4), return_indices=True), (2, 3, 7, 9)),
        (nn.AdaptiveMaxPool2d((3, 1), return_indices=True), (3, 7, 9)),
        (nn.AdaptiveMaxPool3d((3, 4, 2), return_indices=True), (1, 2, 7, 9, 5)),
        (nn.AdaptiveAvgPool3d((3, 4, 2)), (1, 2, 7, 9, 5)),
        (nn.AdaptiveAvgPool3d((3, 4, 2)), (1, 2, 6, 8, 4)),
    ],
    ids=["max1d", "max2d", "max2d-unbatched", "max3d", "avg3d-uneven", "avg3d-even"],
)
def test_adaptive_pooling_with_uneven_bins(module, shape):
    _check(module, _ties(*shape))


def test_fractional_max_pooling_with_random_samples():
    samples = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(1))
    module = nn.FractionalMaxPool2d(
        (2, 3), output_size=(4, 5), return_indices=True, _random_samples=samples
    )
    _check(module, _ties(2, 3, 9, 11))
    samples3 = torch.rand(2, 4, 3, generator=torch.Generator().manual_seed(2))
    module3 = nn.FractionalMaxPool3d(
        2, output_ratio=0.5, return_indices=True, _random_samples=samples3
    )
    _check(module3, _ties(4, 6, 5, 7))  # no batch dim: torch reads the first row of samples


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_avg_pool_divisor_override(ceil_mode):
    module = nn.AvgPool2d((3, 2), stride=(2, 1), padding=1, ceil_mode=ceil_mode, divisor_override=3)
    _check(module, torch.randn(2, 3, 7, 6))
    _check(nn.AvgPool3d(2, divisor_override=1, ceil_mode=ceil_mode), torch.randn(2, 2, 5, 4, 3))


@pytest.mark.slow  # seconds: torch.export of nn.LSTM
def test_lstm_with_projection_bidirectional_two_layers_and_dynamic_batch():
    torch.manual_seed(0)
    module = nn.LSTM(4, 6, num_layers=2, proj_size=3, bidirectional=True, batch_first=True)
    x = torch.randn(2, 5, 4)
    _check(module, x, dynamic=({0: torch.export.Dim("batch")},))
    h0, c0 = torch.randn(4, 3, 3), torch.randn(4, 3, 6)
    _check(
        nn.LSTM(4, 6, num_layers=2, proj_size=3, bidirectional=True, bias=False),
        torch.randn(5, 3, 4),
        (h0, c0),
    )


class CrossEntropy(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x, t):
        return nn.functional.cross_entropy(x, t, **self.kwargs)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_label_smoothing_and_no_batch_dim(reduction):
    torch.manual_seed(0)
    module = CrossEntropy(reduction=reduction, label_smoothing=0.1, weight=torch.rand(4))
    _check(module, torch.randn(8, 4), torch.randint(0, 4, (8,)))
    _check(CrossEntropy(reduction=reduction), torch.randn(4), torch.tensor(1))
