"""The architecture zoo: current transformers architectures, exported the way users export them.

Every entry is a tiny configuration (hidden size 32–64, 2 layers, vocabulary 128, random weights,
fixed seed) of a real transformers class, so the zoo tests irkit on modelling code nobody here
wrote. :func:`export` exports each model as a user does::

    torch.export.export(model.eval(), (), inputs, dynamic_shapes=...)

with named ``torch.export.Dim`` s (``batch``, ``seq``; image models ``batch``; audio ``batch`` and
``frames``, samples = 10 · frames) and *without* an outer ``torch.no_grad()`` (``no_grad=True``
gives that variant).
Each entry also carries inputs at a second size so the dynamic dims are exercised.

``llama_kv`` is a Llama decoder with a KV cache as input and output, exported the way
transformers' own ``export_with_dynamic_cache`` does: ``DynamicCache`` registered as a pytree
node, ``use_cache=True`` passed as a keyword (torch.export specializes it: it is not a tensor
input). The ONNX names come from :attr:`ArchModel.input_names` / :attr:`ArchModel.output_names`
(``past_key_values.N.key`` → ``present.N.key``, dynamic ``past`` length).

Programs are cached per process (:func:`export`); callers must not mutate them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

SEED = 0
HIDDEN = 64
LAYERS = 2
HEADS = 4
VOCAB = 128
POSITIONS = 64

# The two sizes every sequence model runs at: the export size, and a second one.
SIZE_A = (2, 8)  # (batch, seq)
SIZE_B = (3, 5)


@dataclasses.dataclass
class ArchModel:
    """One zoo entry.

    Attributes:
        name: Short name (``"llama"``).
        family: ``decoder``, ``moe``, ``encoder``, ``encdec``, ``vision``, ``audio`` or ``kv``.
        module: The eager module, in eval mode.
        inputs: Keyword inputs at the export size (graph input order is this order).
        inputs_b: The same inputs at a second size (dynamic dims changed).
        dynamic_shapes: ``dynamic_shapes`` for ``torch.export.export`` (keyed like ``inputs``).
        input_names: ONNX input names to pass to ``irkit.lower`` (``None``: irkit's default).
        output_names: ONNX output names to pass to ``irkit.lower`` (``None``: irkit's default).
        lower_options: More keyword arguments for ``irkit.lower`` (the switches a user of this
            model needs, such as ``decompose_custom_ops``).
    """

    name: str
    family: str
    module: nn.Module
    inputs: dict[str, Any]
    inputs_b: dict[str, Any]
    dynamic_shapes: dict[str, Any]
    input_names: list[str] | None = None
    output_names: list[str] | None = None
    lower_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def sizes(self) -> list[dict[str, Any]]:
        """Both input sets: the export size first."""
        return [self.inputs, self.inputs_b]

    def eager(self, inputs: dict[str, Any]) -> Any:
        """Run the eager module on ``inputs`` (a fresh copy of any cache) under ``no_grad``."""
        with torch.no_grad():
            return self.module(**_fresh(inputs))

    def feeds(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """``inputs`` flattened to the program's tensor inputs, in graph-input order."""
        if self.family == "kv":
            register_cache_pytree()  # else the cache would be one opaque leaf
        leaves, _ = torch.utils._pytree.tree_flatten(list(inputs.values()))
        return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _fresh(inputs: dict[str, Any]) -> dict[str, Any]:
    """Copy cache objects (the model appends to them in place)."""
    from transformers import DynamicCache

    out = {}
    for key, value in inputs.items():
        if isinstance(value, DynamicCache):
            value = _dynamic_cache([(layer.keys, layer.values) for layer in value.layers])
        out[key] = value
    return out


# --- inputs --------------------------------------------------------------------------------------


def _gen(tag: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + tag)


def _ids(batch: int, seq: int, tag: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, seq), generator=_gen(tag))


def _mask(batch: int, seq: int) -> torch.Tensor:
    """All ones but the last row, which is right-padded by two positions."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, -2:] = 0
    return mask


def _text(batch: int, seq: int, tag: int, mask: bool = True) -> dict[str, Any]:
    inputs: dict[str, Any] = {"input_ids": _ids(batch, seq, tag)}
    if mask:
        inputs["attention_mask"] = _mask(batch, seq)
    return inputs


def _dims(max_seq: int = POSITIONS) -> tuple[torch.export.Dim, torch.export.Dim]:
    return torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=max_seq)


def _text_case(name: str, family: str, module: nn.Module, mask: bool = True) -> ArchModel:
    batch, seq = _dims()
    dyn: dict[str, Any] = {"input_ids": {0: batch, 1: seq}}
    if mask:
        dyn["attention_mask"] = {0: batch, 1: seq}
    return ArchModel(name, family, module, _text(*SIZE_A, 0, mask), _text(*SIZE_B, 1, mask), dyn)


def _seeded(fn: Callable[[], ArchModel]) -> Callable[[], ArchModel]:
    @functools.wraps(fn)
    def wrapper() -> ArchModel:
        torch.manual_seed(SEED)
        zm = fn()
        zm.module.eval()
        return zm

    return wrapper


_TOKENS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def _decoder_config(config_cls: type, **overrides: Any) -> Any:
    """Common Llama-family config fields; ``overrides`` win."""
    fields: dict[str, Any] = dict(
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        use_cache=False,
        **_TOKENS,
    )
    fields.update(overrides)
    return config_cls(**fields)


def _causal_lm(name: str, family: str, config_name: str, model_name: str, **overrides: Any):
    import transformers

    cfg = _decoder_config(getattr(transformers, config_name), **overrides)
    return _text_case(name, family, getattr(transformers, model_name)(cfg))


# The default ``grouped_mm`` experts run the custom op ``transformers::grouped_mm_fallback`` on
# CPU in float32 under torch.export: irkit lowers it as the ``aten._grouped_mm`` it computes.


# --- decoder LMs ---------------------------------------------------------------------------------


@_seeded
def llama() -> ArchModel:
    return _causal_lm("llama", "decoder", "LlamaConfig", "LlamaForCausalLM")


@_seeded
def mistral() -> ArchModel:
    return _causal_lm("mistral", "decoder", "MistralConfig", "MistralForCausalLM")


@_seeded
def qwen2() -> ArchModel:
    return _causal_lm("qwen2", "decoder", "Qwen2Config", "Qwen2ForCausalLM")


@_seeded
def qwen3() -> ArchModel:
    return _causal_lm("qwen3", "decoder", "Qwen3Config", "Qwen3ForCausalLM", head_dim=16)


@_seeded
def phi3() -> ArchModel:
    return _causal_lm("phi3", "decoder", "Phi3Config", "Phi3ForCausalLM")


@_seeded
def gemma2() -> ArchModel:
    return _causal_lm(
        "gemma2", "decoder", "Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=4
    )


@_seeded
def gpt_neox() -> ArchModel:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("gpt_neox", "decoder", GPTNeoXForCausalLM(cfg))


@_seeded
def falcon() -> ArchModel:
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("falcon", "decoder", FalconForCausalLM(cfg))


@_seeded
def opt() -> ArchModel:
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(
        hidden_size=HIDDEN,
        ffn_dim=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        word_embed_proj_dim=HIDDEN,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        use_cache=False,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=2,
    )
    return _text_case("opt", "decoder", OPTForCausalLM(cfg))


@_seeded
def gpt2() -> ArchModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        use_cache=False,
        **_TOKENS,
    )
    return _text_case("gpt2", "decoder", GPT2LMHeadModel(cfg))


# --- mixture of experts --------------------------------------------------------------------------


@_seeded
def mixtral() -> ArchModel:
    zm = _causal_lm(
        "mixtral",
        "moe",
        "MixtralConfig",
        "MixtralForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    return zm


@_seeded
def qwen2_moe() -> ArchModel:
    zm = _causal_lm(
        "qwen2_moe",
        "moe",
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=HIDDEN,
        shared_expert_intermediate_size=HIDDEN,
    )
    return zm


@_seeded
def olmoe() -> ArchModel:
    """OLMoE with the ``batched_mm`` experts, the implementation transformers' own exporters pick.

    (Mixtral and Qwen2-MoE keep the default ``grouped_mm``, whose CPU path is the custom op
    ``transformers::grouped_mm_fallback``.)
    """
    import transformers

    cfg = _decoder_config(transformers.OlmoeConfig, num_experts=4, num_experts_per_tok=2)
    model = transformers.OlmoeForCausalLM(cfg)
    model.set_experts_implementation("batched_mm")
    return _text_case("olmoe", "moe", model)


# --- encoders ------------------------------------------------------------------------------------


def _encoder_config(config_cls: type, **overrides: Any) -> Any:
    fields: dict[str, Any] = dict(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        pad_token_id=0,
    )
    fields.update(overrides)
    return config_cls(**fields)


@_seeded
def bert() -> ArchModel:
    from transformers import BertConfig, BertModel

    return _text_case("bert", "encoder", BertModel(_encoder_config(BertConfig)))


@_seeded
def roberta() -> ArchModel:
    from transformers import RobertaConfig, RobertaModel

    # RoBERTa's positions start after pad_token_id + 1.
    cfg = _encoder_config(RobertaConfig, pad_token_id=1, max_position_embeddings=POSITIONS + 2)
    return _text_case("roberta", "encoder", RobertaModel(cfg))


@_seeded
def deberta_v2() -> ArchModel:
    from transformers import DebertaV2Config, DebertaV2Model

    cfg = _encoder_config(
        DebertaV2Config,
        relative_attention=True,
        position_buckets=8,
        max_relative_positions=16,
        pos_att_type=["p2c", "c2p"],
    )
    return _text_case("deberta_v2", "encoder", DebertaV2Model(cfg))


@_seeded
def distilbert() -> ArchModel:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(
        dim=HIDDEN,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=2 * HIDDEN,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
        pad_token_id=0,
    )
    return _text_case("distilbert", "encoder", DistilBertModel(cfg))


@_seeded
def albert() -> ArchModel:
    from transformers import AlbertConfig, AlbertModel

    cfg = _encoder_config(AlbertConfig, embedding_size=32)
    return _text_case("albert", "encoder", AlbertModel(cfg))


# --- encoder-decoders ----------------------------------------------------------------------------


def _seq2seq(name: str, module: nn.Module, dec_seq: tuple[int, int]) -> ArchModel:
    batch, seq = _dims()
    dec = torch.export.Dim("dec_seq", max=POSITIONS)

    def make(size: tuple[int, int], dseq: int, tag: int) -> dict[str, Any]:
        inputs = _text(*size, tag)
        inputs["decoder_input_ids"] = _ids(size[0], dseq, tag + 10)
        return inputs

    dyn = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: seq},
        "decoder_input_ids": {0: batch, 1: dec},
    }
    return ArchModel(
        name, "encdec", module, make(SIZE_A, dec_seq[0], 0), make(SIZE_B, dec_seq[1], 1), dyn
    )


@_seeded
def t5() -> ArchModel:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
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
    return _seq2seq("t5", T5ForConditionalGeneration(cfg), (6, 4))


@_seeded
def bart() -> ArchModel:
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(
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
    return _seq2seq("bart", BartForConditionalGeneration(cfg), (6, 4))


@_seeded
def whisper() -> ArchModel:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

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
        max_target_positions=32,
        vocab_size=VOCAB,
        use_cache=False,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
    )
    batch, dec = torch.export.Dim("batch", max=64), torch.export.Dim("dec_seq", max=32)

    def make(b: int, dseq: int, tag: int) -> dict[str, Any]:
        # Whisper's encoder takes exactly 2 * max_source_positions frames.
        return {
            "input_features": torch.randn(b, 16, 32, generator=_gen(tag)),
            "decoder_input_ids": _ids(b, dseq, tag + 10),
        }

    dyn = {"input_features": {0: batch}, "decoder_input_ids": {0: batch, 1: dec}}
    return ArchModel(
        "whisper",
        "encdec",
        WhisperForConditionalGeneration(cfg),
        make(2, 6, 0),
        make(3, 4, 1),
        dyn,
    )


# --- vision --------------------------------------------------------------------------------------


def _image_case(name: str, module: nn.Module, size: int = 32) -> ArchModel:
    def make(b: int, tag: int) -> dict[str, Any]:
        return {"pixel_values": torch.randn(b, 3, size, size, generator=_gen(tag))}

    dyn = {"pixel_values": {0: torch.export.Dim("batch", max=64)}}
    return ArchModel(name, "vision", module, make(2, 0), make(3, 1), dyn)


def _randomize_batchnorm(module: nn.Module) -> None:
    """Non-trivial running statistics so eval-mode BatchNorm is really exercised."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)


@_seeded
def resnet() -> ArchModel:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="bottleneck",
        num_labels=10,
    )
    model = ResNetForImageClassification(cfg)
    _randomize_batchnorm(model)
    return _image_case("resnet", model)


