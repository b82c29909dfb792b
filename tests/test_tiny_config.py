"""The rules of ``bench/tiny_config.py``: tiny configs derived from a config class's defaults.

Configs only (fast), plus a few small models built and run on a short prompt.
"""

from __future__ import annotations

import pytest

from bench import tiny_config as tc
from tests.capabilities import require_model_types as _require
from tests.capabilities import require_state_kind_comparison
from tests.capabilities import require_typed_cache_layers as _require_typed_layer_kinds

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _types(config) -> set[str]:
    return set(config.layer_types)


def test_llama_widths():
    cfg = tc.tiny_config("llama")  # multi-head attention by default: as many KV heads
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 4, 4)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.num_hidden_layers) == (16, 128, 2)
    assert cfg.vocab_size == tc.VOCAB
    assert 256 <= cfg.max_position_embeddings <= tc.MAX_POSITIONS


def test_layers_argument_and_overrides():
    cfg = tc.tiny_config("llama", layers=3, vocab_size=300)
    assert cfg.num_hidden_layers == 3
    assert cfg.vocab_size == 300


@pytest.mark.parametrize(
    ("default_kv", "expected"),
    [(1, 1), (32, 4), (8, 2)],
    ids=["mqa-stays-mqa", "mha-stays-mha", "gqa-2"],
)
def test_kv_heads(default_kv, expected):
    default = transformers.LlamaConfig(num_attention_heads=32, num_key_value_heads=default_kv)
    assert tc.shrink(default).num_key_value_heads == expected


def test_hybrid_keeps_both_layer_kinds():
    _require("qwen3_next", "nemotron_h")
    default = transformers.AutoConfig.for_model("qwen3_next")
    cfg = tc.tiny_config("qwen3_next")
    assert _types(cfg) == _types(default) == {"linear_attention", "full_attention"}
    assert len(cfg.layer_types) == cfg.num_hidden_layers
    nemotron = tc.tiny_config("nemotron_h")
    kinds = set(transformers.AutoConfig.for_model("nemotron_h").layers_block_type)
    assert set(nemotron.layers_block_type) == kinds
    assert nemotron.num_hidden_layers == len(kinds)


@pytest.mark.parametrize("model_type", ["bamba", "granitemoehybrid"])
def test_all_state_defaults_get_an_attention_layer(model_type):
    """Bamba's and GraniteMoeHybrid's defaults are all Mamba layers (their checkpoints are not):
    the last layer becomes full attention, through the config's own field."""
    _require_typed_layer_kinds()
    cfg = tc.tiny_config(model_type)
    assert cfg.layers_block_type == ["linear_attention", "full_attention"]


def test_pure_state_models_stay_pure():
    if not hasattr(transformers.Mamba2Config(), "layer_types"):
        pytest.skip(f"transformers {transformers.__version__}'s Mamba2Config has no layer_types")
    assert _types(tc.tiny_config("mamba2")) == {"linear_attention"}  # no attention heads


def test_underived_layer_types_from_the_model_comparisons():
    """LFM2-MoE leaves ``layer_types`` ``None`` (its defaults do not build): the state kind its
    modeling module compares the list with (``!= "conv"``), then full attention."""
    require_state_kind_comparison("lfm2_moe")
    cfg = tc.tiny_config("lfm2_moe")
    assert cfg.layer_types == ["conv", "full_attention"]
    assert cfg.num_dense_layers == 1  # one dense layer, one MoE layer


def test_periods_and_offsets_clamped():
    cfg = tc.tiny_config("jamba")  # attention every 8th layer from 4, experts every 2nd from 1
    attention = [i % cfg.attn_layer_period == cfg.attn_layer_offset for i in range(2)]
    experts = [i % cfg.expert_layer_period == cfg.expert_layer_offset for i in range(2)]
    assert cfg.num_hidden_layers == 2
    assert set(attention) == set(experts) == {True, False}


def test_an_offset_without_its_period_is_no_layer_offset():
    cfg = tc.tiny_config("gemma3n")  # ids from vocab_offset on are vision tokens
    assert cfg.vision_config.vocab_offset >= cfg.text_config.vocab_size


def test_short_cycle_raises_the_layer_count():
    cfg = tc.tiny_config("recurrent_gemma")  # block_types: recurrent, recurrent, attention
    assert cfg.num_hidden_layers == 3
    assert list(cfg.block_types) == ["recurrent", "recurrent", "attention"]


def test_repeat_pattern_covers_the_layers():
    cfg = tc.tiny_config("gpt_neo")
    assert cfg.attention_layers == ["global", "local"]
    assert cfg.num_layers == 2


