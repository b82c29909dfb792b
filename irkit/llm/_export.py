"""``irkit.llm.export``: a Hugging Face causal-LM folder → a folder onnxruntime-genai runs.

The model is built from ``config.json`` with its parameters on the ``meta`` device
(:func:`irkit.llm._meta.meta_causal_lm`), exported with its KV cache
(:func:`irkit.llm.export_causal_lm`), lowered and optimized, and saved with the weights
streamed from the folder's safetensors shards into ``model.onnx.data`` (``irkit.save(...,
weights=folder)``): no weight is ever in memory. Everything is written into a temporary folder
beside the output folder, renamed into place at the end. See ``docs/export.md``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from irkit.errors import LoweringOptionsError, ModelLoadError, SaveError
from irkit.llm._genai_config import (
    DEFAULT_MAX_LENGTH,
    Decoder,
    context_length,
    genai_config,
    token_ids,
)
from irkit.llm._progress import Progress
from irkit.llm._provider import ExecutionProvider

__all__ = ["PRECISIONS", "TARGETS", "ExportedFolder", "export", "tokenizer_files"]

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_INLINE_BYTES = 256  # irkit.save keeps initializers this small inside model.onnx (_io)

PRECISIONS = ("fp32", "fp16", "int4", "int8")
TARGETS = ("onnx", "ort")
_ONNX_FILE = "model.onnx"
_TOKENIZER_PATTERNS = (
    "tokenizer*.json",
    "tokenizer.model",
    "*.tiktoken",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "sentencepiece*.model",
    "chat_template.jinja",
    "chat_template.json",
    "processor_config.json",
)
_COPIED = ("config.json", "generation_config.json")


@dataclasses.dataclass(frozen=True)
class ExportedFolder:
    """What :func:`export` wrote.

    Attributes:
        path: The output folder.
        files: The file names in it.
        genai_config: The ``genai_config.json`` content.
        kv_cache_bytes: Bytes of the KV cache of one sequence of ``search.max_length`` tokens.
    """

    path: pathlib.Path
    files: tuple[str, ...]
    genai_config: dict[str, Any]
    kv_cache_bytes: int


def tokenizer_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """The tokenizer and chat-template files of a Hugging Face folder (sorted, no duplicates)."""
    found = {p for pattern in _TOKENIZER_PATTERNS for p in folder.glob(pattern) if p.is_file()}
    return sorted(found, key=lambda p: p.name)


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{str(path)!r}: cannot be read as JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{str(path)!r}: is not a JSON object")
    return data


def _check_folder(folder: pathlib.Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise ModelLoadError(
            f"{str(folder)!r}: not a folder; pass a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer files), e.g. one save_pretrained wrote"
        )
    config = folder / "config.json"
    if not config.is_file():
        raise ModelLoadError(
            f"{str(config)!r}: missing; a Hugging Face model folder has its config.json "
            "(model.config.save_pretrained(folder) writes it)"
        )
    if not any(folder.glob("*.safetensors")):
        other = sorted(p.name for p in folder.glob("*.bin")) + sorted(
            p.name for p in folder.glob("*.pt")
        )
        hint = (
            f" (it has {', '.join(other)}: convert with "
            "model.save_pretrained(folder, safe_serialization=True))"
            if other
            else ""
        )
        raise ModelLoadError(
            f"{str(folder)!r}: no *.safetensors weights{hint}; irkit export streams the weights "
            "from safetensors shards"
        )
    return _read_json(config)


def _check_output(out: pathlib.Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise SaveError(f"{str(out)!r}: exists and is not a folder; name a folder to write")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise SaveError(
            f"{str(out)!r}: the folder is not empty; pass overwrite=True (--overwrite) to "
            "replace it, or name a new folder"
        )
    if not out.parent.is_dir():
        raise SaveError(f"{str(out.parent)!r}: the folder to write {out.name!r} in does not exist")


def _check_options(precision: str, target: str) -> None:
    if precision not in PRECISIONS:
        raise LoweringOptionsError(
            f"export: precision {precision!r} is not one of {', '.join(PRECISIONS)}"
        )
    if target not in TARGETS:
        raise LoweringOptionsError(f"export: target {target!r} is not one of {', '.join(TARGETS)}")


_QUANTIZED_BITS = {"int4": 4, "int8": 8}


def _quantize(
    model: Any, precision: str, say: Callable[[str], None], accuracy_level: int | None = None
) -> None:
    import irkit
    from irkit.rules.quantize import Embeddings

    bits = _QUANTIZED_BITS[precision]
    report = irkit.QuantizeReport()
    # a table tied to the lm_head is gathered from the lm_head's packed initializer
    # (GatherBlockQuantized), as the builder does: no float copy of it in the folder
    irkit.quantize(
        model,
        bits=bits,
        report=report,
        accuracy_level=accuracy_level,
        embeddings=Embeddings.TIED,
    )
    gathers = sum(1 for q in report.quantized if q.op_type == "Gather")
    also = f", {gathers} tied embedding(s) → GatherBlockQuantized" if gathers else ""
    say(
        f"{precision}: {len(report.quantized) - gathers} matmul(s) → MatMulNBits ({bits} bits)"
        f"{also}, {len(report.skipped)} left in float"
    )


def _config(folder: pathlib.Path, raw: dict[str, Any], trust_remote_code: bool) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = raw.get("model_type")
    known = model_type in CONFIG_MAPPING
    if raw.get("auto_map") and not known and not trust_remote_code:
        raise ModelLoadError(
            f"{str(folder / 'config.json')!r}: model_type {model_type!r} is defined by code in "
            "the folder (auto_map), which runs only with trust_remote_code=True "
            "(--trust-remote-code); read that code first"
        )
    if not known and not raw.get("auto_map"):
        import transformers

        raise ModelLoadError(
            f"{str(folder / 'config.json')!r}: transformers {transformers.__version__} does "
            f"not know model_type {model_type!r}; install a transformers that does"
        )
    try:
        return AutoConfig.from_pretrained(
            folder, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:
        raise ModelLoadError(
            f"{str(folder / 'config.json')!r}: transformers cannot read it: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from exc


def _build(folder: pathlib.Path, config: Any, trust_remote_code: bool, dtype: str) -> Any:
    from irkit.llm._precision import meta_model

    try:
        return meta_model(config, dtype, trust_remote_code=trust_remote_code)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelLoadError(
            f"{str(folder / 'config.json')!r}: transformers cannot build a causal LM from it "
            f"(AutoModelForCausalLM.from_config: {type(exc).__name__}: {first}); is it a "
            "decoder-only language model?"
        ) from exc


def _genai_layer_types(model_type: str, layout: Any, text_config: Any) -> tuple[str, ...]:
    """genai's ``layer_types`` for a cache with state kinds: per layer, from the kinds it holds.

    Every key/value layer is ``full_attention``, a sliding-window one too: the exported keys and
    values grow with the sequence and the window is the graph's own mask, which is what genai
    0.18 carries as ``full_attention`` (it knows no other attention type there: a
    ``sliding_attention`` layer is read as a state layer, ``past.N.conv``).

    Raises:
        LoweringOptionsError: A layer holds keys/values and a state (one hybrid layer), a
            recurrent state without a convolution state, or several states of one kind:
            onnxruntime-genai 0.18 has no such layer type.
    """
    kinds: dict[int, set[str]] = {}
    for spec in layout.states:
        kinds.setdefault(spec.layer, set()).add(spec.kind.name)
        if spec.index:  # genai maps one past/present name per layer and kind
            kinds[spec.layer].add(f"{spec.kind.name} #{spec.index + 1}")
    types = []
    for layer in range(layout.num_layers):
        held = kinds.get(layer, set())
        if held == {"key", "value"}:  # (a sliding layer too: see the docstring)
            types.append("full_attention")
        elif held == {"conv"}:
            types.append("conv")
        elif held == {"conv", "recurrent"}:
            types.append("linear_attention")
        else:
            raise LoweringOptionsError(
                f"export: layer {layer} of the {model_type!r} model caches "
                f"{', '.join(sorted(held)) or 'nothing'}; onnxruntime-genai 0.18 carries keys "
                "and values, a convolution state, or a convolution and a recurrent state per "
                "layer, not this combination. Export the ONNX model alone with "
                "irkit.llm.export_causal_lm and run it with irkit.llm.generate_greedy "
                "(docs/llm.md, 'State-space and linear-attention models')"
            )
    return tuple(types)


def _tokens(source: _Source, note: Callable[[str], None]) -> Any:
    """bos/eos/pad ids from the configs; an eos that neither config names is the tokenizer's."""
    config = source.config.get_text_config().to_dict()
    generation = source.generation or {}
    if config.get("eos_token_id") is None and generation.get("eos_token_id") is None:
        eos = _tokenizer_eos(source.folder)
        if eos is not None:
            note(f"eos_token_id {eos}: the tokenizer's (config.json names none)")
            config["eos_token_id"] = eos
    return token_ids(config, source.generation)


