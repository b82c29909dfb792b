"""transformers base models (tiny configs, random weights) through lower → optimize → onnxruntime.

Each one once hit a lowering mechanism fixed with a test of its own (named per case); these pin
the whole model: ``irkit.optimize(irkit.lower(ep))`` in onnxruntime equals eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import irkit
from bench.tiny_config import tiny_config
from tests import helpers

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.slow


def _ids(vocab: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, min(vocab, 500), (2, n), generator=torch.Generator().manual_seed(seed))


def _text(config: Any) -> dict[str, Any]:
    return {"input_ids": _ids(config.vocab_size, 8), "use_cache": False}


def _speech(config: Any) -> dict[str, Any]:
    # 20 frames: two projector windows of 10, two queries each, so four audio tokens
    ids = _ids(config.text_config.vocab_size, 9)[:1]
    ids[0, 2:6] = config.audio_token_id
    features = torch.randn(1, 20, config.encoder_config.input_dim)
    return {"input_ids": ids, "input_features": features, "use_cache": False}


def _blt(config: Any) -> Any:
    for sub in (config.encoder_config, config.decoder_config):  # the shrinker's widths disagree
        sub.hidden_size_global = config.global_config.hidden_size
    return config


def _random_router(model: Any) -> None:
    # transformers zero-initializes afmoe's router: every expert ties (tests/lowering/test_topk.py)
    g = torch.Generator().manual_seed(5)
    for name, param in model.named_parameters():
        if name.endswith("router.gate.weight"):
            param.data = torch.randn(param.shape, generator=g)


CASES: dict[str, tuple[dict[str, Any], Callable[..., Any], Callable[..., Any] | None]] = {
    # mixed-dtype `|` (test_bitwise.py)
    "cpmant": ({}, _text, None),
    # Attention fused over a broadcast batch: onnxruntime refused the file (tests/rules)
    "granite_speech": ({"window_size": 10}, _speech, None),
    # integer pow and int64 sum through doubles (test_own_integer.py)
    "blt": ({}, _text, None),
    # complex rotary (test_complex.py)
    "deepseek_v2": ({}, _text, None),
    "llama4_text": ({}, _text, None),
    "afmoe": ({}, _text, _random_router),
}


@pytest.mark.parametrize("model_type", list(CASES))
def test_base_model_equals_eager(model_type):
    overrides, inputs, tweak = CASES[model_type]
    config = tiny_config(model_type, **overrides)
    if model_type == "blt":
        config = _blt(config)
        torch.distributions.Distribution.set_default_validate_args(False)  # export: no _check
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    if tweak is not None:
        tweak(model)
    kwargs = inputs(config)
    try:
        with torch.no_grad():
            expected = model(**kwargs)[0]
            ep = torch.export.export(model, (), kwargs, strict=False)
    finally:
        torch.distributions.Distribution.set_default_validate_args(True)
    lowered = irkit.optimize(irkit.lower(ep))
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    got = helpers.run_ort(lowered, tensors)[0]
    np.testing.assert_allclose(got, expected.numpy(), atol=5e-5, rtol=0)
