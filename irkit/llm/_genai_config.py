"""``genai_config.json``: what onnxruntime-genai's ``Model``/``Generator`` reads beside the ONNX file.

Torch-free: the values come in as numbers and the two JSON files of a Hugging Face folder
(``config.json``, ``generation_config.json``) as mappings. See ``docs/export.md`` for where
each field comes from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from irkit.errors import LoweringOptionsError

__all__ = [
    "GENAI_LLM_TYPES",
    "DEFAULT_MAX_LENGTH",
    "Decoder",
    "TokenIds",
    "context_length",
    "genai_config",
    "genai_model_type",
    "token_ids",
]

#: The ``model.type`` values onnxruntime-genai 0.18 runs as a text-only LLM with the generic
#: decoder inputs (its ``ModelType::IsLLM`` less ``gpt2``, whose genai type expects other input
#: names, and ``lfm2``, a conv-state cache); any other ``model_type`` is written as
#: ``"decoder"``. tests/llm/test_export.py runs a folder under each of them.
GENAI_LLM_TYPES = frozenset(
    {
        "chatglm",
        "decoder",
        "ernie4_5",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gptoss",
        "granite",
        "internlm2",
        "llama",
        "mistral",
        "nemotron",
        "olmo",
        "phi",
        "phimoe",
        "phi3",
        "phi3small",
        "qwen2",
        "qwen3",
        "smollm3",
    }
)
#: ``search.max_length`` when neither ``--max-length`` nor a shorter context is given.
DEFAULT_MAX_LENGTH = 4096

# generation_config.json key → genai search option (same meaning; genai's own default if absent).
_SEARCH_KEYS = (
    "do_sample",
    "num_beams",
    "num_return_sequences",
    "min_length",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "diversity_penalty",
    "early_stopping",
)


@dataclasses.dataclass(frozen=True)
class Decoder:
    """The decoder's sizes and I/O as the exported ONNX model has them.

    Attributes:
        filename: The ONNX file, relative to the folder.
        num_layers: Cached layers (``past_key_values.0..N-1``).
        num_attention_heads: Query heads.
        num_kv_heads: Heads of the cached keys and values.
        head_size: Last dim of the cached keys and values.
        hidden_size: The model's hidden size.
        vocab_size: Width of ``logits``.
        context_length: ``max_position_embeddings``.
        position_ids: Whether the model takes ``position_ids``.
        cache_itemsize: Bytes of one cache element (4 for float32).
        attention_layers: Layers with keys and values (default: all ``num_layers``).
        layer_types: genai's per-layer types (``full_attention``, ``sliding_attention``,
            ``conv``, ``linear_attention``) where the cache holds more than keys and values,
            else empty.
        state_names: ``(genai input key, input format, genai output key, output format)`` of
            each state kind beyond keys and values (``past_conv_names``, ``past.%d.conv``, …).
        conv_cache_size: Width of the convolution states (``K - 1``), or 0.
    """

    filename: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    hidden_size: int
    vocab_size: int
    context_length: int
    position_ids: bool
    cache_itemsize: int = 4
    attention_layers: int | None = None
    layer_types: tuple[str, ...] = ()
    state_names: tuple[tuple[str, str, str, str], ...] = ()
    conv_cache_size: int = 0

    def kv_bytes(self, tokens: int, batch: int = 1) -> int:
        """Bytes of the keys and values of ``tokens`` cached tokens for ``batch`` sequences."""
        layers = self.num_layers if self.attention_layers is None else self.attention_layers
        per_token = 2 * layers * self.num_kv_heads * self.head_size * self.cache_itemsize
        return batch * tokens * per_token


@dataclasses.dataclass(frozen=True)
class TokenIds:
    """bos, the eos list and pad, as :func:`token_ids` resolves them."""

    bos: int | None
    eos: tuple[int, ...]
    pad: int


#: ``config.json`` keys of the longest sequence the model was trained for, first found wins.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
)


def context_length(config: Mapping[str, Any]) -> int:
    """The model's context length from ``config.json``, 0 when it names none (ALiBi models:
    BLOOM has no position limit; :func:`genai_config` then writes ``search.max_length``).

    >>> context_length({"n_positions": 1024}), context_length({"model_type": "bloom"})
    (1024, 0)
    """
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def genai_model_type(model_type: str) -> str:
    """genai's ``model.type`` for a Hugging Face ``model_type``: itself if genai lists it as an
    LLM type, else the generic ``"decoder"``.

    >>> genai_model_type("qwen2"), genai_model_type("gpt2"), genai_model_type("gpt_neox")
    ('qwen2', 'decoder', 'decoder')
    """
    return model_type if model_type in GENAI_LLM_TYPES else "decoder"


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def token_ids(config: Mapping[str, Any], generation: Mapping[str, Any] | None) -> TokenIds:
    """bos, every eos and pad from ``config.json`` and ``generation_config.json``.

    eos is generation_config's list (what ``generate`` stops on) followed by config's ids not in
    it; bos and pad are config's, else generation_config's; pad falls back to the first eos.

    Args:
        config: ``config.json`` (the text config of a multimodal one).
        generation: ``generation_config.json``, or None.

    Returns:
        The :class:`TokenIds`.

    Raises:
        LoweringOptionsError: Neither file names an eos token (genai needs one).

    >>> token_ids({"bos_token_id": 1, "eos_token_id": 2}, {"eos_token_id": [7, 2]})
    TokenIds(bos=1, eos=(7, 2), pad=7)
    """
    generation = generation or {}
    eos: list[int] = []
    for i in _ids(generation.get("eos_token_id")) + _ids(config.get("eos_token_id")):
        if i not in eos:
            eos.append(i)
    if not eos:
        raise LoweringOptionsError(
            "config.json and generation_config.json name no eos_token_id; onnxruntime-genai "
            "needs one to stop: add eos_token_id to generation_config.json"
        )
    bos = _ids(config.get("bos_token_id")) or _ids(generation.get("bos_token_id"))
    pad = _ids(config.get("pad_token_id")) or _ids(generation.get("pad_token_id")) or eos
    return TokenIds(bos=bos[0] if bos else None, eos=tuple(eos), pad=pad[0])


def _search(
    generation: Mapping[str, Any] | None, max_length: int, share_buffer: bool
) -> dict[str, Any]:
    search: dict[str, Any] = {
        key: generation[key]
        for key in _SEARCH_KEYS
        if generation is not None and generation.get(key) is not None
    }
    if search.get("early_stopping") == "never":  # transformers' third value; genai takes a bool
        search["early_stopping"] = False
    search["max_length"] = max_length
    search["past_present_share_buffer"] = share_buffer
    return dict(sorted(search.items()))


def genai_config(
    decoder: Decoder,
    *,
    model_type: str,
    tokens: TokenIds,
    generation: Mapping[str, Any] | None,
    max_length: int,
    share_buffer: bool = False,
    input_names: Sequence[str] = ("input_ids", "attention_mask"),
    provider_options: Sequence[Mapping[str, Any]] = (),
    sliding_window: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``genai_config.json`` content for a decoder exported by :func:`irkit.llm.export`.

    Args:
        decoder: Sizes and I/O of the ONNX model.
        model_type: The Hugging Face ``model_type`` (mapped by :func:`genai_model_type`).
        tokens: bos / eos / pad ids.
        generation: ``generation_config.json`` (search defaults), or None.
        max_length: ``search.max_length`` (prompt + generated tokens).
        share_buffer: ``search.past_present_share_buffer``.
        input_names: The ONNX model's non-cache inputs (``position_ids`` is mapped when present).
        provider_options: ``session_options.provider_options`` (none: the CPU; ``[{"cuda":
            {}}]``: :meth:`irkit.llm._provider.ExecutionProvider.provider_options`).
        sliding_window: ``model.decoder.sliding_window`` (the sliding-window layers' bounded
            buffers: :meth:`irkit.rules.ort.attention.WindowedCache.genai`), or None.

    Returns:
        The JSON object (a dict).
    """
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    if decoder.position_ids and "position_ids" in input_names:
        inputs["position_ids"] = "position_ids"
    outputs = {"logits": "logits"}
    if decoder.attention_layers != 0:
        inputs["past_key_names"] = "past_key_values.%d.key"
        inputs["past_value_names"] = "past_key_values.%d.value"
        outputs["present_key_names"] = "present.%d.key"
        outputs["present_value_names"] = "present.%d.value"
    for past_key, past_format, present_key, present_format in decoder.state_names:
        inputs[past_key] = past_format
        outputs[present_key] = present_format
    model: dict[str, Any] = {
        "type": genai_model_type(model_type),
        "context_length": decoder.context_length or max_length,
        "vocab_size": decoder.vocab_size,
        "eos_token_id": list(tokens.eos),
        "pad_token_id": tokens.pad,
        "decoder": {
            "filename": decoder.filename,
            "session_options": {
                "log_id": "onnxruntime-genai",
                "provider_options": [dict(p) for p in provider_options],
            },
            "head_size": decoder.head_size,
            "hidden_size": decoder.hidden_size,
            "num_attention_heads": decoder.num_attention_heads,
            "num_key_value_heads": decoder.num_kv_heads,
            "num_hidden_layers": decoder.num_layers,
            "inputs": inputs,
            "outputs": outputs,
        },
    }
    if decoder.layer_types:
        model["decoder"]["layer_types"] = list(decoder.layer_types)
    if decoder.conv_cache_size:
        model["decoder"]["conv_cache_size"] = decoder.conv_cache_size
    if sliding_window is not None:
        model["decoder"]["sliding_window"] = dict(sliding_window)
    if tokens.bos is not None:
        model["bos_token_id"] = tokens.bos
    return {"model": model, "search": _search(generation, max_length, share_buffer)}