@_seeded
def convnext() -> ArchModel:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10)
    return _image_case("convnext", ConvNextForImageClassification(cfg))


@_seeded
def vit() -> ArchModel:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        image_size=32,
        patch_size=8,
        num_labels=10,
    )
    return _image_case("vit", ViTForImageClassification(cfg))


@_seeded
def swin() -> ArchModel:
    from transformers import SwinConfig, SwinForImageClassification

    cfg = SwinConfig(
        image_size=32,
        patch_size=2,
        embed_dim=32,
        depths=[1, 1],
        num_heads=[2, 4],
        window_size=4,
        num_labels=10,
    )
    return _image_case("swin", SwinForImageClassification(cfg))


@_seeded
def mobilenet_v2() -> ArchModel:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    cfg = MobileNetV2Config(image_size=32, depth_multiplier=0.35, num_labels=10)
    model = MobileNetV2ForImageClassification(cfg)
    _randomize_batchnorm(model)
    return _image_case("mobilenet_v2", model)


# --- audio ---------------------------------------------------------------------------------------


@_seeded
def wav2vec2() -> ArchModel:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(
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
        do_stable_layer_norm=True,
        feat_extract_norm="layer",
    )
    # The feature extractor's guards want the sample count as a multiple of its first stride
    # (torch.export's own suggested fix).
    batch, frames = torch.export.Dim("batch", max=64), torch.export.Dim("frames", min=8, max=400)
    samples = 10 * frames

    def make(b: int, n: int, tag: int) -> dict[str, Any]:
        return {"input_values": torch.randn(b, n, generator=_gen(tag))}

    dyn = {"input_values": {0: batch, 1: samples}}
    return ArchModel("wav2vec2", "audio", Wav2Vec2Model(cfg), make(2, 400, 0), make(3, 270, 1), dyn)