def test_thresholds_and_shared_layers_keep_both_sides():
    cfg = tc.tiny_config("deepseek_v3")  # first_k_dense_replace 3 of 61
    assert 0 < cfg.first_k_dense_replace < cfg.num_hidden_layers
    gemma3n = tc.tiny_config("gemma3n_text")  # the last 15 of 35 layers share the KV cache
    shared = gemma3n.num_kv_shared_layers
    assert 0 < shared < gemma3n.num_hidden_layers
    own = set(gemma3n.layer_types[:-shared])
    assert own == set(gemma3n.layer_types[-shared:]) == {"sliding_attention", "full_attention"}
    assert set(gemma3n.activation_sparsity_pattern) == {0.95, 0.0}


def test_per_layer_overrides_keep_their_ratio():
    _require("gemma4_text")
    cfg = tc.tiny_config("gemma4_text")  # full-attention layers: head_dim 512 against 256
    assert cfg.to_dict()["per_layer_config"]
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    overrides = {int(k): v for k, v in cfg.to_dict()["per_layer_config"].items()}
    assert set(overrides) == set(full)
    assert {v["head_dim"] for v in overrides.values()} == {2 * tc.HEAD_DIM}


@pytest.mark.parametrize("model_type", ["olmo_hybrid", "kimi_linear", "gemma3", "gpt2", "whisper"])
def test_token_ids_inside_the_vocabulary(model_type):
    _require(model_type)
    cfg = tc.tiny_config(model_type)
    text = cfg.get_text_config()
    vocab = text.vocab_size
    assert vocab <= tc.VOCAB
    ids = {
        (k, v)
        for c in (cfg, text)
        for k, v in c.to_dict().items()
        if k.endswith(("_token_id", "_token_index")) and isinstance(v, int)
    }
    assert ids
    assert all(0 <= v < vocab for _, v in ids), ids


def test_distinct_special_ids_stay_distinct():
    _require("kimi_linear")
    default = transformers.AutoConfig.for_model("kimi_linear")
    cfg = tc.tiny_config("kimi_linear")
    names = ("pad_token_id", "bos_token_id", "eos_token_id")
    assert len({getattr(default, n) for n in names}) == len({getattr(cfg, n) for n in names}) == 3


def test_state_space_sizes_consistent():
    mamba2 = tc.tiny_config("mamba2")
    assert mamba2.state_size == tc.STATE and mamba2.chunk_size == tc.CHUNK
    assert mamba2.conv_kernel <= tc.CONV
    assert mamba2.num_heads * mamba2.head_dim == mamba2.expand * mamba2.hidden_size
    assert mamba2.num_heads % mamba2.n_groups == 0
    falcon_h1 = tc.tiny_config("falcon_h1")  # its own SSM width, not expand × hidden
    assert falcon_h1.mamba_n_heads * falcon_h1.mamba_d_head == falcon_h1.mamba_d_ssm
    assert falcon_h1.mamba_d_state == tc.STATE


def test_mla_head_dim_is_its_parts():
    cfg = tc.tiny_config("deepseek_v3")
    assert cfg.qk_head_dim == cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    assert cfg.kv_lora_rank <= tc.RANK


def test_windows_chunks_and_experts():
    assert tc.tiny_config("mistral").sliding_window == tc.WINDOW
    llama4 = tc.tiny_config("llama4_text")
    assert llama4.attention_chunk_size == tc.CHUNK
    assert llama4.num_local_experts <= tc.EXPERTS
    qwen3_moe = tc.tiny_config("qwen3_moe")
    assert qwen3_moe.num_experts == tc.EXPERTS and qwen3_moe.num_experts_per_tok <= tc.TOP_K


def test_nested_configs_shrunk():
    cfg = tc.tiny_config("gemma3")
    assert cfg.text_config.hidden_size == cfg.vision_config.hidden_size == tc.HIDDEN
    assert cfg.vision_config.num_hidden_layers <= 2
    assert cfg.image_token_id < cfg.text_config.vocab_size


def test_overrides_name_known_types():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    assert set(tc.OVERRIDES) <= set(CONFIG_MAPPING_NAMES)


@pytest.mark.parametrize("model_type", ["llama", "qwen3_next", "jamba", "mamba2", "gemma3"])
def test_tiny_models_build_and_run(model_type):
    _require(model_type)
    lm = tc.tiny_model(model_type)
    assert sum(p.numel() for p in lm.parameters()) < 1_000_000
    with torch.no_grad():
        logits = lm(torch.tensor([[5, 6, 7, 8]])).logits
    assert logits.shape[:2] == (1, 4)
    assert not lm.training


def test_default_among_its_choices():
    """Xmod refuses to run without a default language: the first of its ``languages``."""
    cfg = tc.tiny_config("xmod")
    assert cfg.default_language == cfg.languages[0]
