"""Export a transformers causal LM **with its KV cache** for :func:`irkit.lower`.

:func:`export_causal_lm` runs ``torch.export.export`` on the model itself (so module paths,
weight names and the decoder-layer functions are those of the model), with a
``transformers.DynamicCache`` as input, the way transformers' own export helpers do
(``DynamicCache`` registered as a pytree node with
``transformers.integrations.executorch.register_dynamic_cache_export_support``, a process-wide,
idempotent registration; ``use_cache=True`` passed as a keyword). It returns the program and the
ONNX names of its flattened inputs and outputs:

- inputs ``input_ids``, ``attention_mask``, ``position_ids`` (if ``model.forward`` takes them),
  ``past_key_values.N.key`` … then ``past_key_values.N.value`` … (the cache's pytree order: all
  keys, then all values);
- outputs ``logits``, ``present.N.key`` …, ``present.N.value`` …;
- dynamic dims ``batch``, ``sequence`` (new tokens), ``past_sequence`` (cached tokens) and
  ``total_sequence`` (the attention mask's length, ``past_sequence + sequence`` at run time).

A prefill is a run with ``past_sequence = 0``, a decode step one with ``sequence = 1``. Past KV
tensors have shape ``(batch, num_key_value_heads, past_sequence, head_dim)``.

torch and transformers are imported on first call only. See ``docs/llm.md``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

from irkit.errors import LoweringOptionsError

__all__ = ["CausalLMExport", "export_causal_lm", "causal_lm_feeds", "torch_inputs", "run_eager"]


@dataclasses.dataclass(frozen=True)
class CausalLMExport:
    """What :func:`export_causal_lm` returns.

    Attributes:
        program: The ``torch.export.ExportedProgram``.
        input_names: ONNX names of its flattened tensor inputs (pass as ``input_names=``).
        output_names: ONNX names of its flattened outputs (pass as ``output_names=``).
        num_layers: Number of cached layers (``N`` in ``past_key_values.N.key``).
        num_kv_heads: Key/value heads of the cache tensors.
        head_dim: Last dim of the cache tensors.
        position_ids: Whether ``position_ids`` is an input.
        dynamic_shapes: The ``dynamic_shapes`` given to ``torch.export.export`` (keyed like
            :func:`torch_inputs`), e.g. to export the same way with ``torch.onnx.export``.
    """

    program: Any
    input_names: list[str]
    output_names: list[str]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    position_ids: bool
    dynamic_shapes: dict[str, Any] = dataclasses.field(default_factory=dict)

    def lower_kwargs(self) -> dict[str, list[str]]:
        """``{"input_names": ..., "output_names": ...}`` for ``irkit.lower(program, **kw)``."""
        return {"input_names": list(self.input_names), "output_names": list(self.output_names)}


def _cache_geometry(model: Any) -> tuple[int, int, int]:
    config = getattr(model, "config", None)
    if config is None:
        raise LoweringOptionsError(
            f"export_causal_lm: {type(model).__name__} has no `config`; "
            "pass a transformers causal LM (e.g. LlamaForCausalLM)"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    if not isinstance(layers, int) or not isinstance(heads, int):
        raise LoweringOptionsError(
            f"export_causal_lm: the config of {type(model).__name__} has no "
            "num_hidden_layers/num_attention_heads; only decoder-only causal LMs are supported"
        )
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return layers, kv_heads, head_dim


def _takes_position_ids(model: Any) -> bool:
    return "position_ids" in inspect.signature(model.forward).parameters


def causal_lm_feeds(
    model: Any,
    *,
    batch: int,
    seq: int,
    past: int,
    seed: int = 0,
    position_ids: bool | None = None,
    dtype: Any = np.float32,
) -> dict[str, np.ndarray]:
    """Random inputs keyed by the ONNX names :func:`export_causal_lm` gives (for tests, benches).

    Args:
        model: The transformers causal LM.
        batch: Batch size.
        seq: New tokens (1 for a decode step).
        past: Cached tokens (0 for a prefill).
        seed: Seed of the numpy generator.
        position_ids: Include ``position_ids`` (default: if ``model.forward`` takes them).
        dtype: dtype of the KV cache tensors.

    Returns:
        ``{name: array}`` with ``attention_mask`` all ones and positions ``past..past+seq-1``.
    """
    layers, kv_heads, head_dim = _cache_geometry(model)
    if position_ids is None:
        position_ids = _takes_position_ids(model)
    rng = np.random.default_rng(seed)
    vocab = int(model.config.get_text_config().vocab_size)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(1, vocab, (batch, seq), dtype=np.int64),
        "attention_mask": np.ones((batch, past + seq), dtype=np.int64),
    }
    if position_ids:
        feeds["position_ids"] = np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))
    shape = (batch, kv_heads, past, head_dim)
    for kind in ("key", "value"):
        for i in range(layers):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _cache(tensors: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (key, value) in enumerate(tensors):
        cache.update(key, value, i)
    return cache


def torch_inputs(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The keyword arguments of ``model`` for ``feeds`` (a fresh ``DynamicCache``, ``use_cache``).

    Args:
        model: The transformers causal LM.
        feeds: Inputs keyed by ONNX name (as from :func:`causal_lm_feeds`).

    Returns:
        ``{"input_ids": tensor, ..., "past_key_values": DynamicCache, "use_cache": True}``.
    """
    import torch

    layers, _, _ = _cache_geometry(model)
    inputs: dict[str, Any] = {
        k: torch.from_numpy(np.array(feeds[k]))
        for k in ("input_ids", "attention_mask", "position_ids")
        if k in feeds
    }
    pairs = [
        (
            torch.from_numpy(np.array(feeds[f"past_key_values.{i}.key"])),
            torch.from_numpy(np.array(feeds[f"past_key_values.{i}.value"])),
        )
        for i in range(layers)
    ]
    inputs["past_key_values"] = _cache(pairs)
    inputs["use_cache"] = True
    return inputs