# --- a decoder with a KV cache as input and output -----------------------------------------------


def _dynamic_cache(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (key, value) in enumerate(layers):
        cache.update(key.clone(), value.clone(), i)
    return cache


def register_cache_pytree() -> None:
    """Register ``DynamicCache`` as a pytree node the way transformers' export helpers do.

    Idempotent (transformers' helper tolerates a second registration). Needed before exporting
    or flattening ``llama_kv``.
    """
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    register_dynamic_cache_export_support()


@_seeded
def llama_kv() -> ArchModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    register_cache_pytree()
    cfg = _decoder_config(LlamaConfig, use_cache=True)
    model = LlamaForCausalLM(cfg)
    kv_heads, head_dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    # The cache argument by the forward signature: `cache` (transformers 5.2x) or `past_key_values`.
    params = inspect.signature(model.forward).parameters
    cache_arg = next(name for name in ("cache", "past_key_values") if name in params)

    def make(batch: int, seq: int, past: int, tag: int) -> dict[str, Any]:
        g = _gen(tag)
        layers = [
            (
                torch.randn(batch, kv_heads, past, head_dim, generator=g),
                torch.randn(batch, kv_heads, past, head_dim, generator=g),
            )
            for _ in range(LAYERS)
        ]
        return {
            "input_ids": _ids(batch, seq, tag),
            "attention_mask": torch.ones(batch, past + seq, dtype=torch.long),
            cache_arg: _dynamic_cache(layers),
            "use_cache": True,  # as transformers' export_with_dynamic_cache passes it
        }

    batch, seq = _dims()
    past = torch.export.Dim("past", min=1, max=POSITIONS)
    kv = {0: batch, 2: past}
    dyn = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: torch.export.Dim("total", min=4, max=2 * POSITIONS)},
        cache_arg: [[kv] * LAYERS, [kv] * LAYERS],
        "use_cache": None,
    }
    # The pytree of a DynamicCache flattens all keys, then all values.
    names = [f"past_key_values.{i}.key" for i in range(LAYERS)] + [
        f"past_key_values.{i}.value" for i in range(LAYERS)
    ]
    outputs = ["logits"] + [n.replace("past_key_values", "present") for n in names]
    return ArchModel(
        "llama_kv",
        "kv",
        model,
        make(2, 3, 5, 0),
        make(3, 2, 7, 1),
        dyn,
        input_names=["input_ids", "attention_mask", *names],
        output_names=outputs,
    )


