"""Export a vision-language model as the three programs onnxruntime-genai's multimodal pipeline runs.

onnxruntime-genai runs a vision-language model (``gemma3``, ``phi3v``, ``qwen2_5_vl``, … in its
``genai_config.json``) as three ONNX models, each a section of that file:

* ``vision``: ``pixel_values`` ``(num_images, channels, height, width)`` → ``image_features``
  ``(num_image_tokens, hidden)``: the vision tower and the projector into the text model's
  hidden size (:func:`export_vision`);
* ``embedding``: ``input_ids`` ``(batch, sequence)`` and ``image_features`` → ``inputs_embeds``
  ``(batch, sequence, hidden)``: the token embedding with every image placeholder token
  replaced by the next row of ``image_features``, in order (:func:`export_embedding`); genai
  runs it at every step, with zero image rows after the prompt;
* ``decoder``: ``inputs_embeds``, ``attention_mask`` (``position_ids``) and the KV cache →
  ``logits`` and the present cache, named as :func:`irkit.llm.export_causal_lm` names them
  (:func:`export_vlm_decoder`).

Each is a ``torch.export`` program of the model's own modules (a shallow copy of the model whose
class overrides ``forward``, so weight names and module paths are the model's own; the model is
not changed) for :func:`irkit.lower`. :func:`vlm_genai_config` and :func:`vlm_processor_config`
write the folder's ``genai_config.json`` and ``processor_config.json``. Tested on transformers'
``Gemma3ForConditionalGeneration`` (all three, in onnxruntime and in genai's ``Generator``) and
``Qwen2_5_VLForConditionalGeneration`` (the embedding and the decoder)
(``tests/llm/test_vlm_recipe.py``); see ``docs/vlm.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from irkit.errors import ExportError, LoweringOptionsError
from irkit.llm._causal_lm import (
    CausalLMExport,
    _bind,
    _export_narrowing,
    _model_line,
    _output_names,
    _positions_limit,
    _register_cache_pytree,
    _torch_inputs,
    _uncached_fake_dispatch,
    _versions,
    _windows_by_position,
    cache_layout,
    causal_lm_feeds,
)
from irkit.llm._genai_config import DEFAULT_MAX_LENGTH, Decoder, genai_config, token_ids
from irkit.llm._meta import fake_weights

__all__ = [
    "GENAI_VLM_FILES",
    "PartExport",
    "export_embedding",
    "export_vision",
    "export_vlm_decoder",
    "vlm_genai_config",
    "vlm_processor_config",
]

#: The ONNX file of each section of a vision-language genai folder, as :func:`vlm_genai_config`
#: names them by default.
GENAI_VLM_FILES = {
    "vision": "vision.onnx",
    "embedding": "embedding.onnx",
    "decoder": "decoder.onnx",
}
#: ``model_type`` values whose genai pipeline :func:`vlm_genai_config` writes (the ones tested
#: in onnxruntime-genai's ``Generator``): genai's other vision types need more inputs
#: (``qwen2_5_vl``: ``image_grid_thw``, 3-d positions; ``phi3v``: ``image_sizes``).
_GENAI_VLM_TYPES = frozenset({"gemma3"})
#: Image placeholders genai 0.18's Gemma 3 processor writes per image (``image_seq_length``).
_GENAI_GEMMA3_IMAGE_TOKENS = 256
#: PIL's resample codes (transformers' ``resample``) → onnxruntime-extensions' interpolation.
_INTERPOLATION = {0: "NEAREST", 1: "LANCZOS", 2: "LINEAR", 3: "CUBIC"}


@dataclasses.dataclass
class PartExport:
    """One program of a vision-language model (:func:`export_vision`, :func:`export_embedding`).

    Attributes:
        program: The ``torch.export.ExportedProgram``.
        input_names: ONNX names of its inputs (pass as ``input_names=``).
        output_names: ONNX names of its outputs (pass as ``output_names=``).
        dynamic_shapes: The ``dynamic_shapes`` given to ``torch.export.export``.
    """

    program: Any
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: Any = None

    def lower_kwargs(self) -> dict[str, Any]:
        """``irkit.lower(program, **kw)``'s keywords: the input and output names."""
        return {"input_names": list(self.input_names), "output_names": list(self.output_names)}