def _tokenizer_eos(folder: pathlib.Path | None) -> int | None:
    """The eos id of the tokenizer saved in ``folder`` (local files only), else None."""
    if folder is None or not tokenizer_files(folder):
        return None
    try:
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception:  # no loadable tokenizer: the configs' answer stands
        return None
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if isinstance(eos, int) else None


def _check_state_kinds(source: _Source) -> None:
    """Before the trace: no cache, or state kinds genai cannot carry, are refused at once."""
    from irkit.llm._causal_lm import _bind, cache_layout, own_cache_class
    from irkit.llm._states import has_state_layers

    if not _bind(source.model).cache:
        layout = cache_layout(source.model)  # a state list of its own (RWKV): no genai kinds
        if layout.states:
            _genai_layer_types(
                str(source.config.model_type), layout, source.config.get_text_config()
            )
        raise LoweringOptionsError(
            f"export: {type(source.model).__name__} ({source.config.model_type!r}) has no cache "
            "(its forward takes no past_key_values): onnxruntime-genai carries a cache between "
            "steps. Export the ONNX model alone with irkit.llm.export_causal_lm (ids in, logits "
            "out) and run it with irkit.llm.generate_greedy, which re-reads the sequence"
        )
    own = own_cache_class(source.model)  # (xLSTM's: its states show only when probed)
    if has_state_layers(source.model.config) or own is not None:
        layout = cache_layout(source.model)
        if layout.states:
            _genai_layer_types(
                str(source.config.model_type), layout, source.config.get_text_config()
            )