# --- the registry --------------------------------------------------------------------------------

ARCH_ZOO: dict[str, Callable[[], ArchModel]] = {
    fn.__name__: fn
    for fn in (
        llama,
        mistral,
        qwen2,
        qwen3,
        phi3,
        gemma2,
        gpt_neox,
        falcon,
        opt,
        gpt2,
        mixtral,
        qwen2_moe,
        olmoe,
        bert,
        roberta,
        deberta_v2,
        distilbert,
        albert,
        t5,
        bart,
        whisper,
        resnet,
        convnext,
        vit,
        swin,
        mobilenet_v2,
        wav2vec2,
        llama_kv,
    )
}


@functools.cache
def load(name: str) -> ArchModel:
    """The zoo entry ``name``, built once per process."""
    return ARCH_ZOO[name]()


@functools.cache
def export(name: str, no_grad: bool = False) -> torch.export.ExportedProgram:
    """Export zoo entry ``name`` as users do, cached per process. Do not mutate the result.

    Args:
        name: A key of :data:`ARCH_ZOO`.
        no_grad: Export under an outer ``torch.no_grad()`` (default: without, like users).
    """
    zm = load(name)
    if zm.family == "kv":
        register_cache_pytree()
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        return torch.export.export(
            zm.module.eval(), (), _fresh(zm.inputs), dynamic_shapes=zm.dynamic_shapes
        )


@functools.cache
def expected_outputs(name: str, size: int) -> tuple[Any, ...]:
    """Eager outputs of entry ``name`` at size 0 or 1, flattened like the program's outputs.

    Cached per process (numpy arrays: do not mutate them).
    """
    zm = load(name)
    out = zm.eager(zm.sizes()[size])
    if zm.family == "kv":
        register_cache_pytree()
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return tuple(leaf.detach().numpy() for leaf in leaves if isinstance(leaf, torch.Tensor))
