"""``scaled_dot_product_attention`` whose mask empties a query row: torch returns 0 there
(``irkit/lowering/_own_attention.py``); torchlib's lowering gave the mean of the values (a
boolean mask) or NaN (a float mask of ``-inf``). onnxruntime vs eager, 4-D, boolean masks of
shapes ``(B, 1, L, S)`` and ``(L, S)``, float masks with ``-inf`` and ``finfo.min`` rows, grouped
query heads, fp16; then the same after ``irkit.optimize`` (the rows stay 0 in the fused op);
and a left-padded tiny Llama base model at every position, both targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import irkit
from tests import helpers

B, HQ, L, S, D = 2, 4, 5, 6, 8


class Attend(torch.nn.Module):
    def __init__(self, gqa: bool = False):
        super().__init__()
        self.gqa = gqa

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.gqa)


def _mask(kind: str) -> torch.Tensor:
    """A mask with empty query rows (row 1 of batch 0; every row 3 for the 2-D mask)."""
    keep = torch.rand(B, 1, L, S) > 0.3
    keep[..., 0] = True  # every other row keeps a key
    keep[0, 0, 1] = False
    keep[:, :, 3] = keep[:, :, 3] if kind != "bool_2d" else False
    if kind == "bool_2d":
        return keep[0, 0]
    if kind == "bool":
        return keep
    fill = float("-inf") if kind == "float_inf" else torch.finfo(torch.float32).min
    return torch.zeros(B, 1, L, S).masked_fill(~keep, fill)


def _inputs(kind: str, hkv: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    torch.manual_seed(0)
    q = torch.randn(B, HQ, L, D, dtype=dtype)
    k, v = (torch.randn(B, hkv, S, D, dtype=dtype) for _ in range(2))
    mask = _mask(kind)
    return [q, k, v, mask if mask.dtype == torch.bool else mask.to(dtype)]


CASES = [
    ("bool", 4),
    ("bool_2d", 4),
    ("float_inf", 4),
    ("float_min", 4),
    ("bool", 2),  # enable_gqa
    ("float_inf", 2),
]


@pytest.mark.parametrize(("kind", "hkv"), CASES, ids=[f"{k}-h{h}" for k, h in CASES])
def test_empty_rows_match_eager(kind, hkv):
    module = Attend(gqa=hkv != HQ)
    inputs = _inputs(kind, hkv)
    expected = module(*inputs).numpy()
    assert np.isfinite(expected).all()
    if kind != "float_min":  # torch zeroes the empty rows (finfo.min: the mean, as ONNX)
        assert not expected[0, :, 1].any()
    program = torch.export.export(module, tuple(inputs))
    (actual,) = helpers.run_ort(irkit.lower(program), [t.numpy() for t in inputs])
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)

    for target in ("onnx", "ort"):  # the fused op keeps the zero rows
        fused = irkit.optimize(irkit.lower(program), target=target)
        ops = helpers.op_histogram(fused.graph)
        assert ops.get("Attention") == 1 and "Softmax" not in ops, (target, ops)  # not MHA
        (actual,) = helpers.run_ort(fused, [t.numpy() for t in inputs])
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)


def test_empty_rows_fp16():
    module = Attend()
    inputs = _inputs("bool", HQ, torch.float16)
    expected = module(*inputs).float().numpy()
    model = irkit.lower(torch.export.export(module, tuple(inputs)))
    for m in (model, irkit.optimize(model)):
        (actual,) = helpers.run_ort(m, [t.numpy() for t in inputs])
        assert not actual[0, :, 1].any()
        np.testing.assert_allclose(actual.astype(np.float32), expected, atol=2e-3, rtol=2e-3)


def test_left_padded_llama_matches_eager_at_every_position():
    # causal ∧ left padding: the padded queries see no key (torch: 0 attention there, then the
    # layer's residual path); torchlib's lowering averaged the values (max diff 1.9)
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    model = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :3] = 0
    kwargs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}
    with torch.no_grad():
        expected = model(**kwargs).last_hidden_state.numpy()
    program = torch.export.export(model, (), kwargs)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    for target in (None, "onnx", "ort"):
        lowered = irkit.lower(program)
        onnx_model = lowered if target is None else irkit.optimize(lowered, target=target)
        (actual, *_) = helpers.run_ort(onnx_model, feeds)
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)
