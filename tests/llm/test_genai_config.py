"""``genai_config.json`` as irkit writes it: every field from numbers and two JSON mappings.

Fast: no model, no export, no transformers. What genai does with such a config is checked by
tests/llm/test_genai_zoo.py and tests/llm/test_export.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from irkit.errors import LoweringOptionsError
from irkit.llm._export import _max_length
from irkit.llm._genai_config import (
    DEFAULT_MAX_LENGTH,
    GENAI_LLM_TYPES,
    Decoder,
    context_length,
    genai_config,
    genai_model_type,
    token_ids,
)

DECODER = Decoder(
    filename="model.onnx",
    num_layers=2,
    num_attention_heads=4,
    num_kv_heads=2,
    head_size=16,
    hidden_size=64,
    vocab_size=300,
    context_length=128,
    position_ids=True,
)


def _config(decoder: Decoder = DECODER, **changes):
    tokens = token_ids({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}, None)
    kwargs = {
        "model_type": "llama",
        "tokens": tokens,
        "generation": None,
        "max_length": 64,
        "input_names": ("input_ids", "attention_mask", "position_ids"),
    }
    return genai_config(decoder, **{**kwargs, **changes})


def test_eos_is_generation_configs_list_then_configs():
    ids = token_ids({"eos_token_id": [5, 9]}, {"eos_token_id": [9, 7]})
    assert ids.eos == (9, 7, 5)
    assert token_ids({"eos_token_id": 3}, None).eos == (3,)


def test_pad_is_configs_else_generation_configs_else_first_eos():
    assert token_ids({"eos_token_id": 3, "pad_token_id": 4}, {"pad_token_id": 6}).pad == 4
    assert token_ids({"eos_token_id": 3, "pad_token_id": None}, {"pad_token_id": 6}).pad == 6
    assert token_ids({"eos_token_id": [3, 8]}, {}).pad == 3
    assert token_ids({"eos_token_id": 3}, {"eos_token_id": [11, 3]}).pad == 11


def test_bos_is_configs_else_generation_configs_else_absent():
    assert token_ids({"eos_token_id": 3, "bos_token_id": 1}, {"bos_token_id": 5}).bos == 1
    assert token_ids({"eos_token_id": 3}, {"bos_token_id": 5}).bos == 5
    tokens = token_ids({"eos_token_id": 3}, None)
    assert tokens.bos is None
    model = genai_config(
        DECODER, model_type="llama", tokens=tokens, generation=None, max_length=64
    )["model"]
    assert "bos_token_id" not in model
    assert (model["eos_token_id"], model["pad_token_id"]) == ([3], 3)


def test_no_eos_is_refused_with_the_fix():
    with pytest.raises(LoweringOptionsError, match="add eos_token_id to generation_config.json"):
        token_ids({"bos_token_id": 1}, {"pad_token_id": 0})


def test_search_defaults_come_from_generation_config():
    generation = {
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "repetition_penalty": 1.1,
        "early_stopping": "never",
        "num_beams": 1,
        "max_new_tokens": 100,  # not a genai search option: left out
        "transformers_version": "5.24.0",
        "min_length": None,  # unset: genai's own default
    }
    search = _config(generation=generation)["search"]
    assert search == {
        "do_sample": True,
        "early_stopping": False,
        "max_length": 64,
        "num_beams": 1,
        "past_present_share_buffer": False,
        "repetition_penalty": 1.1,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    }


def test_decoder_section():
    model = _config()["model"]
    assert (model["type"], model["context_length"], model["vocab_size"]) == ("llama", 128, 300)
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (0, [1], 2)
    decoder = model["decoder"]
    assert decoder["filename"] == "model.onnx"
    assert (decoder["num_hidden_layers"], decoder["num_attention_heads"]) == (2, 4)
    assert (decoder["num_key_value_heads"], decoder["head_size"], decoder["hidden_size"]) == (
        2,
        16,
        64,
    )
    assert decoder["inputs"] == {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    assert decoder["outputs"] == {
        "logits": "logits",
        "present_key_names": "present.%d.key",
        "present_value_names": "present.%d.value",
    }


def test_models_without_position_ids_map_none():
    decoder = dataclasses.replace(DECODER, position_ids=False)  # ALiBi: bloom, mpt
    inputs = _config(decoder=decoder)["model"]["decoder"]["inputs"]
    assert "position_ids" not in inputs


def test_share_buffer_is_written_as_asked():
    assert _config()["search"]["past_present_share_buffer"] is False
    assert _config(share_buffer=True)["search"]["past_present_share_buffer"] is True


def test_model_type_is_genais_only_where_it_lists_it():
    assert genai_model_type("mistral") == "mistral" and "mistral" in GENAI_LLM_TYPES
    for model_type in ("gpt2", "gpt_neox", "bloom", "deepseek_v3", "lfm2"):
        assert genai_model_type(model_type) == "decoder"
    assert _config(model_type="falcon")["model"]["type"] == "decoder"


def test_context_length_keys():
    assert context_length({"max_position_embeddings": 4096, "n_positions": 1}) == 4096
    assert context_length({"n_positions": 1024}) == 1024  # gpt2
    assert context_length({"max_seq_len": 2048}) == 2048  # mpt
    assert context_length({"n_ctx": 512, "max_position_embeddings": None}) == 512
    assert context_length({"model_type": "bloom"}) == 0  # ALiBi: no limit


def test_no_context_length_writes_max_length():
    decoder = dataclasses.replace(DECODER, context_length=0)
    assert _config(decoder=decoder)["model"]["context_length"] == 64


def test_max_length_default_and_limits():
    assert _max_length(DECODER, None) == 128  # min(context_length, 4096)
    long = dataclasses.replace(DECODER, context_length=131072)
    assert _max_length(long, None) == DEFAULT_MAX_LENGTH == 4096
    assert _max_length(dataclasses.replace(DECODER, context_length=0), None) == 4096
    assert _max_length(DECODER, 100) == 100
    with pytest.raises(LoweringOptionsError, match="max_length 129 must be in 2..128"):
        _max_length(DECODER, 129)
    with pytest.raises(LoweringOptionsError, match="max_length 1 must be"):
        _max_length(DECODER, 1)


def test_kv_bytes():
    # keys and values, 2 layers, 2 KV heads of 16, float32
    assert DECODER.kv_bytes(64) == 2 * 2 * 2 * 16 * 4 * 64
    assert DECODER.kv_bytes(64, batch=3) == 3 * DECODER.kv_bytes(64)
    half = dataclasses.replace(DECODER, cache_itemsize=2)
    assert half.kv_bytes(4096) == DECODER.kv_bytes(4096) // 2


# ------------------------------------------ one cache shape for genai (MLA: values padded)


def _layout(keys, values):
    from irkit.llm import CacheLayout

    return CacheLayout(keys=tuple(keys), values=tuple(values), dtype=None)


def test_one_cache_shape():
    from irkit.llm._causal_lm import one_cache_shape

    assert one_cache_shape(_layout([(2, 16)] * 2, [(2, 16)] * 2)) == (2, 16)
    assert one_cache_shape(_layout([(4, 24)] * 2, [(4, 16)] * 2)) == (4, 24)  # MLA: padded
    # per-layer sizes and keys narrower than values: the widest (every tensor padded to it)
    assert one_cache_shape(_layout([(2, 16), (4, 32)], [(2, 16), (4, 32)])) == (4, 32)
    assert one_cache_shape(_layout([(2, 16)], [(2, 24)])) == (2, 24)
    with pytest.raises(LoweringOptionsError, match="no keys and values"):
        one_cache_shape(_layout([], []))


def test_pad_value_cache_runs_the_same():
    """Values of 2 stored as 3: the pad column is ignored on the way in, zero on the way out."""
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from irkit.llm._causal_lm import pad_value_cache

    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    graph = helper.make_graph(
        [
            helper.make_node(
                "Concat", ["past_key_values.0.value", "x"], ["present.0.value"], axis=2
            ),
            helper.make_node("ReduceSum", ["present.0.value"], ["logits"], keepdims=0),
        ],
        "g",
        [info("x", ["b", 1, "s", 2]), info("past_key_values.0.value", ["b", 1, "p", 2])],
        [info("logits", []), info("present.0.value", ["b", 1, "t", 2])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model = ir.serde.deserialize_model(proto)
    pad_value_cache(model, _layout([(1, 3)], [(1, 2)]))
    assert [d for d in model.graph.inputs[1].shape.dims][-1] == 3
    session = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 1, 4, 2)).astype(np.float32)
    past = rng.standard_normal((2, 1, 5, 3)).astype(np.float32)  # the pad column is garbage
    logits, present = session.run(None, {"x": x, "past_key_values.0.value": past})
    np.testing.assert_allclose(logits, past[..., :2].sum() + x.sum(), rtol=1e-5)
    np.testing.assert_array_equal(present[..., :2], np.concatenate([past[..., :2], x], axis=2))
    np.testing.assert_array_equal(present[..., 2], 0)
