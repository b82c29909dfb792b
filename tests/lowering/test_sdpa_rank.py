"""``scaled_dot_product_attention`` of other than 4-D tensors (NesT's and Twins' ``(B, T, H, N,
D)`` blocks; 3-D ``(B, N, D)``): torchlib asserts 4-D, so the node takes torch's math
decomposition (``@torchlib_gap`` in ``irkit/lowering/_own.py``). onnxruntime vs eager,
with and without a mask, causal, at two sizes of a dynamic batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import irkit
from tests import helpers


class Attend(torch.nn.Module):
    def __init__(self, mask: bool, causal: bool):
        super().__init__()
        self.mask, self.causal = mask, causal

    def forward(self, q, k, v):
        mask = (q.sum(-1, keepdim=True) > k.sum(-1).unsqueeze(-2)) if self.mask else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)


@pytest.mark.parametrize(
    ("shape", "mask", "causal"),
    [
        pytest.param((2, 3, 2, 5, 8), False, False, marks=pytest.mark.slow),  # (B, T, H, N, D)
        ((2, 3, 2, 5, 8), True, False),
        pytest.param((2, 3, 2, 5, 8), False, True, marks=pytest.mark.slow),
        pytest.param((2, 5, 8), False, False, marks=pytest.mark.slow),  # (B, N, D)
    ],
    ids=["5d", "5d-mask", "5d-causal", "3d"],
)
def test_sdpa_of_any_rank_matches_eager(shape, mask, causal):
    torch.manual_seed(0)
    module = Attend(mask, causal)
    q, k, v = (torch.randn(shape) for _ in range(3))
    batch = torch.export.Dim("batch", min=2, max=16)
    ep = torch.export.export(module, (q, k, v), dynamic_shapes=({0: batch},) * 3)
    model = irkit.lower(ep)
    ops = helpers.op_histogram(model.graph)
    assert ops.get("Softmax") == 1 and ops.get("MatMul") == 2
    for b in (2, 5):
        inputs = [torch.randn((b, *shape[1:])) for _ in range(3)]
        (actual,) = helpers.run_ort(model, [t.numpy() for t in inputs])
        np.testing.assert_allclose(actual, module(*inputs).numpy(), atol=1e-5, rtol=1e-5)
