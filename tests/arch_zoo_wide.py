"""The wide architecture zoo: more transformers architectures nobody here tuned irkit for.

Same structure and export conventions as :mod:`tests.arch_zoo` (whose helpers it reuses): tiny
configurations (hidden size 16–64, 1–2 layers, vocabulary 128, random weights, seed 0, nothing
downloaded), exported as users export them — ``torch.export.export(model.eval(), (), inputs,
dynamic_shapes=...)`` without an outer ``torch.no_grad()``, named dynamic dims (``batch``,
``seq``, ``dec_seq``; images ``batch``; audio ``batch`` and ``frames``).

If a model cannot be exported with its dynamic dims, :func:`export_info` falls back to a static
export and records why; such a model is then checked at the export size only (:func:`sizes`).

Not a test module (too slow for CI): ``python bench/bench_lower.py --zoo wide`` runs it.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.arch_zoo import (
    _TOKENS,
    HEADS,
    HIDDEN,
    LAYERS,
    POSITIONS,
    SIZE_A,
    SIZE_B,
    VOCAB,
    ArchModel,
    _causal_lm,
    _dims,
    _encoder_config,
    _fresh,
    _gen,
    _ids,
    _image_case,
    _randomize_batchnorm,
    _seeded,
    _seq2seq,
    _text_case,
)


def _with_seq_max(zm: ArchModel, max_seq: int) -> ArchModel:
    """``zm`` with its ``seq`` dim capped at ``max_seq`` (torch.export's suggested fix)."""
    batch, seq = _dims(max_seq)
    zm.dynamic_shapes = {key: {0: batch, 1: seq} for key in zm.dynamic_shapes}
    return zm


# --- decoder LMs ---------------------------------------------------------------------------------


@_seeded
def gemma() -> ArchModel:
    return _causal_lm("gemma", "decoder", "GemmaConfig", "GemmaForCausalLM", head_dim=16)


@_seeded
def gemma3_text() -> ArchModel:
    return _causal_lm(
        "gemma3_text",
        "decoder",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        head_dim=16,
        sliding_window=4,
    )


@_seeded
def phi() -> ArchModel:
    return _causal_lm("phi", "decoder", "PhiConfig", "PhiForCausalLM", num_key_value_heads=HEADS)


@_seeded
def stablelm() -> ArchModel:
    return _causal_lm("stablelm", "decoder", "StableLmConfig", "StableLmForCausalLM")


@_seeded
def starcoder2() -> ArchModel:
    return _causal_lm(
        "starcoder2", "decoder", "Starcoder2Config", "Starcoder2ForCausalLM", sliding_window=4
    )


@_seeded
def granite() -> ArchModel:
    return _causal_lm("granite", "decoder", "GraniteConfig", "GraniteForCausalLM")


@_seeded
def cohere() -> ArchModel:
    return _causal_lm("cohere", "decoder", "CohereConfig", "CohereForCausalLM")


@_seeded
def olmo2() -> ArchModel:
    return _causal_lm("olmo2", "decoder", "Olmo2Config", "Olmo2ForCausalLM")


@_seeded
def smollm3() -> ArchModel:
    return _causal_lm("smollm3", "decoder", "SmolLM3Config", "SmolLM3ForCausalLM")


@_seeded
def persimmon() -> ArchModel:
    return _causal_lm(
        "persimmon",
        "decoder",
        "PersimmonConfig",
        "PersimmonForCausalLM",
        num_key_value_heads=HEADS,
        qk_layernorm=True,
    )


@_seeded
def bloom() -> ArchModel:
    """ALiBi position biases."""
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(
        hidden_size=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        vocab_size=VOCAB,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("bloom", "decoder", BloomForCausalLM(cfg))


@_seeded
def mpt() -> ArchModel:
    """ALiBi through ``attn_config``."""
    from transformers import MptConfig, MptForCausalLM

    cfg = MptConfig(
        d_model=HIDDEN,
        n_heads=HEADS,
        n_layers=LAYERS,
        expansion_ratio=2,
        max_seq_len=POSITIONS,
        vocab_size=VOCAB,
        use_cache=False,
        **_TOKENS,
    )
    # torch.export's guard: seq != max_seq_len (the ALiBi table is sliced from the end).
    return _with_seq_max(_text_case("mpt", "decoder", MptForCausalLM(cfg)), POSITIONS - 1)


@_seeded
def gptj() -> ArchModel:
    from transformers import GPTJConfig, GPTJForCausalLM

    cfg = GPTJConfig(
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        rotary_dim=8,
        n_inner=2 * HIDDEN,
        n_positions=POSITIONS,
        vocab_size=VOCAB,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("gptj", "decoder", GPTJForCausalLM(cfg))


@_seeded
def codegen() -> ArchModel:
    from transformers import CodeGenConfig, CodeGenForCausalLM

    cfg = CodeGenConfig(
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        rotary_dim=8,
        n_inner=2 * HIDDEN,
        n_positions=POSITIONS,
        n_ctx=POSITIONS,
        vocab_size=VOCAB,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return _text_case("codegen", "decoder", CodeGenForCausalLM(cfg))


# --- mixture of experts --------------------------------------------------------------------------


@_seeded
def qwen3_moe() -> ArchModel:
    return _causal_lm(
        "qwen3_moe",
        "moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=HIDDEN,
    )


@_seeded
def deepseek_v3() -> ArchModel:
    """Multi-head latent attention, group-limited top-k routing, one dense layer first."""
    return _causal_lm(
        "deepseek_v3",
        "moe",
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        num_key_value_heads=HEADS,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=HIDDEN,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        n_group=2,
        topk_group=1,
    )


@_seeded
def gpt_oss() -> ArchModel:
    """Attention sinks, alternating sliding/full attention, clamped SwiGLU experts."""
    return _causal_lm(
        "gpt_oss",
        "moe",
        "GptOssConfig",
        "GptOssForCausalLM",
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
    )


# --- state-space and recurrent models ------------------------------------------------------------


@_seeded
def mamba() -> ArchModel:
    from transformers import MambaConfig, MambaForCausalLM

    cfg = MambaConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        state_size=8,
        expand=2,
        conv_kernel=4,
        vocab_size=VOCAB,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("mamba", "ssm", MambaForCausalLM(cfg))


@_seeded
def falcon_mamba() -> ArchModel:
    from transformers import FalconMambaConfig, FalconMambaForCausalLM

    cfg = FalconMambaConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        state_size=8,
        expand=2,
        conv_kernel=4,
        vocab_size=VOCAB,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("falcon_mamba", "ssm", FalconMambaForCausalLM(cfg))


@_seeded
def jamba() -> ArchModel:
    """Mamba and attention layers interleaved, MoE on every second layer."""
    return _causal_lm(
        "jamba",
        "ssm",
        "JambaConfig",
        "JambaForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        use_mamba_kernels=False,
    )


@_seeded
def bamba() -> ArchModel:
    """Mamba2 (chunked scan) plus one attention layer."""
    return _causal_lm(
        "bamba",
        "ssm",
        "BambaConfig",
        "BambaForCausalLM",
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_n_groups=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=4,
    )


@_seeded
def rwkv() -> ArchModel:
    from transformers import RwkvConfig, RwkvForCausalLM

    cfg = RwkvConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        attention_hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        context_length=POSITIONS,
        vocab_size=VOCAB,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return _text_case("rwkv", "ssm", RwkvForCausalLM(cfg), mask=False)


# --- encoders ------------------------------------------------------------------------------------


@_seeded
def electra() -> ArchModel:
    from transformers import ElectraConfig, ElectraModel

    cfg = _encoder_config(ElectraConfig, embedding_size=32)
    return _text_case("electra", "encoder", ElectraModel(cfg))


@_seeded
def xlm_roberta() -> ArchModel:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    cfg = _encoder_config(XLMRobertaConfig, pad_token_id=1, max_position_embeddings=POSITIONS + 2)
    return _text_case("xlm_roberta", "encoder", XLMRobertaModel(cfg))


@_seeded
def mpnet() -> ArchModel:
    from transformers import MPNetConfig, MPNetModel

    cfg = _encoder_config(MPNetConfig, pad_token_id=1, max_position_embeddings=POSITIONS + 2)
    return _text_case("mpnet", "encoder", MPNetModel(cfg))


@_seeded
def modernbert() -> ArchModel:
    """Alternating global / sliding-window (local_attention=4) attention, unpadded RoPE."""
    from transformers import ModernBertConfig, ModernBertModel

    cfg = _encoder_config(ModernBertConfig, local_attention=4)
    return _text_case("modernbert", "encoder", ModernBertModel(cfg))


@_seeded
def funnel() -> ArchModel:
    """Sequence pooling between blocks (the sequence length halves)."""
    from transformers import FunnelConfig, FunnelModel

    cfg = FunnelConfig(
        vocab_size=VOCAB,
        block_sizes=[1, 1],
        num_decoder_layers=1,
        d_model=HIDDEN,
        n_head=HEADS,
        d_head=16,
        d_inner=2 * HIDDEN,
        pad_token_id=0,
    )
    return _text_case("funnel", "encoder", FunnelModel(cfg))


@_seeded
def layoutlm() -> ArchModel:
    """Text plus bounding boxes (default all-zero boxes: the text-only call)."""
    from transformers import LayoutLMConfig, LayoutLMModel

    return _text_case("layoutlm", "encoder", LayoutLMModel(_encoder_config(LayoutLMConfig)))


@_seeded
def canine() -> ArchModel:
    """Character ids hashed into buckets, downsampled by a strided conv, upsampled back."""
    from transformers import CanineConfig, CanineModel

    cfg = CanineConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=POSITIONS,
        num_hash_buckets=64,
        num_hash_functions=2,
        downsampling_rate=2,
        local_transformer_stride=4,
    )
    return _text_case("canine", "encoder", CanineModel(cfg))


@_seeded
def convbert() -> ArchModel:
    """Span-based dynamic convolution heads next to self-attention."""
    from transformers import ConvBertConfig, ConvBertModel

    cfg = _encoder_config(ConvBertConfig, embedding_size=32, conv_kernel_size=3)
    return _text_case("convbert", "encoder", ConvBertModel(cfg))


@_seeded
def big_bird() -> ArchModel:
    """Block-sparse attention configured; at these lengths BigBird itself falls back to full."""
    from transformers import BigBirdConfig, BigBirdModel

    cfg = _encoder_config(BigBirdConfig, block_size=2, num_random_blocks=1)
    # torch.export's suggested fix: seq <= 14, the lengths at which BigBird falls back to full.
    return _with_seq_max(_text_case("big_bird", "encoder", BigBirdModel(cfg)), 14)


@_seeded
def longformer() -> ArchModel:
    """Sliding-window chunked attention; pads the sequence to a multiple of the window."""
    from transformers import LongformerConfig, LongformerModel

    cfg = _encoder_config(
        LongformerConfig, attention_window=4, pad_token_id=1, max_position_embeddings=POSITIONS + 2
    )
    return _text_case("longformer", "encoder", LongformerModel(cfg))


# --- encoder-decoders ----------------------------------------------------------------------------


def _bart_like(config_cls: type, **overrides: Any) -> Any:
    fields: dict[str, Any] = dict(
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=2 * HIDDEN,
        decoder_ffn_dim=2 * HIDDEN,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        use_cache=False,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    fields.update(overrides)
    return config_cls(**fields)


@_seeded
def mbart() -> ArchModel:
    from transformers import MBartConfig, MBartForConditionalGeneration

    return _seq2seq("mbart", MBartForConditionalGeneration(_bart_like(MBartConfig)), (6, 4))


@_seeded
def marian() -> ArchModel:
    """Sinusoidal positions."""
    from transformers import MarianConfig, MarianMTModel

    cfg = _bart_like(
        MarianConfig, decoder_vocab_size=VOCAB, pad_token_id=0, decoder_start_token_id=0
    )
    return _seq2seq("marian", MarianMTModel(cfg), (6, 4))


@_seeded
def pegasus() -> ArchModel:
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    cfg = _bart_like(PegasusConfig, pad_token_id=0, decoder_start_token_id=0)
    return _seq2seq("pegasus", PegasusForConditionalGeneration(cfg), (6, 4))


@_seeded
def m2m100() -> ArchModel:
    """Sinusoidal positions computed from the ids (padding-aware)."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    return _seq2seq("m2m100", M2M100ForConditionalGeneration(_bart_like(M2M100Config)), (6, 4))


@_seeded
def led() -> ArchModel:
    """Longformer encoder (sliding window 4) with a BART decoder."""
    from transformers import LEDConfig, LEDForConditionalGeneration

    cfg = _bart_like(
        LEDConfig,
        max_encoder_position_embeddings=POSITIONS,
        max_decoder_position_embeddings=POSITIONS,
        attention_window=4,
    )
    return _seq2seq("led", LEDForConditionalGeneration(cfg), (6, 4))


@_seeded
def t5gemma() -> ArchModel:
    from transformers import (
        T5GemmaConfig,
        T5GemmaForConditionalGeneration,
        T5GemmaModuleConfig,
    )

    def module(**extra: Any) -> Any:
        return T5GemmaModuleConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=POSITIONS,
            sliding_window=4,
            use_cache=False,
            **_TOKENS,
            **extra,
        )

    cfg = T5GemmaConfig(encoder=module(), decoder=module(), vocab_size=VOCAB, use_cache=False)
    cfg.decoder.use_cache = False  # T5GemmaConfig turns the decoder's cache back on
    return _seq2seq("t5gemma", T5GemmaForConditionalGeneration(cfg), (6, 4))


# --- vision --------------------------------------------------------------------------------------


def _vit_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        image_size=32,
        patch_size=8,
    )
    fields.update(overrides)
    return fields


@_seeded
def deit() -> ArchModel:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    cfg = DeiTConfig(**_vit_fields(num_labels=10))
    return _image_case("deit", DeiTForImageClassificationWithTeacher(cfg))


@_seeded
def beit() -> ArchModel:
    """Relative position bias tables, layer scale, mean pooling."""
    from transformers import BeitConfig, BeitForImageClassification

    cfg = BeitConfig(
        **_vit_fields(num_labels=10), use_relative_position_bias=True, use_mean_pooling=True
    )
    return _image_case("beit", BeitForImageClassification(cfg))


@_seeded
def dinov2() -> ArchModel:
    """Position embeddings resized by bicubic interpolation in forward."""
    from transformers import Dinov2Config, Dinov2Model

    cfg = Dinov2Config(**{k: v for k, v in _vit_fields().items() if k != "intermediate_size"})
    return _image_case("dinov2", Dinov2Model(cfg))


@_seeded
def clip_vision() -> ArchModel:
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    cfg = CLIPVisionConfig(**_vit_fields(), projection_dim=32)
    return _image_case("clip_vision", CLIPVisionModelWithProjection(cfg))


@_seeded
def siglip_vision() -> ArchModel:
    """Attention-pooling head."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    return _image_case("siglip_vision", SiglipVisionModel(SiglipVisionConfig(**_vit_fields())))


@_seeded
def convnextv2() -> ArchModel:
    """Global response normalization."""
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification

    cfg = ConvNextV2Config(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10)
    return _image_case("convnextv2", ConvNextV2ForImageClassification(cfg))


@_seeded
def efficientnet() -> ArchModel:
    """Depthwise convs with 'same' padding, squeeze-excitation, swish."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    cfg = EfficientNetConfig(
        image_size=32,
        width_coefficient=0.25,
        depth_coefficient=0.25,
        hidden_dim=320,  # round_filters(1280) at width 0.25
        num_labels=10,
    )
    model = EfficientNetForImageClassification(cfg)
    _randomize_batchnorm(model)
    return _image_case("efficientnet", model)


@_seeded
def regnet() -> ArchModel:
    """Grouped convolutions, squeeze-excitation."""
    from transformers import RegNetConfig, RegNetForImageClassification

    cfg = RegNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, num_labels=10
    )
    model = RegNetForImageClassification(cfg)
    _randomize_batchnorm(model)
    return _image_case("regnet", model)


@_seeded
def levit() -> ArchModel:
    """Attention biases indexed by fixed offsets, hardswish, subsampling attention."""
    from transformers import LevitConfig, LevitForImageClassificationWithTeacher

    cfg = LevitConfig(
        image_size=64,
        hidden_sizes=[32, 48, 64],
        num_attention_heads=[1, 2, 2],
        depths=[1, 1, 1],
        key_dim=[8, 8, 8],
        num_labels=10,
    )
    model = LevitForImageClassificationWithTeacher(cfg)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return _image_case("levit", model, size=64)


@_seeded
def mobilevit() -> ArchModel:
    """Convs and transformer blocks over unfolded patches."""
    from transformers import MobileViTConfig, MobileViTForImageClassification

    cfg = MobileViTConfig(
        image_size=64,
        hidden_sizes=[16, 16, 16],
        neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32],
        num_attention_heads=2,
        num_labels=10,
    )
    model = MobileViTForImageClassification(cfg)
    _randomize_batchnorm(model)
    return _image_case("mobilevit", model, size=64)


@_seeded
def segformer() -> ArchModel:
    """Efficient attention (spatial reduction), Mix-FFN, all-MLP decoder with bilinear upsampling."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    cfg = SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        num_labels=5,
    )
    model = SegformerForSemanticSegmentation(cfg)
    _randomize_batchnorm(model)
    return _image_case("segformer", model)


@_seeded
def detr() -> ArchModel:
    """ResNet backbone (transformers' own, no timm), sine positions, object queries."""
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    backbone = ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="basic",
        out_features=["stage2"],
    )
    cfg = DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        d_model=HIDDEN,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=2 * HIDDEN,
        decoder_ffn_dim=2 * HIDDEN,
        num_queries=8,
        num_labels=5,
    )
    model = DetrForObjectDetection(cfg)
    _randomize_batchnorm(model)
    return _image_case("detr", model, size=64)


@_seeded
def yolos() -> ArchModel:
    """Detection tokens; position embeddings interpolated in forward."""
    from transformers import YolosConfig, YolosForObjectDetection

    cfg = YolosConfig(**_vit_fields(image_size=[32, 32]), num_detection_tokens=4, num_labels=5)
    return _image_case("yolos", YolosForObjectDetection(cfg))


@_seeded
def swinv2() -> ArchModel:
    """Cosine attention with a continuous (log-spaced MLP) position bias."""
    from transformers import Swinv2Config, Swinv2ForImageClassification

    cfg = Swinv2Config(
        image_size=32,
        patch_size=2,
        embed_dim=32,
        depths=[1, 1],
        num_heads=[2, 4],
        window_size=4,
        num_labels=10,
    )
    return _image_case("swinv2", Swinv2ForImageClassification(cfg))


@_seeded
def poolformer() -> ArchModel:
    from transformers import PoolFormerConfig, PoolFormerForImageClassification

    cfg = PoolFormerConfig(
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_encoder_blocks=2,
        patch_sizes=[7, 3],
        strides=[4, 2],
        padding=[2, 1],
        num_labels=10,
    )
    return _image_case("poolformer", PoolFormerForImageClassification(cfg))


# --- text towers and a multimodal model ---------------------------------------------------------


@_seeded
def clip_text() -> ArchModel:
    """Causal text tower pooled at the first eos token (an argmax over the ids)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
        eos_token_id=2,
    )
    return _text_case("clip_text", "encoder", CLIPTextModel(cfg))


@_seeded
def siglip() -> ArchModel:
    """Text and image towers; the logits compare every text with every image."""
    from transformers import SiglipConfig, SiglipModel

    text = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
    )
    cfg = SiglipConfig(text_config=text, vision_config=_vit_fields())
    batch, seq = _dims()

    def make(b: int, s: int, tag: int) -> dict[str, Any]:
        return {
            "input_ids": _ids(b, s, tag),
            "pixel_values": torch.randn(b, 3, 32, 32, generator=_gen(tag + 20)),
        }

    dyn = {"input_ids": {0: batch, 1: seq}, "pixel_values": {0: batch}}
    return ArchModel(
        "siglip", "multimodal", SiglipModel(cfg), make(*SIZE_A, 0), make(*SIZE_B, 1), dyn
    )


# --- audio ---------------------------------------------------------------------------------------


def _speech_encoder(name: str, config_name: str, model_name: str, **overrides: Any) -> ArchModel:
    """A Wav2Vec2-style speech encoder on raw samples (samples = 10 · frames, as in arch_zoo)."""
    import transformers

    fields: dict[str, Any] = dict(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        conv_dim=(32, 32),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        vocab_size=VOCAB,
    )
    fields.update(overrides)
    cfg = getattr(transformers, config_name)(**fields)
    batch, frames = torch.export.Dim("batch", max=64), torch.export.Dim("frames", min=8, max=400)

    def make(b: int, n: int, tag: int) -> dict[str, Any]:
        return {"input_values": torch.randn(b, n, generator=_gen(tag))}

    dyn = {"input_values": {0: batch, 1: 10 * frames}}
    model = getattr(transformers, model_name)(cfg)
    return ArchModel(name, "audio", model, make(2, 400, 0), make(3, 270, 1), dyn)


@_seeded
def hubert() -> ArchModel:
    return _speech_encoder("hubert", "HubertConfig", "HubertModel")


@_seeded
def data2vec_audio() -> ArchModel:
    return _speech_encoder(
        "data2vec_audio",
        "Data2VecAudioConfig",
        "Data2VecAudioModel",
        conv_pos_kernel_size=5,
        num_conv_pos_embeddings=5,
    )


@_seeded
def wavlm() -> ArchModel:
    """Gated relative position bias (bucketed)."""
    return _speech_encoder(
        "wavlm", "WavLMConfig", "WavLMModel", num_buckets=32, max_bucket_distance=64
    )


@_seeded
def sew() -> ArchModel:
    """Squeezed (pooled, then upsampled) sequence between the conv features and the encoder."""
    return _speech_encoder("sew", "SEWConfig", "SEWModel", squeeze_factor=2)


@_seeded
def unispeech_sat() -> ArchModel:
    return _speech_encoder("unispeech_sat", "UniSpeechSatConfig", "UniSpeechSatModel")


@_seeded
def speech_to_text() -> ArchModel:
    """Log-mel features through two strided conv1d, then a sinusoidal-position transformer."""
    from transformers import Speech2TextConfig, Speech2TextForConditionalGeneration

    cfg = Speech2TextConfig(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=2 * HIDDEN,
        decoder_ffn_dim=2 * HIDDEN,
        max_source_positions=POSITIONS,
        max_target_positions=POSITIONS,
        conv_channels=32,
        input_feat_per_channel=16,
        use_cache=False,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    batch = torch.export.Dim("batch", max=64)
    frames = torch.export.Dim("frames", min=8, max=4 * POSITIONS)
    dec = torch.export.Dim("dec_seq", max=POSITIONS)

    def make(b: int, n: int, dseq: int, tag: int) -> dict[str, Any]:
        return {
            "input_features": torch.randn(b, n, 16, generator=_gen(tag)),
            "decoder_input_ids": _ids(b, dseq, tag + 10),
        }

    dyn = {"input_features": {0: batch, 1: frames}, "decoder_input_ids": {0: batch, 1: dec}}
    model = Speech2TextForConditionalGeneration(cfg)
    return ArchModel("speech_to_text", "encdec", model, make(2, 40, 6, 0), make(3, 28, 4, 1), dyn)


@_seeded
def whisper_encoder() -> ArchModel:
    """Whisper's encoder alone with a classification head (the audio-classification variant)."""
    from transformers import WhisperConfig, WhisperForAudioClassification

    cfg = WhisperConfig(
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=2 * HIDDEN,
        decoder_ffn_dim=2 * HIDDEN,
        num_mel_bins=16,
        max_source_positions=16,
        vocab_size=VOCAB,
        classifier_proj_size=32,
        num_labels=5,
    )

    def make(b: int, tag: int) -> dict[str, Any]:
        return {"input_features": torch.randn(b, 16, 32, generator=_gen(tag))}

    dyn = {"input_features": {0: torch.export.Dim("batch", max=64)}}
    model = WhisperForAudioClassification(cfg)
    return ArchModel("whisper_encoder", "audio", model, make(2, 0), make(3, 1), dyn)


@_seeded
def moonshine() -> ArchModel:
    """Raw-audio encoder-decoder with rotary attention on both sides."""
    from transformers import MoonshineConfig, MoonshineForConditionalGeneration

    cfg = MoonshineConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        encoder_num_hidden_layers=LAYERS,
        decoder_num_hidden_layers=LAYERS,
        encoder_num_attention_heads=HEADS,
        decoder_num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
        use_cache=False,
        **_TOKENS,
        decoder_start_token_id=0,
    )
    batch = torch.export.Dim("batch", max=64)
    frames = torch.export.Dim("frames", min=8, max=64)
    dec = torch.export.Dim("dec_seq", max=POSITIONS)

    def make(b: int, n: int, dseq: int, tag: int) -> dict[str, Any]:
        return {
            "input_values": torch.randn(b, n, generator=_gen(tag)),
            "decoder_input_ids": _ids(b, dseq, tag + 10),
        }

    # The conv stem has strides 64, 3, 2: samples = 384 · frames keeps every length exact.
    dyn = {"input_values": {0: batch, 1: 384 * frames}, "decoder_input_ids": {0: batch, 1: dec}}
    model = MoonshineForConditionalGeneration(cfg)
    return ArchModel("moonshine", "encdec", model, make(2, 3840, 6, 0), make(3, 3072, 4, 1), dyn)