def _vlm_parts(model: Any, what: str) -> tuple[Any, Any]:
    """The model's inner model (``model.model``, which has ``get_image_features``) and config.

    Raises:
        LoweringOptionsError: Not a transformers vision-language model.
    """
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if (
        config is None
        or getattr(config, "vision_config", None) is None
        or getattr(config, "image_token_id", None) is None
        or not callable(getattr(inner, "get_image_features", None))
    ):
        raise LoweringOptionsError(
            f"{what}: {type(model).__name__} is not a transformers vision-language model "
            "(it needs config.vision_config, config.image_token_id and "
            "model.get_image_features); pass e.g. a Gemma3ForConditionalGeneration"
        )
    return inner, config


def _with_forward(model: Any, forward: Callable[..., Any]) -> Any:
    """A shallow copy of ``model`` whose class (a subclass of the model's, of the same name)
    has ``forward``: same parameters, buffers and submodules, so the names are the model's."""
    flat = copy.copy(model)
    flat.__class__ = type(type(model).__name__, (type(model),), {"forward": forward})
    return flat


def _failed(function: str, what: str, exc: BaseException) -> ExportError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = _model_line(exc)
    return ExportError(
        f"{function}: torch.export.export of {what} failed with {_versions()}: "
        f"{type(exc).__name__}{f': {first}' if first else ''}{f' at {where}' if where else ''}\n"
        "Remedy: if the versions are outside the tested range, install one inside it; else "
        "report the model and the chained error (docs/vlm.md lists what is tested)."
    )


def _export(model: Any, function: str, what: str, args: tuple[Any, ...], dynamic: Any) -> Any:
    import torch

    try:
        with _uncached_fake_dispatch(), fake_weights(model):
            return torch.export.export(model, args, dynamic_shapes=dynamic)
    except Exception as exc:
        raise _failed(function, what, exc) from exc


