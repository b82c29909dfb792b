"""irkit.llm.export_causal_lm: KV-cache export of transformers causal LMs, checked in onnxruntime.

Each architecture is exported once (tiny config, random weights), lowered with the names the
helper returns, and run at a prefill (past 0) and decode steps at two past lengths; logits and
every present key/value must match eager PyTorch.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import irkit
from irkit.errors import LoweringOptionsError
from irkit.llm import causal_lm_feeds, export_causal_lm, run_eager
from tests.helpers import FP32_ATOL, assert_close, ort_session

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

LAYERS = 2


def _lm(config_name: str, model_name: str):
    torch.manual_seed(0)
    cfg = getattr(transformers, config_name)(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
    )
    return getattr(transformers, model_name)(cfg).eval()


@functools.cache
def _lowered(config_name: str, model_name: str):
    lm = _lm(config_name, model_name)
    exported = export_causal_lm(lm)
    model = irkit.lower(exported.program, **exported.lower_kwargs())
    return lm, exported, model


ARCHS = [
    pytest.param("LlamaConfig", "LlamaForCausalLM", id="llama"),
    pytest.param("Qwen2Config", "Qwen2ForCausalLM", id="qwen2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("config_name", "model_name"), ARCHS)
def test_names_and_dims(config_name, model_name):
    _, exported, model = _lowered(config_name, model_name)
    keys = [f"past_key_values.{i}.key" for i in range(LAYERS)]
    values = [f"past_key_values.{i}.value" for i in range(LAYERS)]
    assert exported.input_names == ["input_ids", "attention_mask", "position_ids", *keys, *values]
    assert [v.name for v in model.graph.inputs] == exported.input_names
    assert [v.name for v in model.graph.outputs] == exported.output_names
    assert exported.output_names[1] == "present.0.key"
    shapes = {
        v.name: [str(d) for d in v.shape] for v in (*model.graph.inputs, *model.graph.outputs)
    }
    assert shapes["input_ids"] == ["batch", "sequence"]
    assert shapes["attention_mask"] == ["batch", "total_sequence"]
    assert shapes["past_key_values.1.value"] == ["batch", "2", "past_sequence", "16"]
    assert shapes["present.0.key"] == ["batch", "2", "past_sequence + sequence", "16"]


@pytest.mark.parametrize(("config_name", "model_name"), ARCHS)
def test_numbers_prefill_and_two_past_lengths(config_name, model_name):
    lm, _, model = _lowered(config_name, model_name)
    session = ort_session(irkit.optimize(model.clone()))
    for batch, seq, past in [(2, 4, 0), (1, 1, 6), (3, 1, 17), (2, 3, 9)]:
        feeds = causal_lm_feeds(lm, batch=batch, seq=seq, past=past, seed=past)
        got = session.run(None, feeds)
        assert_close(got, run_eager(lm, feeds), atol=FP32_ATOL)


def test_bad_sizes_are_reported():
    lm = _lm("LlamaConfig", "LlamaForCausalLM")
    with pytest.raises(LoweringOptionsError, match="distinct sizes >= 2"):
        export_causal_lm(lm, batch=2, seq=2, past=5)


def test_not_a_causal_lm():
    with pytest.raises(LoweringOptionsError, match="has no `config`"):
        export_causal_lm(torch.nn.Linear(2, 2))


def test_feeds_shapes():
    lm = _lm("LlamaConfig", "LlamaForCausalLM")
    feeds = causal_lm_feeds(lm, batch=3, seq=1, past=4)
    assert feeds["position_ids"].tolist() == [[4]] * 3
    assert feeds["attention_mask"].shape == (3, 5)
    assert feeds["past_key_values.0.key"].shape == (3, 2, 4, 16)
    assert np.all(feeds["input_ids"] >= 1)