# --- second batch: ops the first batch did not reach (FFT, grid_sample, LSTM, scans, ...) ------


@_seeded
def fnet() -> ArchModel:
    """Token mixing by a 2-D FFT (the real part of ``torch.fft.fftn``)."""
    from transformers import FNetConfig, FNetModel

    cfg = FNetConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=POSITIONS,
        pad_token_id=0,
    )
    return _text_case("fnet", "encoder", FNetModel(cfg), mask=False)


@_seeded
def esm() -> ArchModel:
    """Protein LM: rotary attention, token-dropout rescaling by the mask."""
    from transformers import EsmConfig, EsmModel

    cfg = _encoder_config(EsmConfig, position_embedding_type="rotary", mask_token_id=3)
    return _text_case("esm", "encoder", EsmModel(cfg))


@_seeded
def xlnet() -> ArchModel:
    """Two-stream relative attention written with einsum."""
    from transformers import XLNetConfig, XLNetModel

    cfg = XLNetConfig(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        d_inner=2 * HIDDEN,
        **_TOKENS,
    )
    return _text_case("xlnet", "encoder", XLNetModel(cfg))


@_seeded
def roformer() -> ArchModel:
    from transformers import RoFormerConfig, RoFormerModel

    cfg = _encoder_config(RoFormerConfig, embedding_size=32, rotary_value=True)
    return _text_case("roformer", "encoder", RoFormerModel(cfg))