def _decoder(exported: Any, text_config: Any, model_type: str = "") -> Decoder:
    from irkit.llm._causal_lm import one_cache_shape

    layout = exported.cache
    if layout.states:
        return _state_decoder(exported, text_config, model_type)
    heads, head_size = one_cache_shape(layout)  # values narrower than keys are padded (MLA)
    return Decoder(
        filename=_ONNX_FILE,
        num_layers=layout.num_layers,
        num_attention_heads=int(text_config.num_attention_heads),
        num_kv_heads=heads,
        head_size=head_size,
        hidden_size=int(text_config.hidden_size),
        vocab_size=int(text_config.vocab_size),
        context_length=context_length(text_config.to_dict()),
        position_ids=exported.position_ids,
        cache_itemsize=int(layout.numpy_dtype().itemsize),
    )


def _state_decoder(exported: Any, text_config: Any, model_type: str) -> Decoder:
    """The :class:`Decoder` of a cache with state kinds (conv, recurrent, keys on some layers)."""
    import dataclasses

    from irkit.llm._causal_lm import CacheLayout, one_cache_shape

    layout = exported.cache
    layer_types = _genai_layer_types(model_type, layout, text_config)
    attention = len(layout.keys)
    if attention:
        heads, head_size = one_cache_shape(dataclasses.replace(layout, states=()))
    else:  # no attention layer: genai still reads the sizes
        heads = int(getattr(text_config, "num_key_value_heads", 0) or 1)
        head_size = 1
    names = tuple(
        dict.fromkeys(
            (s.kind.genai_input, s.kind.past_format, s.kind.genai_output, s.kind.present_format)
            for s in layout.states
            if s.kind.sequence_axis is None
        )
    )
    convs = {s.shape[-1] for s in layout.states if s.kind.name == "conv"}
    itemsize = CacheLayout((), (), layout.dtype).numpy_dtype().itemsize
    return Decoder(
        filename=_ONNX_FILE,
        num_layers=layout.num_layers,
        num_attention_heads=int(getattr(text_config, "num_attention_heads", 0) or heads),
        num_kv_heads=heads,
        head_size=head_size,
        hidden_size=int(text_config.hidden_size),
        vocab_size=int(text_config.vocab_size),
        context_length=context_length(text_config.to_dict()),
        position_ids=exported.position_ids,
        cache_itemsize=int(itemsize),
        attention_layers=attention,
        layer_types=layer_types,
        state_names=names,
        conv_cache_size=max(convs) if convs else 0,
    )


