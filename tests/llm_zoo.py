"""The causal-LM zoo: one tiny config per transformers decoder architecture, shared by the tests.

Each :class:`CausalLMArch` is a name, a config factory and the transformers model class: two
layers, hidden size 64, vocabulary 256, random weights from a fixed seed, 128 positions. Where an
architecture has a sliding window it is :data:`SLIDING_WINDOW` tokens, fewer than a prompt plus
16 new tokens, so that windowed layers are exercised. ``tests/llm/test_llm_zoo.py`` exports,
lowers and runs each one against transformers' ``generate``; other tests (e.g. the
onnxruntime-genai export) reuse :data:`ZOO`.

transformers is imported when a config or model is built, not at import.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

SEED = 0
VOCAB = 256
SLIDING_WINDOW = 8
MAX_POSITIONS = 128


@dataclasses.dataclass(frozen=True)
class CausalLMArch:
    """One zoo entry.

    Attributes:
        name: The transformers ``model_type`` (test id).
        config: Builds the tiny config.
        model_class: Name of the ``transformers`` causal-LM class.
    """

    name: str
    config: Callable[[], Any]
    model_class: str

    def model(self, dtype: Any = None) -> Any:
        """The model in eval mode with seeded random weights (``dtype``: e.g. ``torch.float16``)."""
        import torch
        import transformers

        torch.manual_seed(SEED)
        model = getattr(transformers, self.model_class)(self.config()).eval()
        return model if dtype is None else model.to(dtype)


def _config(class_name: str, **kwargs: Any) -> Any:
    import transformers

    return getattr(transformers, class_name)(**kwargs)


def _arch(name: str, config_class: str, model_class: str, **kwargs: Any) -> CausalLMArch:
    return CausalLMArch(name, functools.partial(_config, config_class, **kwargs), model_class)


# Special tokens inside the vocabulary (some configs default to ids of their real tokenizer).
_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# The common shape of the Llama-like configs (GQA: 4 query heads, 2 KV heads of 16).
_BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": MAX_POSITIONS,
    **_TOKENS,
}
_HEAD = {"head_dim": 16}  # configs whose default head_dim is not hidden / heads
_WINDOW = {"sliding_window": SLIDING_WINDOW}
_ALTERNATING = {"layer_types": ["sliding_attention", "full_attention"], **_WINDOW}
_GPT = {
    **_TOKENS,
    "vocab_size": VOCAB,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": MAX_POSITIONS,
}

ZOO: tuple[CausalLMArch, ...] = (
    _arch("llama", "LlamaConfig", "LlamaForCausalLM", **_BASE),
    _arch("mistral", "MistralConfig", "MistralForCausalLM", **_BASE, **_HEAD, **_WINDOW),
    _arch(
        "qwen2",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        **_BASE,
        use_sliding_window=True,
        max_window_layers=1,
        **_WINDOW,
    ),
    _arch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", **_BASE, **_HEAD),
    _arch(
        "qwen3_moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        **_BASE,
        **_HEAD,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    _arch("phi", "PhiConfig", "PhiForCausalLM", **_BASE),
    _arch("phi3", "Phi3Config", "Phi3ForCausalLM", **_BASE, **_WINDOW),
    _arch("gemma", "GemmaConfig", "GemmaForCausalLM", **_BASE, **_HEAD),
    _arch("gemma2", "Gemma2Config", "Gemma2ForCausalLM", **_BASE, **_HEAD, **_ALTERNATING),
    _arch("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM", **_BASE, **_HEAD, **_ALTERNATING),
    _arch("gpt2", "GPT2Config", "GPT2LMHeadModel", **_GPT, n_inner=128),
    _arch(
        "gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        vocab_size=VOCAB,
        **_TOKENS,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_POSITIONS,
    ),
    _arch("gptj", "GPTJConfig", "GPTJForCausalLM", **_GPT, n_inner=128, rotary_dim=8),
    # Multi-query attention: one KV head (new_decoder_architecture=False, multi_query=True).
    _arch(
        "falcon",
        "FalconConfig",
        "FalconForCausalLM",
        vocab_size=VOCAB,
        **_TOKENS,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        new_decoder_architecture=False,
        multi_query=True,
    ),
    _arch("olmo", "OlmoConfig", "OlmoForCausalLM", **_BASE),
    _arch("olmo2", "Olmo2Config", "Olmo2ForCausalLM", **_BASE),
    _arch("granite", "GraniteConfig", "GraniteForCausalLM", **_BASE),
    _arch("stablelm", "StableLmConfig", "StableLmForCausalLM", **_BASE),
    _arch("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", **_BASE, **_WINDOW),
    _arch("cohere", "CohereConfig", "CohereForCausalLM", **_BASE),
    _arch("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", **_BASE),
    _arch(
        "mixtral",
        "MixtralConfig",
        "MixtralForCausalLM",
        **_BASE,
        **_HEAD,
        **_WINDOW,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    # MLA: keys of qk_nope + qk_rope = 24, values of 16, one per attention head.
    _arch(
        "deepseek_v3",
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        **{**_BASE, "num_key_value_heads": 4},  # MLA: as many KV heads as query heads
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        moe_intermediate_size=32,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
    ),
    _arch(
        "bloom",
        "BloomConfig",
        "BloomForCausalLM",
        **_TOKENS,
        vocab_size=VOCAB,
        hidden_size=64,
        n_layer=2,
        n_head=4,
    ),
    _arch(
        "opt",
        "OPTConfig",
        "OPTForCausalLM",
        vocab_size=VOCAB,
        **_TOKENS,
        hidden_size=64,
        word_embed_proj_dim=64,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_POSITIONS,
    ),
    _arch(
        "mpt",
        "MptConfig",
        "MptForCausalLM",
        vocab_size=VOCAB,
        **_TOKENS,
        d_model=64,
        n_heads=4,
        n_layers=2,
        expansion_ratio=2,
        max_seq_len=MAX_POSITIONS,
    ),
    _arch(
        "codegen",
        "CodeGenConfig",
        "CodeGenForCausalLM",
        **_GPT,
        n_ctx=MAX_POSITIONS,
        n_inner=128,
        rotary_dim=8,
    ),
)

BY_NAME = {arch.name: arch for arch in ZOO}

#: Configs beyond the 27 architectures, for what one of them can also be: Phi-3's longrope (two
#: factor sets; positions past ``original_max_position_embeddings`` = 16 take the long factors).
EXTRA: tuple[CausalLMArch, ...] = (
    CausalLMArch(
        "phi3_longrope",
        functools.partial(
            _config,
            "Phi3Config",
            **_BASE,
            original_max_position_embeddings=16,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.1 * i for i in range(8)],
                "long_factor": [1.5 + 0.3 * i for i in range(8)],
            },
        ),
        "Phi3ForCausalLM",
    ),
)