@_seeded
def squeezebert() -> ArchModel:
    """Grouped 1-D convolutions instead of dense layers."""
    from transformers import SqueezeBertConfig, SqueezeBertModel

    cfg = _encoder_config(SqueezeBertConfig, embedding_size=HIDDEN)
    return _text_case("squeezebert", "encoder", SqueezeBertModel(cfg))


@_seeded
def granitemoe() -> ArchModel:
    return _causal_lm(
        "granitemoe",
        "moe",
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
    )


@_seeded
def dbrx() -> ArchModel:
    from transformers import DbrxConfig, DbrxForCausalLM

    cfg = DbrxConfig(
        d_model=HIDDEN,
        n_heads=HEADS,
        n_layers=LAYERS,
        max_seq_len=POSITIONS,
        vocab_size=VOCAB,
        attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        ffn_config={"ffn_hidden_size": HIDDEN, "moe_num_experts": 4, "moe_top_k": 2},
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("dbrx", "moe", DbrxForCausalLM(cfg))


@_seeded
def mamba2() -> ArchModel:
    """Chunked SSD scan (torch path)."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    cfg = Mamba2Config(
        num_heads=4,
        head_dim=32,
        hidden_size=HIDDEN,
        state_size=8,
        num_hidden_layers=LAYERS,
        expand=2,
        n_groups=1,
        chunk_size=4,
        vocab_size=VOCAB,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("mamba2", "ssm", Mamba2ForCausalLM(cfg))


@_seeded
def recurrent_gemma() -> ArchModel:
    """Griffin: RG-LRU recurrence plus local attention."""
    return _causal_lm(
        "recurrent_gemma",
        "ssm",
        "RecurrentGemmaConfig",
        "RecurrentGemmaForCausalLM",
        lru_width=HIDDEN,
        attention_window_size=4,
        conv1d_width=4,
        num_key_value_heads=1,
        block_types=["recurrent", "attention"],
    )


@_seeded
def lfm2() -> ArchModel:
    """Gated short convolutions plus attention."""
    return _causal_lm(
        "lfm2", "ssm", "Lfm2Config", "Lfm2ForCausalLM", layer_types=["conv", "full_attention"]
    )


@_seeded
def deformable_detr() -> ArchModel:
    """Multi-scale deformable attention in PyTorch (``grid_sample``)."""
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection, ResNetConfig

    backbone = ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="basic",
        out_features=["stage1", "stage2"],
    )
    cfg = DeformableDetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_queries=8,
        num_feature_levels=2,
        encoder_n_points=2,
        decoder_n_points=2,
        num_labels=5,
        disable_custom_kernels=True,
    )
    model = DeformableDetrForObjectDetection(cfg)
    _randomize_batchnorm(model)
    return _image_case("deformable_detr", model, size=64)


@_seeded
def dpt() -> ArchModel:
    """ViT backbone, reassemble/fusion neck with bilinear ``align_corners=True`` upsampling."""
    from transformers import DPTConfig, DPTForDepthEstimation

    cfg = DPTConfig(
        **_vit_fields(num_hidden_layers=4),
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[16, 16, 32, 32],
        fusion_hidden_size=16,
    )
    model = DPTForDepthEstimation(cfg)
    _randomize_batchnorm(model)
    return _image_case("dpt", model)


@_seeded
def wav2vec2_conformer() -> ArchModel:
    """Conformer blocks (depthwise conv, GLU) with rotary position embeddings."""
    return _speech_encoder(
        "wav2vec2_conformer",
        "Wav2Vec2ConformerConfig",
        "Wav2Vec2ConformerModel",
        position_embeddings_type="rotary",
        conv_depthwise_kernel_size=3,
    )


@_seeded
def ast() -> ArchModel:
    """Audio Spectrogram Transformer: a ViT over overlapping spectrogram patches."""
    from transformers import ASTConfig, ASTForAudioClassification

    cfg = ASTConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        patch_size=8,
        frequency_stride=8,
        time_stride=8,
        max_length=32,
        num_mel_bins=16,
        num_labels=5,
    )

    def make(b: int, tag: int) -> dict[str, Any]:
        return {"input_values": torch.randn(b, 32, 16, generator=_gen(tag))}

    dyn = {"input_values": {0: torch.export.Dim("batch", max=64)}}
    model = ASTForAudioClassification(cfg)
    return ArchModel("ast", "audio", model, make(2, 0), make(3, 1), dyn)


@_seeded
def encodec() -> ArchModel:
    """Neural audio codec: SEANet convs, an LSTM, residual vector quantization (argmin)."""
    from transformers import EncodecConfig, EncodecModel

    cfg = EncodecConfig(
        hidden_size=32,
        num_filters=4,
        upsampling_ratios=[4, 2],
        num_lstm_layers=1,
        codebook_size=16,
        codebook_dim=32,
        target_bandwidths=[1.5],
        sampling_rate=800,
    )
    batch = torch.export.Dim("batch", max=64)
    frames = torch.export.Dim("frames", min=4, max=64)

    def make(b: int, n: int, tag: int) -> dict[str, Any]:
        return {"input_values": torch.randn(b, 1, n, generator=_gen(tag))}

    dyn = {"input_values": {0: batch, 2: 8 * frames}}
    return ArchModel("encodec", "audio", EncodecModel(cfg), make(2, 96, 0), make(3, 64, 1), dyn)


# --- third batch ---------------------------------------------------------------------------


@_seeded
def upernet() -> ArchModel:
    """ConvNeXt backbone, pyramid pooling (adaptive average pools), bilinear upsampling."""
    from transformers import ConvNextConfig, UperNetConfig, UperNetForSemanticSegmentation

    backbone = ConvNextConfig(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, out_features=["stage1", "stage2"]
    )
    cfg = UperNetConfig(
        backbone_config=backbone,
        hidden_size=32,
        pool_scales=[1, 2, 3],
        use_auxiliary_head=False,
        num_labels=5,
    )
    model = UperNetForSemanticSegmentation(cfg)
    _randomize_batchnorm(model)
    return _image_case("upernet", model)


@_seeded
def mobilevitv2() -> ArchModel:
    """Separable linear self-attention, unfold/fold of patches."""
    from transformers import MobileViTV2Config, MobileViTV2ForImageClassification

    cfg = MobileViTV2Config(image_size=64, width_multiplier=0.25, num_labels=10)
    model = MobileViTV2ForImageClassification(cfg)
    _randomize_batchnorm(model)
    return _image_case("mobilevitv2", model, size=64)


@_seeded
def focalnet() -> ArchModel:
    """Focal modulation (depthwise convs, gated aggregation) instead of attention."""
    from transformers import FocalNetConfig, FocalNetForImageClassification

    cfg = FocalNetConfig(
        image_size=32,
        patch_size=4,
        embed_dim=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_labels=10,
    )
    return _image_case("focalnet", FocalNetForImageClassification(cfg))


@_seeded
def glpn() -> ArchModel:
    """Segformer-style encoder, depth decoder with selective feature fusion."""
    from transformers import GLPNConfig, GLPNForDepthEstimation

    cfg = GLPNConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=16,
        head_in_index=-1,
    )
    model = GLPNForDepthEstimation(cfg)
    _randomize_batchnorm(model)
    return _image_case("glpn", model)


@_seeded
def videomae() -> ArchModel:
    """Video ViT: tubelet (3-D conv) embeddings over frames."""
    from transformers import VideoMAEConfig, VideoMAEForVideoClassification

    cfg = VideoMAEConfig(**_vit_fields(num_labels=5), num_frames=4, tubelet_size=2)

    def make(b: int, tag: int) -> dict[str, Any]:
        return {"pixel_values": torch.randn(b, 4, 3, 32, 32, generator=_gen(tag))}

    dyn = {"pixel_values": {0: torch.export.Dim("batch", max=64)}}
    model = VideoMAEForVideoClassification(cfg)
    return ArchModel("videomae", "vision", model, make(2, 0), make(3, 1), dyn)


@_seeded
def xglm() -> ArchModel:
    """Sinusoidal positions from the ids (padding-aware)."""
    from transformers import XGLMConfig, XGLMForCausalLM

    cfg = XGLMConfig(
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        d_model=HIDDEN,
        ffn_dim=2 * HIDDEN,
        num_layers=LAYERS,
        attention_heads=HEADS,
        use_cache=False,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    return _text_case("xglm", "decoder", XGLMForCausalLM(cfg))


@_seeded
def biogpt() -> ArchModel:
    from transformers import BioGptConfig, BioGptForCausalLM

    cfg = _encoder_config(BioGptConfig, use_cache=False, pad_token_id=1)
    return _text_case("biogpt", "decoder", BioGptForCausalLM(cfg))


@_seeded
def umt5() -> ArchModel:
    """T5 with a relative attention bias in every layer."""
    from transformers import UMT5Config, UMT5ForConditionalGeneration

    cfg = UMT5Config(
        d_model=HIDDEN,
        d_ff=2 * HIDDEN,
        num_layers=LAYERS,
        num_heads=HEADS,
        d_kv=16,
        vocab_size=VOCAB,
        decoder_start_token_id=0,
        use_cache=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    return _seq2seq("umt5", UMT5ForConditionalGeneration(cfg), (6, 4))


@_seeded
def switch_transformers() -> ArchModel:
    """T5 with top-1 routed experts and an expert capacity."""
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration

    cfg = SwitchTransformersConfig(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=16,
        d_ff=2 * HIDDEN,
        expert_capacity=8,
        num_layers=LAYERS,
        num_sparse_encoder_layers=1,
        num_decoder_layers=LAYERS,
        num_sparse_decoder_layers=1,
        num_heads=HEADS,
        num_experts=4,
        use_cache=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return _seq2seq("switch_transformers", SwitchTransformersForConditionalGeneration(cfg), (6, 4))


# --- the registry --------------------------------------------------------------------------------

_NAMES = """
    gemma gemma3_text phi stablelm starcoder2 granite cohere olmo2 smollm3 persimmon bloom mpt
    gptj codegen qwen3_moe deepseek_v3 gpt_oss mamba falcon_mamba jamba bamba rwkv electra
    xlm_roberta mpnet modernbert funnel layoutlm canine convbert big_bird longformer mbart
    marian pegasus m2m100 led t5gemma deit beit dinov2 clip_vision siglip_vision convnextv2
    efficientnet regnet levit mobilevit segformer detr yolos swinv2 poolformer clip_text siglip
    hubert data2vec_audio wavlm sew unispeech_sat speech_to_text whisper_encoder moonshine
    fnet esm xlnet roformer squeezebert granitemoe dbrx mamba2 recurrent_gemma lfm2
    deformable_detr dpt wav2vec2_conformer ast encodec
    upernet mobilevitv2 focalnet glpn videomae xglm biogpt umt5 switch_transformers
"""

#: Every entry, by name (same shape as ``tests.arch_zoo.ARCH_ZOO``).
ARCH_ZOO: dict[str, Callable[[], ArchModel]] = {name: globals()[name] for name in _NAMES.split()}


@functools.cache
def load(name: str) -> ArchModel:
    """The wide-zoo entry ``name``, built once per process."""
    return ARCH_ZOO[name]()


def _reason(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = re.sub(r"\x1b\[[0-9;]*m", "", lines[0] if lines else "")
    return f"{type(exc).__name__}: {text}"[:200]


def _export(name: str, no_grad: bool, dynamic: bool) -> torch.export.ExportedProgram:
    zm = load(name)
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        return torch.export.export(
            zm.module.eval(),
            (),
            _fresh(zm.inputs),
            dynamic_shapes=zm.dynamic_shapes if dynamic else None,
        )


@functools.cache
def export_info(name: str, no_grad: bool = False) -> tuple[torch.export.ExportedProgram, str]:
    """Export entry ``name`` as users do; fall back to static shapes if the dynamic dims fail.

    Cached per process (do not mutate the program).

    Args:
        name: A key of :data:`ARCH_ZOO`.
        no_grad: Export under an outer ``torch.no_grad()`` (default: without, like users).

    Returns:
        The program and ``""`` if it has the dynamic dims, else why the dynamic export failed
        (the program is then static, at the export size).
    """
    try:
        return _export(name, no_grad, dynamic=True), ""
    except Exception as exc:  # any export failure: try static
        reason = _reason(exc)
    return _export(name, no_grad, dynamic=False), reason


def export(name: str, no_grad: bool = False) -> torch.export.ExportedProgram:
    """The program of :func:`export_info` (cached; do not mutate it)."""
    return export_info(name, no_grad)[0]


def sizes(name: str, no_grad: bool = False) -> list[dict[str, Any]]:
    """The input sets entry ``name`` is checked at: both, or the export size if exported static."""
    zm = load(name)
    return zm.sizes() if not export_info(name, no_grad)[1] else [zm.inputs]


@functools.cache
def expected_outputs(name: str, size: int) -> tuple[Any, ...]:
    """Eager outputs of entry ``name`` at size 0 or 1, flattened like the program's outputs."""
    zm = load(name)
    out = zm.eager(zm.sizes()[size])
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return tuple(leaf.detach().numpy() for leaf in leaves if isinstance(leaf, torch.Tensor))


__all__ = ["ARCH_ZOO", "expected_outputs", "export", "export_info", "load", "sizes"]