def _kv_names(layout: Any) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per layer with a growing cache (keys, values): its past input and present output names."""
    from irkit.llm._states import KINDS

    if layout.states:
        growing = [s for s in layout.states if s.kind.sequence_axis is not None]
        pairs = [(s.layer, s.past_name, s.present_name) for s in growing]
    else:
        kinds = [k for k in KINDS if k.name in ("key", "value")]
        pairs = [
            (i, k.past_format % i, k.present_format % i)
            for i in range(len(layout.keys))
            for k in kinds
        ]
    names: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for layer, past, present in pairs:
        pasts, presents = names.get(layer, ((), ()))
        names[layer] = ((*pasts, past), (*presents, present))
    return names


def _max_length(decoder: Decoder, max_length: int | None) -> int:
    limit = decoder.context_length or DEFAULT_MAX_LENGTH
    if max_length is None:
        return min(limit, DEFAULT_MAX_LENGTH)
    if max_length < 2 or (decoder.context_length and max_length > decoder.context_length):
        raise LoweringOptionsError(
            f"export: max_length {max_length} must be in 2..{limit} "
            "(the model's max_position_embeddings)"
        )
    return max_length


def _replace(tmp: pathlib.Path, out: pathlib.Path) -> None:
    old = None
    if out.exists():
        old = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@dataclasses.dataclass
class _Source:
    """The model to export and what goes beside it."""

    model: Any  # a transformers causal LM (parameters on meta for a folder)
    config: Any  # its transformers config
    generation: dict[str, Any] | None  # generation_config.json
    weights: list[Any] | None  # irkit.save's weights= (None: the model's own)
    rename: dict[str, str] | None  # irkit.save's rename= (checkpoint keys transformers renames)
    shapes: dict[str, tuple[int, ...]] | None  # the checkpoint's tensor shapes (a folder's)
    folder: (
        pathlib.Path | None
    )  # where config, generation config and tokenizer files are copied from
    description: str
    buffers: dict[str, Any] = dataclasses.field(default_factory=dict)  # meta: real buffers


def _folder_source(
    folder: pathlib.Path,
    raw: dict[str, Any],
    trust_remote_code: bool,
    dtype: str,
    say: Callable[[str], None],
) -> _Source:
    config = _config(folder, raw, trust_remote_code)
    say(f"building {config.model_type} from {folder}/config.json on the meta device ({dtype})")
    meta = _build(folder, config, trust_remote_code, dtype)
    generation_file = folder / "generation_config.json"
    generation = _read_json(generation_file) if generation_file.is_file() else None
    from irkit.llm._meta import checkpoint_names
    from irkit.weights import open_weights

    checkpoint = open_weights(folder)
    shapes = {}
    for key in checkpoint.names():
        tensor = checkpoint.get(key)
        if tensor is not None:
            shapes[key] = tuple(int(d) for d in tensor.shape.numpy())
    return _Source(
        model=meta.model,
        config=config,
        generation=generation,
        weights=[folder, meta.buffers],
        rename=checkpoint_names(meta.model, shapes) or None,
        shapes=shapes,
        folder=folder,
        description=f"weights streamed from {folder}",
        buffers=meta.buffers,
    )


def _model_source(model: Any, dtype: str) -> _Source:
    from irkit.llm._precision import convert_model

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_file"):
        raise LoweringOptionsError(
            f"export: {type(model).__name__} is neither a model folder nor a transformers "
            "model; pass the folder save_pretrained wrote, or a *ForCausalLM"
        )
    generation = getattr(model, "generation_config", None)
    name = pathlib.Path(str(getattr(config, "_name_or_path", "") or ""))
    return _Source(
        model=convert_model(model.eval(), dtype),
        config=config,
        generation=generation.to_diff_dict() if generation is not None else None,
        weights=None,
        rename=None,
        shapes=None,
        folder=name if str(name) and name.is_dir() else None,
        description="the model's own weights",
    )


def _fill_buffers(model: Any, buffers: dict[str, Any]) -> None:
    """Give the weightless initializers of the model's buffers (rotary ``inv_freq`` …) their
    values before the rewrite, which reads them (``GroupQueryAttention``'s rotary caches)."""
    import onnx_ir as ir
    import torch

    for name, tensor in buffers.items():
        initializer = model.graph.initializers.get(name)
        if tensor.dtype == torch.bfloat16:  # (numpy has none: left to irkit.save)
            continue
        if initializer is not None and tuple(initializer.shape or ()) == tuple(tensor.shape):
            initializer.const_value = ir.tensor(tensor.detach().cpu().numpy(), name=name)


def _write_side_files(source: _Source, tmp: pathlib.Path, say: Callable[[str], None]) -> None:
    if source.folder is not None:
        for name in _COPIED:
            if (source.folder / name).is_file():
                shutil.copyfile(source.folder / name, tmp / name)
        tokenizer = tokenizer_files(source.folder)
        for path in tokenizer:
            shutil.copyfile(path, tmp / path.name)
    else:
        tokenizer = []
    if not (tmp / "config.json").exists():
        source.config.to_json_file(tmp / "config.json")
    if source.generation is not None and not (tmp / "generation_config.json").exists():
        (tmp / "generation_config.json").write_text(json.dumps(source.generation, indent=2))
    if not tokenizer:
        say(
            "warning: no tokenizer files found (the model's folder is unknown): copy them into "
            "the output folder for og.Tokenizer"
        )


def export(
    model_or_dir: Any,
    out_dir: str | os.PathLike[str],
    *,
    precision: str = "fp32",
    target: str = "ort",
    execution_provider: str | ExecutionProvider = "cpu",
    max_length: int | None = None,
    share_buffer: bool | None = None,
    windowed_cache: bool = True,
    overwrite: bool = False,
    trust_remote_code: bool = False,
    layer_reuse: bool = True,
    log: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> ExportedFolder:
    """Export a Hugging Face causal LM to a folder onnxruntime-genai runs.

    ``out_dir`` gets ``model.onnx`` + ``model.onnx.data``, ``genai_config.json``,
    ``config.json``, ``generation_config.json`` (if there is one) and the tokenizer and
    chat-template files. From a folder, the model is built on the ``meta`` device and the
    weights are streamed from its safetensors shards (never all in memory); nothing is read
    from the network. A loaded transformers model is exported with its own weights, its
    tokenizer files copied from the folder it was loaded from (``config._name_or_path``) if
    that is a local folder.

    Args:
        model_or_dir: The model folder (``config.json``, ``*.safetensors``, tokenizer files),
            or a transformers ``*ForCausalLM``.
        out_dir: The folder to write (created; must be empty or absent unless ``overwrite``).
        precision: ``"fp32"``; ``"fp16"`` (fp16 weights, compute and KV cache:
            ``irkit.llm._precision``; the checkpoint converted while streamed);
            ``"int4"``/``"int8"`` (matmul weights ``irkit.quantize`` packs into
            ``MatMulNBits``; float32 activations on the CPU, float16 on CUDA).
        target: ``irkit.optimize`` target: ``"ort"`` (the default: onnxruntime's contrib ops,
            ``GroupQueryAttention`` on the shared buffer, as genai's own builder writes; a genai
            folder only ever runs in onnxruntime) or ``"onnx"`` (standard ops only: opset-23
            ``Attention``, ``TensorScatter`` on the shared buffer).
        execution_provider: ``"cpu"`` (the default) or ``"cuda"``: written into
            ``genai_config.json``; on CUDA the graph computes in float16
            (:class:`~irkit.llm._provider.ExecutionProvider`; ``fp32`` is refused there).
        max_length: ``search.max_length`` (default: ``min(max_position_embeddings, 4096)``).
        share_buffer: Keep the KV cache in one buffer of ``max_length`` positions shared by past
            and present, and write ``past_present_share_buffer: true`` (the default,
            ``None``, shares it): target ``"ort"`` writes ``GroupQueryAttention`` on the
            buffer (a model whose attention none took as target ``"onnx"``),
            target ``"onnx"`` rewrites to opset 24
            (:func:`irkit.rules.kv_buffer.share_kv_buffer`: ``TensorScatter``). ``False``: past and new keys
            concatenated (opset 23), ``past_present_share_buffer: false``.
        windowed_cache: On the shared buffer under target ``"ort"``, give each sliding-window
            layer a buffer of its window instead of ``max_length`` (genai's
            ``decoder.sliding_window``: ``W + 16`` positions on the CPU, ``W`` on CUDA;
            :mod:`irkit.rules.ort.attention.windowed`), as genai's builder does: those layers'
            attention scans the window only. A batch of prompts of several lengths is then
            exact up to that many prompt positions and refused by onnxruntime beyond (the
            builder's model refuses every such batch); ``False`` keeps every layer on the
            ``max_length`` buffer.
        overwrite: Replace a non-empty ``out_dir``.
        trust_remote_code: Allow a folder whose model is defined by its own code.
        layer_reuse: Trace only the first ``P`` decoder layers when every layer ``i`` is
            provably layer ``i mod P`` on other weights (:func:`irkit.llm._stamp.layer_period`)
            and stamp their calls out to all layers (the same model, traced faster); where
            there is no such proof, every layer is traced and the reason is noted.
        log: Called with one line per stage and each note (default: nothing); with
            ``progress``, the stages go there and the notes too.
        progress: A :class:`~irkit.llm._progress.Progress` (the command line's: stages,
            tensors and MB written on a terminal).

    Returns:
        The :class:`ExportedFolder`.

    Raises:
        ModelLoadError: Not a model folder, no safetensors weights, remote code without
            ``trust_remote_code``, a config transformers cannot build.
        SaveError: ``out_dir`` is not empty (without ``overwrite``) or cannot be written (a
            full disk, …); nothing is left behind.
        LoweringOptionsError: An unknown precision, target or execution provider, ``fp32`` on
            CUDA, an unusable ``max_length``,
            a cache genai cannot hold, neither a folder nor a transformers model.
        ExportError: ``torch.export`` failed.
        WeightsError: The shards lack a weight or have the wrong shape, or an fp16 export
            overflows (``check_half_range``); nothing is written.
    """
    quiet = log or (lambda _line: None)
    stage = progress.stage if progress is not None else quiet
    note = progress.note if progress is not None else quiet
    out = pathlib.Path(out_dir)
    _check_options(precision, target)
    provider = ExecutionProvider.parse(execution_provider)
    dtype = provider.compute_dtype(precision)
    shares = share_buffer is not False
    is_folder = isinstance(model_or_dir, (str, os.PathLike))
    raw = _check_folder(pathlib.Path(model_or_dir)) if is_folder else {}
    _check_output(out, overwrite)

    import irkit
    from irkit.llm._causal_lm import pad_value_cache
    from irkit.llm._meta import stacked_weights

    source = (
        _folder_source(pathlib.Path(model_or_dir), raw, trust_remote_code, dtype, stage)
        if is_folder
        else _model_source(model_or_dir, dtype)
    )
    _check_state_kinds(source)
    tokens = _tokens(source, note)  # (before the trace: a model genai cannot stop is refused now)
    if dtype == "fp16":
        from irkit.llm._precision import check_half_range

        check_half_range(source.model, weights=source.weights)
    stage("torch.export with the KV cache")
    model, exported = _trace_and_lower(source, layer_reuse, stage, note)
    text_config = source.config.get_text_config()
    decoder = _decoder(exported, text_config, str(source.config.model_type))
    length = _max_length(decoder, max_length)
    from irkit.rules import ort

    stage(f"lowering and optimizing (target {target})")
    pad_value_cache(model, exported.cache)
    if source.shapes:  # experts stored one tensor each: stacked while streaming
        stacked_weights(model, source.model, source.shapes)
    _fill_buffers(model, source.buffers)
    rules = (
        ort.default_rules(
            gqa_shared_buffer=length if shares else False,
            skip_norm=provider.skip_norm,
            gqa_qk_norm=provider.gqa_qk_norm,
            half_norms=provider.half_norms,
        )
        if target == "ort"
        else None
    )
    irkit.optimize(model, target=target, rules=rules)
    shared = target == "ort" and ort.attention.runs_on_shared_buffer(
        model, len(exported.cache.keys)
    )
    # (a pure state cache: no KV); under target ort a model no GroupQueryAttention took
    # shares it as onnx does
    standard = target == "onnx" or ort.attention.group_query_attentions(model) == 0
    if shares and not shared and standard and exported.cache.keys:
        from irkit.rules.kv_buffer import share_kv_buffer

        stage("sharing the KV buffer (opset 24: TensorScatter)")
        share_kv_buffer(model)
        shared = True
    elif exported.cache.keys:  # genai right-pads the concatenated cache too: ALiBi by position
        from irkit.rules.kv_buffer import alibi_by_position

        alibi_by_position(model)
    windowed = None
    if windowed_cache and shared and not standard:  # windowed layers on buffers of the window
        windowed = ort.attention.bound_windowed_caches(model, _kv_names(exported.cache))
    if precision in _QUANTIZED_BITS:
        stage(f"quantizing to {precision} (irkit.quantize)")
        _quantize(model, precision, note, provider.accuracy_level)
        if target == "onnx":  # the model needs contrib ops now: their decode fusions pay
            from irkit.rules.decode import quantized_rules

            irkit.optimize(model, "ort", rules=quantized_rules(max_positions=length))
    from irkit.rules.hoist import hoist_invariants

    hoist_invariants(model)  # each layer's mask, rotary slices, … once in the main graph
    input_names = _drop_unread_inputs(model, exported.input_names, note)
    from irkit.llm._logits import last_token_logits

    if not last_token_logits(model):  # (genai then picks each row's last token itself)
        note("logits of every position: the lm_head was not found after the last norm")
    content = genai_config(
        decoder,
        model_type=str(source.config.model_type),
        tokens=tokens,
        generation=source.generation,
        max_length=length,
        input_names=input_names,
        share_buffer=shared,
        provider_options=provider.provider_options(),
        sliding_window=windowed.genai() if windowed is not None else None,
    )
    files = _write_folder(model, source, content, out, stage, note, progress)
    kv = decoder.kv_bytes(length)
    note(f"search.max_length {length}: KV cache {kv / 2**20:.1f} MiB per sequence")
    return ExportedFolder(path=out, files=files, genai_config=content, kv_cache_bytes=kv)


# Inputs onnxruntime-genai computes and feeds every step from the attention mask: one the
# optimized graph no longer reads (``position_ids`` once GroupQueryAttention rotates q and k
# itself, ``do_rotary``) is left out of the folder, as the builder's folders leave it out: genai
# then builds nothing for it (no per-token change measured: LFM2 int4, 16 processes × 10 rounds,
# 1.028 either way), and a caller need not feed what no node reads.
_DERIVED_INPUTS = ("position_ids",)


def _drop_unread_inputs(model: Any, names: Sequence[str], note: Callable[[str], None]) -> list[str]:
    """Remove the :data:`_DERIVED_INPUTS` no node of ``model`` reads from its graph inputs.

    Args:
        model: The optimized ``onnx_ir`` model (changed in place).
        names: The export's input names.
        note: Called once with the inputs left out, if any.

    Returns:
        ``names`` without the inputs removed.
    """
    unread = [
        value for value in model.graph.inputs if value.name in _DERIVED_INPUTS and not value.uses()
    ]
    for value in unread:
        model.graph.inputs.remove(value)
    if unread:
        left = ", ".join(str(value.name) for value in unread)
        note(f"{left}: read by no node of the optimized graph, not an input of the folder")
    dropped = {value.name for value in unread}
    return [name for name in names if name not in dropped]


def _trace_and_lower(
    source: _Source,
    layer_reuse: bool,
    stage: Callable[[str], None],
    note: Callable[[str], None],
) -> tuple[Any, Any]:
    """Trace and lower the model: its first ``P`` layers stamped out to all (``layer_reuse``,
    where proven), else every layer. Returns the ``onnx_ir`` model and the export's names and
    cache layout for all layers."""
    import irkit
    from irkit.errors import ExportError
    from irkit.llm._causal_lm import export_causal_lm

    def lower(exported: Any) -> Any:
        return irkit.lower(exported.program, **exported.lower_kwargs())

    if layer_reuse:
        from irkit.llm._stamp import cut_layers, layer_period, stamp_layers

        found = layer_period(source.model, source.buffers)
        if found.period is not None:
            with cut_layers(source.model, found):
                cut = export_causal_lm(source.model)
            model = lower(cut)
            state = source.model.state_dict()

            def weight(name: str) -> Any:  # a loaded model's own weights
                import onnx_ir as ir

                tensor = state.get(name)
                if tensor is not None and tensor.is_meta:  # a meta model's buffer: its value
                    tensor = source.buffers.get(name)
                if tensor is None:
                    return None  # (a constant the trace lifted: stamping refuses it)
                try:
                    return ir.tensor(tensor.detach().cpu().numpy(), name=name)
                except TypeError:  # (bfloat16: numpy has none; stamping refuses it)
                    return None

            try:
                stamp_layers(model, found, weight)
                every = _all_layers(cut, found.layers, found.source)
                for kind, names in (("inputs", every.input_names), ("outputs", every.output_names)):
                    stamped = [v.name for v in getattr(model.graph, kind)]
                    if stamped != names:  # (the cache layout all layers have: the folder's names)
                        raise ExportError(f"the stamped graph's {kind} {stamped} are not {names}")
            except ExportError as exc:
                note(f"layer reuse off ({exc}); tracing every layer")
            except Exception as exc:  # (a graph stamping did not foresee: the full trace is right)
                note(
                    f"layer reuse off (stamp_layers: {type(exc).__name__}: {exc}); tracing every layer"
                )
            else:
                rule = (
                    f"layer i = layer i mod {found.period}"
                    if not found.sources
                    else "each as its last equal among them"
                )
                note(
                    f"layer reuse: traced {found.period} of {found.layers} decoder layers, "
                    f"stamped the others ({rule})"
                )
                return model, every
        else:
            note(f"layer reuse off: {found.reason}; tracing every layer")
    exported = export_causal_lm(source.model)
    return lower(exported), exported


def _all_layers(cut: Any, count: int, source: Callable[[int], int]) -> Any:
    """``cut``'s export with the names and cache layout of all ``count`` layers (layer ``i``
    is traced layer ``source(i)``)."""
    from irkit.llm._causal_lm import CacheLayout

    if cut.cache.states:  # every cache tensor by kind and layer: kind by kind, layer by layer
        kinds = list(cut.cache.kinds)
        states = sorted(
            (
                dataclasses.replace(spec, layer=i)
                for i in range(count)
                for spec in cut.cache.states
                if spec.layer == source(i)
            ),
            key=lambda s: (kinds.index(s.kind.name), s.layer, s.index),
        )
        attention = [s.layer for s in cut.cache.states if s.kind.name == "key"]
        keys = dict(zip(attention, cut.cache.keys, strict=True))
        values = dict(zip(attention, cut.cache.values, strict=True))
        every = [i for i in range(count) if source(i) in keys]
        layout = CacheLayout(
            keys=tuple(keys[source(i)] for i in every),
            values=tuple(values[source(i)] for i in every),
            dtype=cut.cache.dtype,
            states=tuple(states),
        )
        steps = [n for n in cut.input_names if n in ("input_ids", "attention_mask", "position_ids")]
        return dataclasses.replace(
            cut,
            input_names=steps + [s.past_name for s in states],
            output_names=["logits"] + [s.present_name for s in states],
            cache=layout,
        )
    layout = CacheLayout(
        keys=tuple(cut.cache.keys[source(i)] for i in range(count)),
        values=tuple(cut.cache.values[source(i)] for i in range(count)),
        dtype=cut.cache.dtype,
    )
    past = [f"past_key_values.{i}.{kind}" for kind in ("key", "value") for i in range(count)]
    inputs = [n for n in cut.input_names if not n.startswith("past_key_values.")] + past
    presents = [n.replace("past_key_values", "present") for n in past]
    outputs: list[str] = []  # the cut's outputs, its presents replaced by all layers' in place
    for name in cut.output_names:
        if not name.startswith("present."):
            outputs.append(name)
        elif presents:
            outputs += presents
            presents = []
    return dataclasses.replace(cut, input_names=inputs, output_names=outputs, cache=layout)


def _write_folder(
    model: Any,
    source: _Source,
    content: dict[str, Any],
    out: pathlib.Path,
    stage: Callable[[str], None],
    note: Callable[[str], None],
    progress: Progress | None,
) -> tuple[str, ...]:
    """Write everything into a temporary folder beside ``out``, then rename it into place."""
    import irkit

    try:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise _write_error(out, exc) from exc
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would stay on the renamed folder
        stage(f"writing {out}/{_ONNX_FILE} ({source.description})")
        if progress is not None:
            sizes = [
                v.const_value.nbytes
                for v in model.graph.initializers.values()
                if v.const_value is not None
            ]
            large = [n for n in sizes if n > _INLINE_BYTES]
            progress.start_writing(len(large), sum(large))
        try:
            irkit.save(
                model,
                tmp / _ONNX_FILE,
                weights=source.weights,
                rename=source.rename,
                external_data=f"{_ONNX_FILE}.data",
                progress=progress.tensor_written if progress is not None else None,
            )
        finally:
            if progress is not None:
                progress.finish_writing()
        _write_side_files(source, tmp, note)
        (tmp / "genai_config.json").write_text(json.dumps(content, indent=2) + "\n")
        files = tuple(sorted(p.name for p in tmp.iterdir()))
        _replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(out, exc) from exc
    except SaveError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL:
            raise _write_error(out, cause, out / f"{_ONNX_FILE}.data") from exc
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files


def _write_error(out: pathlib.Path, exc: OSError, file: pathlib.Path | None = None) -> SaveError:
    """The :class:`SaveError` for ``exc``, raised while writing ``file`` (default: its own)."""
    named = file if file is not None else exc.filename
    where = repr(str(named)) if named else repr(str(out))
    if exc.errno in _DISK_FULL:
        free = shutil.disk_usage(out.parent).free if out.parent.is_dir() else 0
        return SaveError(
            f"{str(out)!r}: the disk is full while writing {where} ({exc.strerror}; "
            f"{free / 1e6:,.0f} MB free in {str(out.parent)!r}); nothing was written: free "
            "some space there or pass an OUT_DIR on another disk"
        )
    return SaveError(
        f"{str(out)!r}: writing {where} failed ({exc.strerror or exc}); nothing was written: "
        "check that the folder is writable, or pass another OUT_DIR"
    )