def export_vision(model: Any, *, num_images: int = 2) -> PartExport:
    """Export the vision tower and projector: ``pixel_values`` → ``image_features``.

    ``image_features`` is ``(num_images * tokens_per_image, hidden)`` (rank 2, the images'
    tokens one after the other, as genai's embedding section takes them), computed by the
    model's own ``get_image_features`` (its ``pooler_output``: the projected features).
    ``num_images`` is a dynamic dim; height and width are the config's ``image_size``.

    Args:
        model: A transformers vision-language model whose ``get_image_features`` takes only
            ``pixel_values`` and returns one tensor for all images (Gemma 3); eval mode.
        num_images: Example number of images (≥ 2, so that torch.export keeps it dynamic).

    Returns:
        A :class:`PartExport` with inputs ``["pixel_values"]``, outputs ``["image_features"]``.

    Raises:
        LoweringOptionsError: Not a vision-language model, or ``num_images`` < 2.
        ExportError: ``get_image_features`` takes more than ``pixel_values`` (Qwen2.5-VL's
            ``image_grid_thw``: not supported yet) or the vision config has no ``image_size``,
            or torch.export failed.

    Example:
        >>> import irkit                                                    # doctest: +SKIP
        >>> from irkit.llm import export_vision
        >>> part = export_vision(vlm)                                       # doctest: +SKIP
        >>> onnx_model = irkit.lower(part.program, **part.lower_kwargs())   # doctest: +SKIP
    """
    import torch

    inner, config = _vlm_parts(model, "export_vision")
    if num_images < 2:
        raise LoweringOptionsError(
            f"export_vision: num_images={num_images} would be specialized by torch.export; use >= 2"
        )
    params = inspect.signature(inner.get_image_features).parameters
    more = [
        name
        for name, p in params.items()
        if name != "pixel_values" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    vision = config.vision_config
    if more or not isinstance(getattr(vision, "image_size", None), int):
        needs = f"also takes {', '.join(more)}" if more else "has no vision_config.image_size"
        raise ExportError(
            f"export_vision: {type(model).__name__}.get_image_features {needs}: only vision "
            "towers of fixed-size pixel_values alone are supported yet (Gemma 3); see "
            "docs/vlm.md, 'Next steps'"
        )
    size = int(vision.image_size)
    channels = int(getattr(vision, "num_channels", 3))
    dtype = next(iter(model.parameters())).dtype

    # transformers 5 returns the vision tower's output with the projected features as its
    # pooler_output (return_dict=True); 4.5x's takes pixel_values alone and returns them
    options = (
        {"return_dict": True}
        if "return_dict" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        else {}
    )

    def forward(self: Any, pixel_values: Any) -> Any:
        output = self.model.get_image_features(pixel_values, **options)
        features = output if isinstance(output, torch.Tensor) else output.pooler_output
        return features.reshape(-1, features.shape[-1])

    pixels = torch.randn(num_images, channels, size, size, dtype=dtype)
    dynamic = ({0: torch.export.Dim("num_images", max=1024)},)
    vision_model = _with_forward(model, forward)
    program = _export(vision_model, "export_vision", "the vision tower", (pixels,), dynamic)
    return PartExport(program, ["pixel_values"], ["image_features"], dynamic)


def export_embedding(model: Any) -> PartExport:
    """Export the embedding merge: ``input_ids``, ``image_features`` → ``inputs_embeds``.

    The model's input embedding (its scale included: Gemma's ``sqrt(hidden)``) of ``input_ids``,
    with the row of the k-th image placeholder token (``config.image_token_id``) replaced by row
    k of ``image_features``, in order, as the model's ``forward`` merges them
    (``masked_scatter``). Placeholders beyond the last feature row keep their token's embedding:
    ``image_features`` has zero rows at genai's decode steps, where a generated placeholder id
    is embedded as transformers embeds it without ``pixel_values``. A placeholder id outside the
    vocabulary is looked up as id 0, as Gemma 3 does.

    Args:
        model: A transformers vision-language model that merges by placeholder tokens
            (``config.image_token_id``); eval mode.

    Returns:
        A :class:`PartExport` with inputs ``["input_ids", "image_features"]``, outputs
        ``["inputs_embeds"]``; dims ``batch``, ``sequence``, ``num_image_tokens``.

    Raises:
        LoweringOptionsError: Not a vision-language model.
        ExportError: torch.export failed.

    Example:
        >>> from irkit.llm import export_embedding                         # doctest: +SKIP
        >>> part = export_embedding(vlm)                                    # doctest: +SKIP
        >>> part.input_names, part.output_names                             # doctest: +SKIP
        (['input_ids', 'image_features'], ['inputs_embeds'])
    """
    import torch

    _, config = _vlm_parts(model, "export_embedding")
    image_token = int(config.image_token_id)
    hidden = int(config.get_text_config().hidden_size)
    out_of_vocabulary = image_token >= int(config.get_text_config().vocab_size)
    dtype = next(iter(model.parameters())).dtype

    def forward(self: Any, input_ids: Any, image_features: Any) -> Any:
        is_image = input_ids == image_token
        ids = torch.where(is_image, 0, input_ids) if out_of_vocabulary else input_ids
        embeds = self.get_input_embeddings()(ids)
        # the k-th placeholder takes feature row k while rows last (masked_scatter's order);
        # one more row of zeros keeps the gather's index valid when there are none
        count = image_features.shape[0]
        rows = torch.cat([image_features.to(embeds.dtype), embeds.new_zeros(1, hidden)])
        index = is_image.reshape(-1).long().cumsum(0) - 1
        use = is_image.reshape(-1) & (index < count)
        picked = rows.index_select(0, torch.where(use, index, count)).reshape(embeds.shape)
        return torch.where(use.reshape(is_image.shape).unsqueeze(-1), picked, embeds)

    ids = torch.full((2, 5), 1, dtype=torch.long)
    ids[:, 1:3] = image_token
    features = torch.randn(4, hidden, dtype=dtype)
    dynamic = (
        {0: torch.export.Dim("batch", max=4096), 1: torch.export.Dim("sequence", max=1 << 20)},
        {0: torch.export.Dim("num_image_tokens", max=1 << 20)},
    )
    merge = _with_forward(model, forward)
    program = _export(merge, "export_embedding", "the embedding", (ids, features), dynamic)
    return PartExport(program, ["input_ids", "image_features"], ["inputs_embeds"], dynamic)


def export_vlm_decoder(
    model: Any,
    *,
    batch: int = 2,
    seq: int = 3,
    past: int = 5,
    position_ids: bool | None = None,
    max_sequence: int | None = None,
) -> CausalLMExport:
    """Export a vision-language model's text decoder taking ``inputs_embeds`` and the KV cache.

    As :func:`irkit.llm.export_causal_lm` (the model itself is exported, no wrapper; the same
    dims, cache layout, input and output names), with ``inputs_embeds`` ``(batch, sequence,
    hidden)`` in place of ``input_ids``: the model's ``forward`` runs with ``inputs_embeds``
    and no ``pixel_values``, so the vision tower is not in the program. The attention is the
    model's causal one (no ``token_type_ids``: Gemma 3's bidirectional attention among one
    image's tokens is not exported, as genai's own decoder has none).

    Args:
        model: A transformers vision-language model whose ``forward`` takes ``inputs_embeds``
            and a KV cache (``Gemma3ForConditionalGeneration``); eval mode.
        batch: Example batch size.
        seq: Example number of new tokens.
        past: Example number of cached tokens.
        position_ids: Add a ``position_ids`` input (default: if ``model.forward`` takes it).
        max_sequence: Upper bound of the sequence dims (default: the text config's
            ``max_position_embeddings``).

    Returns:
        A :class:`irkit.llm.CausalLMExport` whose first input is ``inputs_embeds``.

    Raises:
        LoweringOptionsError: Not a transformers model, or unusable sizes.
        ExportError: ``forward`` takes no ``inputs_embeds`` or no cache, the cache holds more
            than keys and values, or torch.export failed.

    Example:
        >>> from irkit.llm import export_vlm_decoder                       # doctest: +SKIP
        >>> exported = export_vlm_decoder(vlm)                              # doctest: +SKIP
        >>> exported.input_names[:2]                                        # doctest: +SKIP
        ['inputs_embeds', 'attention_mask']
    """
    import torch

    if min(batch, seq, past) < 2 or len({batch, seq, past, seq + past}) < 4:
        raise LoweringOptionsError(
            f"export_vlm_decoder: example sizes batch={batch}, seq={seq}, past={past} would be "
            "specialized by torch.export; use distinct sizes >= 2 (e.g. batch=2, seq=3, past=5)"
        )
    binding = _bind(model)
    name = type(model).__name__
    if "inputs_embeds" not in inspect.signature(model.forward).parameters or not binding.cache:
        raise ExportError(
            f"export_vlm_decoder: {name}.forward takes no inputs_embeds or no KV cache; pass a "
            "transformers vision-language model (e.g. Gemma3ForConditionalGeneration)"
        )
    if position_ids is None:
        position_ids = binding.position_ids
    layout = cache_layout(model)
    if layout.states:
        raise ExportError(
            f"export_vlm_decoder: {name}'s cache holds states besides keys and values "
            f"({', '.join(sorted(layout.kinds))}); only KV caches are supported yet"
        )
    _register_cache_pytree()
    text = model.config.get_text_config()
    limit = max_sequence or _positions_limit(_HasConfig(text))
    d_batch = torch.export.Dim("batch", max=4096)
    d_seq = torch.export.Dim("sequence", max=limit)
    d_past = torch.export.Dim("past_sequence", max=limit)
    d_total = torch.export.Dim("total_sequence", min=4, max=2 * limit)
    feeds = causal_lm_feeds(
        model, batch=batch, seq=seq, past=past, position_ids=position_ids, layout=layout
    )
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((batch, seq, int(text.hidden_size))).astype(layout.numpy_dtype())
    layers = layout.num_layers
    kv = {0: d_batch, 2: d_past}
    dynamic: dict[str, Any] = {
        "inputs_embeds": {0: d_batch, 1: d_seq},
        "attention_mask": {0: d_batch, 1: d_total},
        binding.cache: [[kv] * layers, [kv] * layers],
    }
    if binding.use_cache:
        dynamic["use_cache"] = None
    sections = _mrope_sections(text)
    if position_ids and sections:  # M-RoPE: one row of positions per section (t, h, w)
        rows = np.broadcast_to(feeds["position_ids"], (sections, batch, seq))
        feeds["position_ids"] = np.ascontiguousarray(rows)
        dynamic["position_ids"] = {1: d_batch, 2: d_seq}
    elif position_ids:
        dynamic["position_ids"] = {0: d_batch, 1: d_seq}
    try:
        with _uncached_fake_dispatch(), fake_weights(model), _windows_by_position():
            device = next(iter(model.parameters())).device
            inputs = _torch_inputs(model, feeds, lambda a: _tensor(a, layout.dtype, device))
            del inputs["input_ids"]
            inputs = {"inputs_embeds": _tensor(embeds, layout.dtype, device), **inputs}
            program = _export_narrowing(model, inputs, dynamic)
    except Exception as exc:
        raise _failed("export_vlm_decoder", f"{name}'s decoder", exc) from exc
    past_names = [f"past_key_values.{i}.{kind}" for kind in ("key", "value") for i in range(layers)]
    presents = [n.replace("past_key_values", "present") for n in past_names]
    input_names = ["inputs_embeds", "attention_mask"] + (["position_ids"] if position_ids else [])
    return CausalLMExport(
        program=program,
        input_names=input_names + past_names,
        output_names=_output_names(model, program, presents),
        cache=layout,
        position_ids=bool(position_ids),
        dynamic_shapes=dynamic,
    )


def _mrope_sections(text: Any) -> int:
    """Rows of ``position_ids`` a multimodal rotary embedding takes (M-RoPE: Qwen2-VL,
    Qwen2.5-VL: 3, temporal / height / width), 0 for the usual ``(batch, sequence)``."""
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    return len(rope["mrope_section"]) if isinstance(rope, dict) and "mrope_section" in rope else 0


@dataclasses.dataclass(frozen=True)
class _HasConfig:
    config: Any  # (_positions_limit reads model.config; here the text config)


def _tensor(array: np.ndarray, dtype: Any, device: Any) -> Any:
    import torch

    tensor = torch.from_numpy(np.array(array))
    return (tensor.to(dtype) if tensor.is_floating_point() else tensor).to(device)


def vlm_genai_config(
    model: Any,
    decoder: CausalLMExport,
    *,
    max_length: int | None = None,
    files: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``genai_config.json`` content of a vision-language folder: three sections.

    ``model.vision`` (``pixel_values`` → ``image_features``), ``model.embedding``
    (``input_ids``, ``image_features`` → ``inputs_embeds``) and ``model.decoder``
    (``inputs_embeds``, ``attention_mask``, ``position_ids`` if ``decoder`` has it, the KV
    cache → ``logits``, the present cache), ``model.type`` the model's ``model_type`` (genai
    picks its multimodal pipeline by it), the sizes from the text config, and
    ``search.past_present_share_buffer`` false (the decoder concatenates its cache: exported
    with :func:`export_vlm_decoder` and optimized for either target without the shared buffer).

    Args:
        model: The transformers vision-language model (its config is read).
        decoder: What :func:`export_vlm_decoder` returned for it.
        max_length: ``search.max_length`` (default: the context length, at most 4096).
        files: The ONNX file of each section (default :data:`GENAI_VLM_FILES`).

    Returns:
        The JSON object (a dict); write it as ``genai_config.json`` beside the three files.

    Raises:
        LoweringOptionsError: Not a vision-language model, a ``decoder`` that takes
            ``input_ids``, or a ``model_type`` whose genai pipeline needs more inputs than
            ``pixel_values`` (only ``gemma3`` is written yet).

    Example:
        >>> import json                                                     # doctest: +SKIP
        >>> from irkit.llm import vlm_genai_config
        >>> content = vlm_genai_config(vlm, export_vlm_decoder(vlm))        # doctest: +SKIP
        >>> sorted(content["model"])[-3:]                                   # doctest: +SKIP
        ['type', 'vision', 'vocab_size']
    """
    _, config = _vlm_parts(model, "vlm_genai_config")
    model_type = str(config.model_type)
    if model_type not in _GENAI_VLM_TYPES:
        raise LoweringOptionsError(
            f"vlm_genai_config: model_type {model_type!r} is not written yet (only "
            f"{', '.join(sorted(_GENAI_VLM_TYPES))}): its onnxruntime-genai pipeline needs inputs "
            "beyond pixel_values; see docs/vlm.md, 'Next steps'"
        )
    if not decoder.input_names or decoder.input_names[0] != "inputs_embeds":
        raise LoweringOptionsError(
            "vlm_genai_config: the decoder takes "
            f"{decoder.input_names[0] if decoder.input_names else 'nothing'}, not inputs_embeds; "
            "export it with export_vlm_decoder"
        )
    names = {**GENAI_VLM_FILES, **(files or {})}
    text = config.get_text_config()
    settings = {**text.to_dict(), **{k: v for k, v in config.to_dict().items() if v is not None}}
    context = int(getattr(text, "max_position_embeddings", 0) or 0)
    length = max_length or min(context or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH)
    sizes = Decoder(
        filename=names["decoder"],
        num_layers=decoder.num_layers,
        num_attention_heads=int(text.num_attention_heads),
        num_kv_heads=decoder.num_kv_heads,
        head_size=decoder.head_dim,
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
        context_length=context,
        position_ids=decoder.position_ids,
    )
    content = genai_config(
        sizes,
        model_type=model_type,
        tokens=token_ids(settings, None),
        generation=None,
        max_length=length,
        input_names=decoder.input_names,
    )
    section = content["model"]
    section["type"] = model_type
    inputs = {k: v for k, v in section["decoder"]["inputs"].items() if k != "input_ids"}
    section["decoder"]["inputs"] = {"inputs_embeds": "inputs_embeds", **inputs}
    section["embedding"] = {
        "filename": names["embedding"],
        "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
        "outputs": {"inputs_embeds": "inputs_embeds"},
    }
    section["vision"] = {
        "filename": names["vision"],
        "inputs": {"pixel_values": "pixel_values"},
        "outputs": {"image_features": "image_features"},
    }
    section["image_token_id"] = int(config.image_token_id)
    return content


def vlm_processor_config(
    model: Any, preprocessor: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``processor_config.json`` content genai's image processor reads (onnxruntime-extensions).

    ``model.create_multimodal_processor()`` turns a prompt and image files into ``input_ids``
    (each ``<start_of_image>`` expanded to 256 ``<image_soft_token>`` between
    ``<start_of_image>``/``<end_of_image>``), ``pixel_values`` and ``num_image_tokens`` with this
    pipeline: decode (RGB), resize to the vision config's ``image_size`` square, rescale,
    normalize, channels first — the Hugging Face image processor's steps, its values read from
    ``preprocessor`` (``image_mean``, ``image_std``, ``rescale_factor``, ``resample``; Gemma 3's
    defaults where absent: 0.5, 0.5, 1/255, bilinear).

    Args:
        model: The transformers vision-language model (``gemma3``).
        preprocessor: The model folder's ``preprocessor_config.json``, or None.

    Returns:
        The JSON object (a dict); write it as ``processor_config.json`` beside
        ``genai_config.json`` (and the tokenizer files, which must spell the three image tokens).

    Raises:
        LoweringOptionsError: Not a ``gemma3`` vision-language model, ``mm_tokens_per_image``
            other than the 256 genai's processor writes, pan-and-scan asked for, or a
            ``resample`` code without an onnxruntime-extensions counterpart.

    Example:
        >>> from irkit.llm import vlm_processor_config                     # doctest: +SKIP
        >>> steps = vlm_processor_config(vlm)["processor"]["transforms"]    # doctest: +SKIP
        >>> [step["operation"]["type"] for step in steps]                   # doctest: +SKIP
        ['DecodeImage', 'Resize', 'Rescale', 'Normalize', 'Permute3D']
    """
    _, config = _vlm_parts(model, "vlm_processor_config")
    if str(config.model_type) != "gemma3":
        raise LoweringOptionsError(
            f"vlm_processor_config: model_type {config.model_type!r}: only gemma3's image "
            "processor is written yet; see docs/vlm.md, 'Next steps'"
        )
    tokens = int(getattr(config, "mm_tokens_per_image", 0))
    if tokens != _GENAI_GEMMA3_IMAGE_TOKENS:
        raise LoweringOptionsError(
            f"vlm_processor_config: mm_tokens_per_image is {tokens}, but onnxruntime-genai's "
            f"Gemma 3 processor writes {_GENAI_GEMMA3_IMAGE_TOKENS} placeholders per image; give "
            "genai the tensors yourself (generator.set_inputs with input_ids, pixel_values, "
            "num_image_tokens) instead of its processor"
        )
    settings = dict(preprocessor or {})
    if settings.get("do_pan_and_scan"):
        raise LoweringOptionsError(
            "vlm_processor_config: do_pan_and_scan is set in preprocessor_config.json; genai's "
            "Gemma 3 processor makes one crop per image: set it false"
        )
    resample = int(settings.get("resample", 2))
    if resample not in _INTERPOLATION:
        raise LoweringOptionsError(
            f"vlm_processor_config: resample {resample} has no onnxruntime-extensions "
            f"interpolation (known: {sorted(_INTERPOLATION)})"
        )
    size = int(config.vision_config.image_size)
    mean = [float(v) for v in settings.get("image_mean", [0.5, 0.5, 0.5])]
    std = [float(v) for v in settings.get("image_std", [0.5, 0.5, 0.5])]

    def step(name: str, kind: str, **attrs: Any) -> dict[str, Any]:
        operation: dict[str, Any] = {"name": name, "type": kind}
        if attrs:
            operation["attrs"] = attrs
        return {"operation": operation}

    transforms = [
        step("decode_image", "DecodeImage", color_space="RGB"),
        step(
            "resize",
            "Resize",
            interpolation=_INTERPOLATION[resample],
            width=size,
            height=size,
            keep_aspect_ratio=0,
        ),
        step("rescale", "Rescale", rescale_factor=float(settings.get("rescale_factor", 1 / 255))),
        step("normalize", "Normalize", mean=mean, std=std),
        step("to_channel_first", "Permute3D", dims=[2, 0, 1]),
    ]
    return {"processor": {"name": "gemma_3_image_processing", "transforms": transforms}}