def run_eager(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The eager PyTorch outputs for ``feeds``, in the order of ``export_causal_lm``'s outputs.

    Args:
        model: The transformers causal LM (put in eval mode by the caller).
        feeds: Inputs keyed by ONNX name (as from :func:`causal_lm_feeds`).

    Returns:
        ``[logits, present.0.key, …, present.0.value, …]`` as numpy arrays.
    """
    import torch

    with torch.no_grad():
        out = model(**torch_inputs(model, feeds))
    cache = out.past_key_values
    keys = [layer.keys.numpy() for layer in cache.layers]
    values = [layer.values.numpy() for layer in cache.layers]
    return [out.logits.numpy(), *keys, *values]


def export_causal_lm(
    model: Any,
    *,
    batch: int = 2,
    seq: int = 3,
    past: int = 5,
    position_ids: bool | None = None,
    max_sequence: int | None = None,
) -> CausalLMExport:
    """Export a transformers causal LM with its KV cache as inputs and outputs.

    The model is exported as it is (call ``model.eval()`` first), without an outer
    ``torch.no_grad()``, at example sizes ``batch``/``seq``/``past`` that become the dynamic
    dims ``batch``, ``sequence``, ``past_sequence`` and ``total_sequence`` (pick sizes ≥ 2 that
    differ from each other so torch.export does not specialize them). The model is not
    modified.

    Args:
        model: A transformers ``*ForCausalLM`` with a decoder-only config.
        batch: Example batch size.
        seq: Example number of new tokens.
        past: Example number of cached tokens.
        position_ids: Add a ``position_ids`` input (default: if ``model.forward`` takes it).
        max_sequence: Upper bound of the sequence dims (default:
            ``config.max_position_embeddings``).

    Returns:
        A :class:`CausalLMExport`: the program and the names for :func:`irkit.lower`.

    Raises:
        LoweringOptionsError: Not a decoder-only transformers model, or unusable sizes.

    Example:
        >>> import irkit, transformers                                     # doctest: +SKIP
        >>> from irkit.llm import export_causal_lm
        >>> cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        ...     vocab_size=128)                                             # doctest: +SKIP
        >>> lm = transformers.LlamaForCausalLM(cfg).eval()                  # doctest: +SKIP
        >>> exported = export_causal_lm(lm)                                 # doctest: +SKIP
        >>> model = irkit.lower(exported.program, **exported.lower_kwargs())  # doctest: +SKIP
        >>> [v.name for v in model.graph.inputs][:4]                        # doctest: +SKIP
        ['input_ids', 'attention_mask', 'position_ids', 'past_key_values.0.key']
    """
    import torch
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    if min(batch, seq, past) < 2 or len({batch, seq, past, seq + past}) < 4:
        raise LoweringOptionsError(
            f"export_causal_lm: example sizes batch={batch}, seq={seq}, past={past} would be "
            "specialized by torch.export; use distinct sizes >= 2 (e.g. batch=2, seq=3, past=5)"
        )
    layers, kv_heads, head_dim = _cache_geometry(model)
    if position_ids is None:
        position_ids = _takes_position_ids(model)
    register_dynamic_cache_export_support()  # idempotent; what transformers' exporters do

    limit = max_sequence or int(getattr(model.config, "max_position_embeddings", 4096) or 4096)
    d_batch = torch.export.Dim("batch", max=4096)
    d_seq = torch.export.Dim("sequence", max=limit)
    d_past = torch.export.Dim("past_sequence", max=limit)
    d_total = torch.export.Dim("total_sequence", min=4, max=2 * limit)  # a guard of the mask code
    feeds = causal_lm_feeds(model, batch=batch, seq=seq, past=past, position_ids=position_ids)
    inputs = torch_inputs(model, feeds)
    kv = {0: d_batch, 2: d_past}
    dynamic: dict[str, Any] = {
        "input_ids": {0: d_batch, 1: d_seq},
        "attention_mask": {0: d_batch, 1: d_total},
        "past_key_values": [[kv] * layers, [kv] * layers],
        "use_cache": None,
    }
    if position_ids:
        dynamic["position_ids"] = {0: d_batch, 1: d_seq}
    program = torch.export.export(model, (), inputs, dynamic_shapes=dynamic)
    past_names = [f"past_key_values.{i}.{kind}" for kind in ("key", "value") for i in range(layers)]
    input_names = ["input_ids", "attention_mask"]
    if position_ids:
        input_names.append("position_ids")
    output_names = ["logits"] + [n.replace("past_key_values", "present") for n in past_names]
    return CausalLMExport(
        program=program,
        input_names=input_names + past_names,
        output_names=output_names,
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        position_ids=bool(position_ids),
        dynamic_shapes=dynamic,
    )
