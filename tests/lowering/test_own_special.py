"""erfinv and ndtri (irkit/lowering/_own_special.py) against torch on dense grids, tails and
edges, in onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import irkit
from tests.helpers import ort_session


class _Op(torch.nn.Module):
    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)  # type: ignore[operator]


def _run(fn: object, x: torch.Tensor) -> np.ndarray:
    session = ort_session(irkit.lower(torch.export.export(_Op(fn), (x,))))
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def _assert_matches(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=1e-30)


def test_erfinv_float32_is_within_a_few_ulps_of_torch():
    grid = torch.linspace(-1, 1, 200001)
    edges = torch.tensor([1.0, -1.0, 1.5, -2.0, 0.0, 1e-30, -1e-38, 0.99999994, -0.9999999, 0.5])
    x = torch.cat([grid, edges])
    _assert_matches(_run(torch.erfinv, x), torch.erfinv(x).numpy(), rtol=3e-7)


@pytest.mark.parametrize(
    ("x", "rtol"),
    [
        (torch.linspace(-0.999, 0.999, 1001, dtype=torch.float64), 2e-6),  # (rounded to float32)
        (torch.linspace(-1, 1, 1001, dtype=torch.float16), 1e-3),
        (torch.tensor([-2, -1, 0, 1, 2]), 0.0),
        (torch.tensor([True, False]), 0.0),
    ],
    ids=["float64", "float16", "int64", "bool"],
)
def test_erfinv_keeps_torchs_dtype(x, rtol):
    _assert_matches(_run(torch.erfinv, x), torch.erfinv(x).numpy(), rtol=rtol)


def test_ndtri_keeps_the_tails():
    # p down to 1e-30: 2p - 1 rounds to -1 in float32, 4p(1 - p) does not
    tails = torch.tensor([1e-30, 1e-20, 1e-10, 1e-5, 1 - 1e-7, 0.0, 1.0, -0.5, 1.5, 0.5])
    p = torch.cat([torch.linspace(0.0001, 0.9999, 100001), tails])
    _assert_matches(_run(torch.special.ndtri, p), torch.special.ndtri(p).numpy(), rtol=2e-6)


def test_gemma3n_activation_sparsity_cutoff():
    """Gemma 3n's ``Normal(0, 1).icdf(0.95)`` (its MLP's activation sparsity)."""

    def cutoff(h: torch.Tensor) -> torch.Tensor:
        std = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(0.95))
        return torch.relu(h - (h.mean(-1, keepdim=True) + h.std(-1, keepdim=True) * std))

    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(_run(cutoff, h), cutoff(h).numpy(), atol=1e-6)
