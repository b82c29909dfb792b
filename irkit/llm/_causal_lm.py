"""Export a transformers causal LM **with its KV cache** for :func:`irkit.lower`, and run it.

:func:`export_causal_lm` runs ``torch.export.export`` on the model itself (so module paths,
weight names and the decoder-layer functions are those of the model), with a
``transformers.DynamicCache`` as input, the way transformers' own export helpers do
(``DynamicCache`` registered as a pytree node with
``transformers.integrations.executorch.register_dynamic_cache_export_support``, a process-wide,
idempotent registration; ``use_cache=True`` passed as a keyword). The arguments are bound by
the model's ``forward`` signature (the cache is ``cache`` since transformers 5.2x,
``past_key_values`` before). It returns the program and the ONNX names of its flattened inputs
and outputs:

- inputs ``input_ids``, ``attention_mask``, ``position_ids`` (if ``model.forward`` takes them),
  ``past_key_values.0.key`` … ``past_key_values.{N-1}.key``, then ``past_key_values.0.value`` …
  (the cache's pytree order: all N keys, then all N values);
- outputs ``logits``, ``present.0.key`` …, then ``present.0.value`` …;
- dynamic dims ``batch``, ``sequence`` (new tokens), ``past_sequence`` (cached tokens) and
  ``total_sequence`` (the attention mask's length, ``past_sequence + sequence`` at run time).

A prefill is a run with ``past_sequence = 0``, a decode step one with ``sequence = 1``. The cache
layout (heads and head dim of the keys and of the values, per layer, and the dtype) is the
model's own: :func:`cache_layout` runs the model once on a two-token prompt and reads the
cache it returns, so multi-query (one KV head), MLA (keys and values of different widths) and
fp16 models get the right example cache. :func:`generate_greedy` drives the exported model in
onnxruntime (prefill, then one decode step per token, present fed back as past).

``export_causal_lm(model, cache=False)`` exports a model with a cache without one (ids in,
logits out; :func:`generate_greedy` re-feeds the whole sequence), for a model whose cached step
cannot be captured: every ``ExportError`` of a cached export names it as the remedy. Before a
KV-cache export the one-token step is probed (:func:`_check_one_token_step`), and a guard
torch cannot prove is retried under ``irkit.llm._guards.RELAXATIONS``.

torch and transformers are imported on first call only. See ``docs/llm.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from irkit.errors import ExportError, LoweringOptionsError
from irkit.llm._guards import RELAXATIONS, backed_assertions, even_chunks, holding_ranges
from irkit.llm._meta import fake_weights, probe_mode
from irkit.llm._states import (
    ListedStates,
    StateSpec,
    empty_cache,
    fill_cache,
    find_listed_states,
    flat_model,
    has_state_layers,
    keep_module_states,
    past_to_present,
    probe_states,
    read_states,
    typed_cache_layers,
    widened,
)

__all__ = [
    "TESTED_TRANSFORMERS",
    "CacheLayout",
    "CausalLMExport",
    "cache_layout",
    "export_causal_lm",
    "causal_lm_feeds",
    "generate_greedy",
    "torch_inputs",
    "run_eager",
    "one_cache_shape",
    "pad_value_cache",
]

#: The transformers versions the whole suite (``tests/llm`` and the causal-LM zoo with it) passes
#: with (torch 2.13): docs/development.md, "Lane runs" (5.0 … 5.23 each fail some tests).
TESTED_TRANSFORMERS = ("5.24", "5.24")
_CACHE_ARGS = ("cache", "past_key_values")  # the cache's forward parameter: new name, old name


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """The KV cache of a causal LM as the model itself returns it.

    Attributes:
        keys: Per attention layer, ``(heads, head_dim)`` of the key tensors
            ``(batch, heads, sequence, head_dim)``.
        values: Per attention layer, ``(heads, head_dim)`` of the value tensors.
        dtype: The cache's ``torch.dtype`` (the model's compute dtype).
        states: Every cache tensor by kind and layer (:class:`irkit.llm._states.StateSpec`)
            when the cache holds more than keys and values (state-space, linear-attention and
            hybrid models); empty for a KV cache on every layer.
    """

    keys: tuple[tuple[int, int], ...]
    values: tuple[tuple[int, int], ...]
    dtype: Any
    states: tuple[StateSpec, ...] = ()

    @property
    def num_layers(self) -> int:
        """Number of decoder layers with a cache (all of them where :attr:`states` is set)."""
        if self.states:
            return 1 + max(spec.layer for spec in self.states)
        return len(self.keys)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The cache's tensor kinds (``"key"``, ``"value"``, ``"conv"``, ``"recurrent"``)."""
        if not self.states:
            return ("key", "value")
        return tuple(dict.fromkeys(spec.kind.name for spec in self.states))

    def numpy_dtype(self) -> Any:
        """The numpy dtype of the cache tensors (float32 where numpy has none, e.g. bfloat16)."""
        name = str(self.dtype).removeprefix("torch.")
        return np.dtype(name) if name in ("float16", "float32", "float64") else np.dtype("float32")


@dataclasses.dataclass(frozen=True)
class CausalLMExport:
    """What :func:`export_causal_lm` returns.

    Attributes:
        program: The ``torch.export.ExportedProgram``.
        input_names: ONNX names of its flattened tensor inputs (pass as ``input_names=``).
        output_names: ONNX names of its flattened outputs (pass as ``output_names=``).
        cache: The model's cache layout (per layer and per kind: heads, head dim; dtype).
        position_ids: Whether ``position_ids`` is an input.
        dynamic_shapes: The ``dynamic_shapes`` given to ``torch.export.export`` (keyed like
            :func:`torch_inputs`), e.g. to export the same way with ``torch.onnx.export``.
    """

    program: Any
    input_names: list[str]
    output_names: list[str]
    cache: CacheLayout
    position_ids: bool
    dynamic_shapes: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        """Number of cached layers (``N`` in ``past_key_values.N.key``)."""
        return self.cache.num_layers

    @property
    def num_kv_heads(self) -> int:
        """Heads of the first layer's key tensors (see :attr:`cache` for values and per layer)."""
        return self.cache.keys[0][0]

    @property
    def head_dim(self) -> int:
        """Last dim of the first layer's key tensors (see :attr:`cache`)."""
        return self.cache.keys[0][1]

    def lower_kwargs(self) -> dict[str, Any]:
        """``irkit.lower(program, **kw)``'s keywords: the input and output names, and
        ``decompose_custom_ops`` (each mixer's recurrence is a custom op of
        :mod:`irkit.llm.kernels._ops`: a local function, its Python implementation the body)."""
        return {
            "input_names": list(self.input_names),
            "output_names": list(self.output_names),
            "decompose_custom_ops": True,
        }


@dataclasses.dataclass(frozen=True)
class _Binding:
    """Which of the inputs the model's ``forward`` takes, and the name of its cache argument
    (``""``: a model without a cache, e.g. GPT-1, which re-reads the whole sequence)."""

    cache: str
    attention_mask: bool
    position_ids: bool
    use_cache: bool


def _versions() -> str:
    import torch

    try:
        import transformers

        have = f"transformers {transformers.__version__}"
    except ImportError:  # pragma: no cover - export_causal_lm needs it anyway
        have = "no transformers"
    low, high = TESTED_TRANSFORMERS
    return (
        f"{have}, torch {torch.__version__} (tested: transformers {low} … {high} with torch 2.13)"
    )


_SPECIALIZED = re.compile(
    r"marked (\w+) as dynamic but your code specialized it to be a constant \((\d+)\)"
)
_GUARDED = re.compile(r"Not all values of (\w+) = .* satisfy the generated guard (.*?)\.?$")
_DATA_BRANCH = re.compile(r"Could not guard on data-dependent expression (.+?) \(unhinted")
_SUGGESTED = re.compile(r"^\s+(\w+) = (Dim\(.*\)|\d+)\s*$")


def _constraint_error(model: str, exc: BaseException) -> ExportError | None:
    """The reason of a ``torch.export`` constraint violation on the sequence dims, or of a
    branch on tensor values, with a remedy, or None for another error.

    A dim the model's own code makes a constant (a Python loop or branch over the tokens: a
    recurrence without an export kernel) cannot be exported dynamic at all; a dim the code
    bounds (a position table, a bucket count) can, below the bound torch suggests.
    """
    if isinstance(exc, _NarrowedError):
        dims = ", ".join(f"{name} <= {got} (asked: up to {asked})" for name, (got, asked) in
                         exc.dims.items())  # fmt: skip
        return ExportError(
            f"export_causal_lm: the forward of {model} holds only for {dims}: torch.export "
            "narrows the sequence dims far below the model's positions, so its code branches on "
            "the sequence length (e.g. a mask that switches to top-k beyond a window shorter "
            "than the positions) and the program keeps only the example's side of the branch "
            f"({_versions()}). Remedy: none for every length in irkit yet; run it in PyTorch, "
            "or report it (the branch written as torch.cond would export)"
        )
    text = str(exc)
    branch = _DATA_BRANCH.search(text)
    if branch:
        return ExportError(
            f"export_causal_lm: the forward of {model} branches on tensor values ({branch.group(1)}: "
            "data-dependent control flow, e.g. skipping experts no token chose), which one "
            f"traced program cannot hold ({_versions()}). Remedy: none for this model in irkit "
            "yet; run it in PyTorch, or report it (the branch written as torch.cond, or "
            "without the branch, would export)"
        )
    if "Constraints violated" not in text:
        return None
    constant = dict(_SPECIALIZED.findall(text))
    guards = {m.group(1): m.group(2) for line in text.splitlines() if (m := _GUARDED.search(line))}
    fixes = [m.group(0).strip() for line in text.splitlines() if (m := _SUGGESTED.match(line))]
    if constant:
        dims = ", ".join(f"{dim} (to {size}, the example size)" for dim, size in constant.items())
        return ExportError(
            f"export_causal_lm: the forward of {model} specializes {dims}: its code loops or branches "
            "over the tokens in Python (a recurrence over the sequence without an irkit export "
            "kernel, a token-by-token position loop), so no one program serves every prompt "
            f"length ({_versions()}). Remedy: none for this model in irkit yet; run it in "
            "PyTorch, or add an export kernel for its recurrence (docs/llm.md, 'Export "
            "kernels'); torch.export's suggestion: " + ("; ".join(fixes) or "none")
        )
    if guards:
        names = ", ".join(guards)
        dims = "; ".join(f"{dim} only where {guard}" for dim, guard in guards.items())
        bounded = [fix for fix in fixes if "max=" in fix]
        remedy = (
            f"pass max_sequence at most the bound torch.export suggests ({'; '.join(bounded)})"
            if bounded
            else "none in irkit yet (torch.export cannot prove the guard for every length); "
            "report the model"
        )
        return ExportError(
            f"export_causal_lm: the forward of {model} holds only under a guard on {names} that "
            f"torch.export cannot prove over the exported range ({_versions()}): {dims}. "
            f"Remedy: {remedy}"
        )
    return None


def _export_error(what: str, exc: BaseException) -> ExportError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = _model_line(exc)
    return ExportError(
        f"export_causal_lm: {what} failed with {_versions()}: {type(exc).__name__}"
        f"{f': {first}' if first else ''}{f' at {where}' if where else ''}\n"
        "Remedy: if the versions are outside the tested range, install one inside it; else "
        "report the model and the chained error."
    )


def _model_line(exc: BaseException) -> str:
    """``file:line: code`` of the innermost frame of ``exc``'s traceback in a model's code
    (transformers' ``models`` package, or anything outside torch and irkit), or ``""``: where a
    bare ``assert`` of the model failed, which its message does not say."""
    import traceback

    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = frame.filename.replace("\\", "/")
        if any(part in path for part in ("/torch/", "/irkit/", "/transformers/utils/")):
            continue
        short = path.split("/models/")[-1] if "/models/" in path else path.rsplit("/", 1)[-1]
        return f"{short}:{frame.lineno}: {(frame.line or '').strip()}"
    return ""


def _bind(model: Any) -> _Binding:
    if getattr(model, "config", None) is None:
        raise LoweringOptionsError(
            f"export_causal_lm: {type(model).__name__} has no `config`; "
            "pass a transformers causal LM (e.g. LlamaForCausalLM)"
        )
    params = inspect.signature(model.forward).parameters
    cache = next((name for name in _CACHE_ARGS if name in params), "")  # "": no cache at all
    if "input_ids" not in params:
        raise ExportError(
            f"export_causal_lm: {type(model).__name__}.forward takes no input_ids argument "
            f"({_versions()}); pass a decoder-only transformers *ForCausalLM"
        )
    return _Binding(
        cache=cache,
        attention_mask="attention_mask" in params,
        position_ids="position_ids" in params,
        use_cache="use_cache" in params,
    )


def own_cache_class(model: Any) -> type | None:
    """The class the model's forward annotates its cache argument with when that is not a
    transformers ``Cache`` (xLSTM's ``xLSTMCache``): a cache of its own, whose states only a
    probe (:func:`cache_layout`) reveals; None for a transformers cache or none annotated."""
    from transformers.cache_utils import Cache

    name = _bind(model).cache
    if not name:
        return None
    annotation = inspect.signature(model.forward).parameters[name].annotation
    for kind in typing.get_args(annotation) or (annotation,):
        if isinstance(kind, type) and kind is not type(None) and not issubclass(kind, Cache):
            return kind
    return None


def _returned_cache(output: Any) -> Any:
    from transformers.cache_utils import Cache

    values = output.values() if isinstance(output, Mapping) else output
    return next((v for v in values if isinstance(v, Cache)), None)


def _layer_shapes(model: Any, cache: Any) -> CacheLayout:
    layers = getattr(cache, "layers", None)
    if not layers:
        raise ExportError(
            f"export_causal_lm: {type(model).__name__} returned a {type(cache).__name__} without "
            f"`layers` ({_versions()}): only transformers' layered KV caches are supported"
        )
    keys, values = [], []
    for i, layer in enumerate(layers):
        key: Any = getattr(layer, "keys", None)
        value: Any = getattr(layer, "values", None)
        if getattr(key, "ndim", 0) != 4 or getattr(value, "ndim", 0) != 4:
            raise ExportError(
                f"export_causal_lm: layer {i} of {type(model).__name__}'s cache "
                f"({type(layer).__name__}) holds no 4-d key/value tensors "
                "(batch, heads, sequence, head_dim); only attention KV caches are supported"
            )
        keys.append((int(key.shape[1]), int(key.shape[3])))
        values.append((int(value.shape[1]), int(value.shape[3])))
    return CacheLayout(keys=tuple(keys), values=tuple(values), dtype=layers[0].keys.dtype)


def cache_layout(model: Any) -> CacheLayout:
    """The KV cache layout of ``model``, read from the cache it returns for a two-token prompt.

    The model runs once eagerly (``torch.no_grad()``, ``use_cache=True``, an empty
    ``DynamicCache`` passed as its cache, as :func:`export_causal_lm` does) with the export
    kernels that change what the cache holds (:func:`irkit.llm.kernels.layout_kernels`), so the
    layout is the exported program's; nothing is guessed from the config, so multi-query
    attention (one KV head), MLA (in absorbed form: one key and one value head of
    ``kv_lora_rank + qk_rope_head_dim``) and per-layer differences come out as exported.

    Args:
        model: A transformers causal LM.

    Returns:
        The :class:`CacheLayout`.

    Raises:
        LoweringOptionsError: Not a transformers model.
        ExportError: The model fails to run, or returns no layered KV cache.
    """
    import torch

    binding = _bind(model)
    if not binding.cache:  # no cache: nothing carried between steps, or a state list (RWKV)
        from irkit.llm._stacked_states import stacked_states

        specs = stacked_states(model)
        if specs:
            return CacheLayout((), (), dtype=specs[0].dtype, states=specs)
        first = next(iter(model.parameters()), None)
        return CacheLayout((), (), dtype=torch.float32 if first is None else first.dtype)
    from irkit.llm.kernels import layout_kernels

    weighted = not any(p.is_meta for p in model.parameters())
    # a meta-device model runs on fake CPU tensors, and is left as it was; with the module
    # kernels that change what the cache holds (MLA's absorbed form), as it is exported
    with torch.no_grad(), probe_mode(model), keep_module_states(model), layout_kernels(model):
        device = next(iter(model.parameters())).device
        ids = torch.ones((1, 2), dtype=torch.long, device=device)
        states = has_state_layers(model.config)
        # an empty DynamicCache, as export_causal_lm passes one (typed by the config for states)
        passed = empty_cache(model.config) if states else _cache([])
        kwargs: dict[str, Any] = {"input_ids": ids, binding.cache: passed}
        if binding.attention_mask:
            kwargs["attention_mask"] = torch.ones_like(ids)
        if binding.use_cache:
            kwargs["use_cache"] = True
        try:
            output = model(**kwargs)
        except Exception as exc:
            name = type(model).__name__
            own = _own_cache(model, kwargs, binding.cache, passed)
            listed = None if own is None else find_listed_states(own, model.config)
            if listed is not None:  # its states kept in a list of its own (MiniMaxCache)
                return _state_layout(model, own, listed)
            raise (
                _constraint_error(name, exc)
                or _own_cache_error(model, own, passed)
                or _own_layer_error(model)
                or _export_error(f"running {name} on a 2-token prompt", exc)
            ) from exc
        cache = _returned_cache(output)
        if cache is None and getattr(passed, "layers", None):
            cache = passed  # older transformers may return the legacy tuples; it was updated
        if cache is None:
            raise ExportError(
                f"export_causal_lm: {type(model).__name__} returned no transformers Cache for "
                f"use_cache=True ({_versions()}); only models with a KV cache can be exported"
            )
        if states:
            layout = _state_layout(model, cache)
            if weighted:  # numbers: which conv states the next step reads whole
                specs = _whole_convs(model, binding, cache, layout.states)
                layout = dataclasses.replace(layout, states=specs)
            return layout
        return _layer_shapes(model, cache)


def _own_cache(model: Any, kwargs: dict[str, Any], argument: str, passed: Any) -> Any:
    """Where the model refused the cache it was given: the cache of its own class it makes
    given none (MiniMax's ``MiniMaxCache``, xLSTM's ``xLSTMCache``), else None."""
    try:
        output = model(**{k: v for k, v in kwargs.items() if k != argument})
    except Exception:  # it fails without a cache too: the original error stands
        return None
    own = _returned_cache(output)
    if own is None and isinstance(output, Mapping):  # a cache class outside transformers' Cache
        own = next(
            (output[k] for k in (argument, "cache", "past_key_values", "cache_params")
             if output.get(k) is not None),
            None,
        )  # fmt: skip
    return None if own is None or type(own) is type(passed) else own


def _own_cache_error(model: Any, own: Any, passed: Any) -> ExportError | None:
    """The error naming the model's own cache class (:func:`_own_cache`) and what it keeps
    outside transformers' typed layers that no kind reads; None where there is none."""
    if own is None:
        return None
    extra = sorted(
        name
        for name, value in vars(own).items()
        if name != "layers" and isinstance(value, (list, dict))
    )
    return ExportError(
        f"export_causal_lm: {type(model).__name__} keeps its cache in a class of its own, "
        f"{type(own).__name__} (tensors outside transformers' typed cache layers: "
        f"{', '.join(extra) or 'its own attributes'}), and refuses a {type(passed).__name__} "
        f"({_versions()}). irkit reads and writes cache tensors per layer and kind "
        "(irkit/llm/_states.py); this cache has no kind there. Remedy: none for this model in "
        "irkit yet; run it in PyTorch"
    )


def _own_layer_error(model: Any) -> ExportError | None:
    """Where the model failed on the cache it was given and its config types cache layers with
    classes of the model's own (DeepSeek-V4's compressor layers: window buffers, running
    compressed entries, Python counters), the error naming them; else None."""
    own = {
        f"{type(layer).__name__} ({kind!r})"
        for kind, layer in typed_cache_layers(model.config)
        if not type(layer).__module__.startswith("transformers.cache_utils")
    }
    if not own:
        return None
    return ExportError(
        f"export_causal_lm: {type(model).__name__}'s cache layers are classes of its own, "
        f"{', '.join(sorted(own))}, whose state irkit has no cache kind for ({_versions()}). "
        "irkit reads and writes cache tensors per layer and kind (key, value, conv, recurrent, "
        "indexer key: irkit/llm/_states.py); a layer with other state (buffers of a varying "
        "length, counters kept as Python ints) needs a kind of its own there. Remedy: none for "
        "this model in irkit yet; run it in PyTorch"
    )


def _whole_convs(
    model: Any, binding: _Binding, cache: Any, specs: tuple[StateSpec, ...]
) -> tuple[StateSpec, ...]:
    """``specs`` with each convolution state whose oldest column the model reads carried whole.

    A convolution of width ``K`` over ``cat(state, new)`` never reads the oldest of the ``K``
    columns transformers keeps, and irkit carries ``K - 1`` (genai's ``conv_cache_size``). A
    model whose convolutions read all of them (stacked kernels keeping exactly their joint left
    context) would be silently wrong with that. Checked, not assumed: one more token after the
    probe's prompt with a NaN in the oldest column of every conv state. A NaN is read wherever
    it reaches the logits or an attention's inputs (attention kernels may drop a NaN score; a
    NaN times a zero weight stays NaN, so a zero-initialized scale does not hide a read); then
    each state is tried alone. The model runs 1 + (number of conv states, only where one is
    read) one-token steps.
    """
    import torch

    convs = [i for i, spec in enumerate(specs) if spec.kind.name == "conv"]
    if not convs or any(spec.kind.on_module for spec in specs):
        return specs  # (states a module holds: its export kernel reads what it carries)
    whole = [
        widened(spec, cache.layers[spec.layer]) if i in convs else spec
        for i, spec in enumerate(specs)
    ]
    tensors = [spec.kind.read(cache.layers[spec.layer], spec.index) for spec in whole]
    ids = torch.ones((1, 1), dtype=torch.long, device=tensors[0].device)
    grown = [t for s, t in zip(whole, tensors, strict=True) if s.kind.sequence_axis]
    past = int(grown[0].shape[2]) if grown else 2

    def reads(marked: list[int]) -> bool:
        fed = [t.clone() for t in tensors]
        for i in marked:
            fed[i][..., 0] = float("nan")
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            binding.cache: fill_cache(model.config, whole, fed),
        }
        if binding.attention_mask:
            kwargs["attention_mask"] = torch.ones((1, past + 1), dtype=torch.long)
        if binding.use_cache:
            kwargs["use_cache"] = True
        with _nan_at_attention() as seen:
            logits = model(**kwargs).logits
        return seen.found or bool(torch.isnan(logits).any())

    if not reads(convs):
        return specs
    return tuple(whole[i] if i in convs and reads([i]) else s for i, s in enumerate(specs))


def _nan_at_attention() -> Any:
    """A ``TorchFunctionMode`` noting (``.found``) whether a NaN reaches
    ``scaled_dot_product_attention``'s query, key or value."""
    import torch
    from torch.overrides import TorchFunctionMode

    class NaNAtAttention(TorchFunctionMode):  # type: ignore[misc]
        found = False

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if func is torch.nn.functional.scaled_dot_product_attention:
                tensors = [*args[:3], *(kwargs.get(k) for k in ("query", "key", "value"))]
                self.found = self.found or any(
                    isinstance(t, torch.Tensor) and bool(torch.isnan(t).any()) for t in tensors
                )
            return func(*args, **kwargs)

    return NaNAtAttention()


def _state_layout(model: Any, cache: Any, listed: ListedStates | None = None) -> CacheLayout:
    specs = tuple(probe_states(cache, model, listed))
    if not specs:
        raise ExportError(
            f"export_causal_lm: {type(model).__name__} returned a cache with no tensors of a "
            f"known kind ({_versions()})"
        )
    keys = tuple((s.shape[0], s.shape[2]) for s in specs if s.kind.name == "key")
    values = tuple((s.shape[0], s.shape[2]) for s in specs if s.kind.name == "value")
    return CacheLayout(keys=keys, values=values, dtype=specs[0].dtype, states=specs)


def causal_lm_feeds(
    model: Any,
    *,
    batch: int,
    seq: int,
    past: int,
    seed: int = 0,
    position_ids: bool | None = None,
    dtype: Any = None,
    layout: CacheLayout | None = None,
) -> dict[str, np.ndarray]:
    """Random inputs keyed by the ONNX names :func:`export_causal_lm` gives (for tests, benches).

    Args:
        model: The transformers causal LM.
        batch: Batch size.
        seq: New tokens (1 for a decode step).
        past: Cached tokens (0 for a prefill).
        seed: Seed of the numpy generator.
        position_ids: Include ``position_ids`` (default: if ``model.forward`` takes them).
        dtype: dtype of the KV cache tensors (default: the model's cache dtype).
        layout: The model's cache layout (default: :func:`cache_layout`; pass
            ``exported.cache`` to skip the eager run).

    Returns:
        ``{name: array}`` with ``attention_mask`` all ones and positions ``past..past+seq-1``.
    """
    layout = layout or cache_layout(model)
    if position_ids is None:
        position_ids = _bind(model).position_ids
    asked = dtype
    dtype = np.dtype(dtype) if dtype is not None else layout.numpy_dtype()
    rng = np.random.default_rng(seed)
    vocab = int(model.config.get_text_config().vocab_size)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(1, vocab, (batch, seq), dtype=np.int64),
        "attention_mask": np.ones((batch, past + seq), dtype=np.int64),
    }
    if position_ids:
        feeds["position_ids"] = np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))
    if layout.states:
        for spec in layout.states:
            dims = list(spec.kind.empty_shape(batch, spec.shape))
            if spec.kind.sequence_axis is not None:
                dims[spec.kind.sequence_axis] = past
            own = CacheLayout((), (), spec.dtype).numpy_dtype()
            state = rng.standard_normal(dims).astype(own if asked is None else dtype)
            feeds[spec.past_name] = state * np.asarray(0.5, dtype=state.dtype)
        return feeds
    for kind, shapes in (("key", layout.keys), ("value", layout.values)):
        for i, (heads, dim) in enumerate(shapes):
            shape = (batch, heads, past, dim)
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _cache(tensors: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (key, value) in enumerate(tensors):
        cache.update(key, value, i)
    return cache


def _num_layers(feeds: Mapping[str, Any]) -> int:
    return sum(1 for name in feeds if name.startswith("past_key_values.") and name.endswith(".key"))


def _carries_states(model: Any, feeds: Mapping[str, Any]) -> bool:
    """Whether the model's cache holds state kinds: typed by its config, or fed (``past.*``:
    states its own cache class keeps, xLSTM's, which the config does not type)."""
    return has_state_layers(model.config) or any(name.startswith("past.") for name in feeds)


def _torch_inputs(
    model: Any, feeds: Mapping[str, np.ndarray], convert: Callable[[np.ndarray], Any]
) -> dict[str, Any]:
    binding = _bind(model)
    inputs: dict[str, Any] = {
        k: convert(feeds[k]) for k in ("input_ids", "attention_mask", "position_ids") if k in feeds
    }
    if not binding.cache:
        from irkit.llm._stacked_states import STATE_ARGUMENT, stacked_list

        specs = cache_layout(model).states  # a state list of its own (RWKV), or no cache
        if specs:
            inputs[STATE_ARGUMENT] = stacked_list(
                specs, [convert(feeds[s.past_name]) for s in specs]
            )
            inputs["use_cache"] = True
        return inputs
    if _carries_states(model, feeds):
        specs = cache_layout(model).states
        tensors = [convert(feeds[spec.past_name]) for spec in specs]
        inputs[binding.cache] = fill_cache(model.config, specs, tensors, model)
        attends = any(spec.kind.sequence_axis is not None for spec in specs)
        if not attends and "attention_mask" in inputs:  # (as the exported model reads it)
            inputs["attention_mask"] = inputs["attention_mask"][:, -feeds["input_ids"].shape[1] :]
        if binding.use_cache:
            inputs["use_cache"] = True
        return inputs
    pairs = [
        (convert(feeds[f"past_key_values.{i}.key"]), convert(feeds[f"past_key_values.{i}.value"]))
        for i in range(_num_layers(feeds))
    ]
    inputs[binding.cache] = _cache(pairs)
    if binding.use_cache:
        inputs["use_cache"] = True
    return inputs


def torch_inputs(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The keyword arguments of ``model`` for ``feeds`` (a fresh ``DynamicCache``, ``use_cache``).

    Args:
        model: The transformers causal LM.
        feeds: Inputs keyed by ONNX name (as from :func:`causal_lm_feeds`).

    Returns:
        ``{"input_ids": tensor, ..., <cache argument>: DynamicCache, "use_cache": True}``, the
        cache under the name ``model.forward`` gives it (``cache`` or ``past_key_values``).
        States a model keeps on its modules (RecurrentGemma's) are set as those modules'
        attributes (:func:`irkit.llm._states.keep_module_states` puts them back).
    """
    import torch

    return _torch_inputs(model, feeds, lambda a: torch.from_numpy(np.array(a)))


def run_eager(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The eager PyTorch outputs for ``feeds``, in the order of ``export_causal_lm``'s outputs.

    The model runs with the module kernels that change what its cache holds
    (:func:`irkit.llm.kernels.layout_kernels`: MLA in absorbed form), so the cache fed and
    returned has the exported layout.

    Args:
        model: The transformers causal LM (put in eval mode by the caller).
        feeds: Inputs keyed by ONNX name (as from :func:`causal_lm_feeds`).

    Returns:
        ``[logits, present.0.key, …, present.0.value, …]`` as numpy arrays.
    """
    import torch

    from irkit.llm.kernels import layout_kernels

    # (module-held states: put back; the cache as exported, MLA's absorbed form included)
    with torch.no_grad(), keep_module_states(model), layout_kernels(model):
        return _run_eager(model, feeds)


def _run_eager(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    inputs = torch_inputs(model, feeds)
    out = model(**inputs)
    if not _bind(model).cache:
        from irkit.llm._stacked_states import STATE_ARGUMENT, read_stacked

        specs = cache_layout(model).states  # a state list of its own (RWKV), or no cache
        states = read_stacked(out[STATE_ARGUMENT], specs) if specs else []
        return [out.logits.float().numpy(), *(t.float().numpy() for t in states)]
    cache = _returned_cache(out)
    if cache is None:  # older transformers may return legacy tuples; the passed cache was updated
        cache = inputs[_bind(model).cache]
    if _carries_states(model, feeds):
        states = read_states(cache, cache_layout(model).states, model)
        return [out.logits.float().numpy(), *(t.float().numpy() for t in states)]
    keys = [layer.keys.float().numpy() for layer in cache.layers]
    values = [layer.values.float().numpy() for layer in cache.layers]
    return [out.logits.float().numpy(), *keys, *values]


def _register_cache_pytree() -> None:
    """Make ``DynamicCache`` a pytree node the way transformers' exporters do (idempotent).

    Recent transformers register it on request
    (``integrations.executorch.register_dynamic_cache_export_support``); older versions
    (4.54) registered it when ``cache_utils`` was imported.
    """
    import torch.utils._pytree as pytree
    from transformers import DynamicCache

    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError as exc:
        if DynamicCache in pytree.SUPPORTED_NODES:
            return
        raise _export_error("registering DynamicCache as a pytree node", exc) from exc
    try:
        register_dynamic_cache_export_support()
    except Exception as exc:
        raise _export_error("registering DynamicCache as a pytree node", exc) from exc


@contextlib.contextmanager
def _uncached_fake_dispatch() -> Iterator[None]:
    """torch's fake-tensor dispatch cache off, inside the ``with`` only (``torch.export`` speed).

    With dynamic shapes a cache hit rebuilds the op's output from symbolic sizes, strides and
    storage size (``empty_strided`` + ``set_`` on ``SymInt`` values: tens of thousands of sympy
    operations for a 4-layer Llama), which costs more than running the op's meta function again:
    off, ``bench/bench_genai.py``'s 4-layer model exports in ~1.2 s less CPU time (of ~5 s; the
    saving is in the fixed part, even per layer). The cache only memoizes the meta functions,
    so the program is the same (``docs/export.md``). The FakeTensorModes created inside
    (:func:`fake_weights`' and ``torch.export``'s own) read the flag when they are created, so
    the program's own mode keeps its cache off later too (``irkit.lower``'s decomposition traces:
    measured even); ``torch._dynamo.config.patch`` restores the flag on exit.
    """
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(fake_tensor_cache_enabled=False):
        yield


@contextlib.contextmanager
def _windows_by_position() -> Iterator[None]:
    """Sliding windows counted in real tokens, not cache slots, while the model is exported.

    transformers masks a sliding-window layer by cache slot (``kv_idx > q_idx - window``). With a
    left-padded batch (``generate``) the slots of a sequence's tokens are contiguous and the
    two counts agree; onnxruntime-genai right-pads a batch, so a shorter prompt's pads sit
    between its prompt and its new tokens and a slot window would see fewer real tokens. Here the
    window compares the tokens' positions ``cumsum(attention_mask) - 1`` (as ``position_ids``
    are derived) instead: the same mask for left padding, the unpadded sequence's mask for
    right padding. transformers' ``sliding_window_overlay`` is replaced, inside the ``with``
    only, by one reading the 2-d mask the mask builder has just prepared; a transformers
    without these functions is left alone.
    """
    try:
        from transformers import masking_utils
    except ImportError:  # pragma: no cover - older transformers: slot windows as they are
        yield
        return
    preprocess = getattr(masking_utils, "_preprocess_mask_arguments", None)
    overlay = getattr(masking_utils, "sliding_window_overlay", None)
    if preprocess is None or overlay is None:  # pragma: no cover - other transformers layout
        yield
        return
    prepared: list[Any] = [None]  # the 2-d mask of the mask being built (this block only)

    def preprocess_and_keep(*args: Any, **kwargs: Any) -> Any:
        result = preprocess(*args, **kwargs)
        mask = result[1]
        prepared[0] = mask if getattr(mask, "ndim", 0) == 2 else None
        return result

    def by_position(sliding_window: int) -> Callable[..., Any]:
        mask = prepared[0]
        if mask is None:
            return overlay(sliding_window)  # type: ignore[no-any-return]
        positions = mask.long().cumsum(-1) - 1

        def inner(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
            return positions[batch_idx, kv_idx] > positions[batch_idx, q_idx] - sliding_window

        return inner

    masking_utils._preprocess_mask_arguments = preprocess_and_keep
    masking_utils.sliding_window_overlay = by_position
    try:
        yield
    finally:
        masking_utils._preprocess_mask_arguments = preprocess
        masking_utils.sliding_window_overlay = overlay


def _output_names(model: Any, program: Any, presents: list[str]) -> list[str]:
    """The ONNX names of the program's outputs, read from its output spec: each field of the
    model's output by its name (``logits``, Moshi's ``last_hidden_state``, …), the cache's
    tensors as ``presents``.

    Raises:
        ExportError: The outputs hold no cache (RoCBert without ``is_decoder`` updates the
            passed cache and returns logits only).
    """
    from transformers.cache_utils import Cache

    spec = program.call_spec.out_spec
    fields = spec.context if isinstance(spec.context, list) else None
    if fields is None or len(fields) != len(spec.children_specs):
        return ["logits", *presents]  # (a plain tuple: logits then the cache, as before)
    names: list[str] = []
    cached = False
    for field, child in zip(fields, spec.children_specs, strict=True):
        if isinstance(child.type, type) and issubclass(child.type, Cache):
            cached = child.num_leaves == len(presents)
            names += presents if cached else [f"{field}.{i}" for i in range(child.num_leaves)]
        elif child.num_leaves == 1:
            names.append(str(field))
        else:
            names += [f"{field}.{i}" for i in range(child.num_leaves)]
    if not cached:
        raise ExportError(
            f"export_causal_lm: {type(model).__name__} returns {', '.join(map(str, fields))} "
            f"for use_cache=True and no cache of {len(presents)} tensors: its forward does not "
            "return the cache it updates (a BERT-style model used as a decoder needs "
            "is_decoder=True in its config; else it is no causal LM with a cache)"
        )
    return names


def _has_int_where_dim(before: Any, after: Any) -> bool:
    """Whether ``after`` (refined dynamic shapes) made a dim of ``before`` a fixed size, or a
    size derived from a new one (``128·d - 125``: torch solving ``(256 + 128·(s // 128)) mod
    (2 + s // 128) == 0`` for the one residue it saw)."""
    from torch.export.dynamic_shapes import _DerivedDim

    if isinstance(before, Mapping):
        return any(_has_int_where_dim(v, after.get(k)) for k, v in before.items())
    if isinstance(before, (list, tuple)):
        return any(_has_int_where_dim(b, a) for b, a in zip(before, after, strict=False))
    derived = isinstance(after, _DerivedDim) and after is not before
    return before is not None and (isinstance(after, int) or derived)


#: How many times :func:`_export_narrowing` takes torch's narrower ranges for one export.
_NARROWINGS = 3
#: Where :func:`_export_deferred` comes among the retries: after the layout relaxation (ZAYA's
#: guard fails at one length, so its deferred program would not serve that one), before the
#: size-oblivious one (each failed retry is a whole trace: DeepSeek-V4's 7 s).
_DEFERRED_STAGE = 2


def _export_narrowing(
    model: Any,
    kwargs: dict[str, Any],
    dynamic: Any,
    relaxed: int = 0,
    narrowed: int = 0,
    limit: int | None = None,
) -> Any:
    """``torch.export.export``; where torch proves a dim's range narrower than asked (GPT-Neo:
    ``past + new ≤ max positions`` makes each ≤ max - 2) and suggests the narrower ranges, they
    are taken and the export is run again. A suggestion that fixes a dim to one size is not
    taken (the error stands): the program must serve every length.

    A guard torch cannot prove and suggests nothing for (or solves for the example's size) is
    retried under the layout relaxation, then the deferred assertions checked at every size
    (:func:`_export_deferred`), then the size-oblivious relaxation
    (:data:`irkit.llm._guards.RELAXATIONS`; ``relaxed``: how many retries are tried already;
    ``narrowed``: how many narrowings are taken); where every retry fails, the first error
    stands. Where torch *suggested* a range (a fixed size, or one far below the asked range),
    the size-oblivious relaxation is not tried (``limit``: the last retry tried): it decides a
    real branch on the length without an assertion (Doge's mask, top-k beyond a window: the
    program silently wrong past the window), while the layout relaxation and the deferred
    assertions keep such a branch a guard. ``chunk`` of a dynamic dim splits evenly where it can
    (:func:`~irkit.llm._guards.even_chunks`)."""
    import torch

    last = len(RELAXATIONS) + 1 if limit is None else limit  # (relaxations, deferred retry)
    if relaxed == _DEFERRED_STAGE:
        try:
            return _export_deferred(model, kwargs, dynamic)
        except Exception:
            if relaxed == last:
                raise
            return _export_narrowing(model, kwargs, dynamic, relaxed + 1, limit=limit)
    index = relaxed - 1 - (relaxed > _DEFERRED_STAGE)
    relax = RELAXATIONS[index] if relaxed else contextlib.nullcontext

    def relaxed_retry(
        exc: Exception, shown: Exception | None = None, suggested: bool = False
    ) -> Any:
        """The export under the next relaxation; where it fails too, ``shown`` (default:
        ``exc``, torch's error) stands. ``suggested``: torch suggested a range (the
        size-oblivious relaxation is then not tried)."""
        shown = exc if shown is None else shown
        cap = min(last, _DEFERRED_STAGE) if suggested else last
        if relaxed >= cap or not any(map(_GUARDED.search, str(exc).splitlines())):
            raise shown from exc if shown is not exc else None
        try:
            return _export_narrowing(model, kwargs, dynamic, relaxed + 1, limit=cap)
        except Exception:
            raise shown from exc if shown is not exc else None

    try:
        with relax(), even_chunks():
            program = torch.export.export(model, (), kwargs, dynamic_shapes=dynamic)
    except torch._dynamo.exc.UserError as exc:
        if "Suggested fixes" not in str(exc):
            return relaxed_retry(exc)
        from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

        fixes = str(exc).split("Suggested fixes:", 1)[1].strip().split("\n\n", 1)[0]
        message = "Suggested fixes:\n" + fixes  # (torch's parser reads only the fix lines)
        refined = refine_dynamic_shapes_from_suggested_fixes(message, dynamic)
        if _has_int_where_dim(dynamic, refined):
            # (a guard torch cannot prove, solved for the example's size: ProphetNet's layout
            # checks give ``sequence = 3``; a relaxation may leave a range to serve)
            return relaxed_retry(exc, suggested=True)
        cut = _narrowed_below_half(dynamic, refined)
        if cut:
            # (a narrowing far below the asked range is refused; a relaxation may serve it
            # whole: Inkling2's ``sequence < 4`` is a layout decision's guard)
            return relaxed_retry(exc, _NarrowedError(cut), suggested=True)
        if narrowed == _NARROWINGS:
            raise
        # (again on the narrower dims, with what a guard left there relaxed as before)
        return _export_narrowing(model, kwargs, refined, relaxed, narrowed + 1, limit)
    assumed = backed_assertions(program) if relaxed else []
    if assumed:
        raise ExportError(f"the relaxed export assumes {'; '.join(assumed)}")
    return program


def _export_deferred(model: Any, kwargs: dict[str, Any], dynamic: Any) -> Any:
    """A retry of :func:`_export_narrowing`: ``torch.export`` leaves the guards it cannot
    prove in the program as runtime assertions, and each is checked at every size of its range
    (:func:`~irkit.llm._guards.holding_ranges`). Where they hold on all of it, the program
    serves the whole range; where they hold on a narrower interval around the traced size
    (XLNet: ``sequence ≥ 2``), it is exported again on that interval (refused below half the
    asked maximum, as a narrowing); else the export fails with the assertions."""
    import torch

    def export(dims: Any) -> Any:
        with even_chunks():
            return torch.export.export(
                model, (), kwargs, dynamic_shapes=dims,
                prefer_deferred_runtime_asserts_over_guards=True,
            )  # fmt: skip

    program = export(dynamic)
    example, dims = _size_symbols(program, kwargs, dynamic)
    holding = holding_ranges(program, example, _one_size(dims))
    if holding is None:
        raise ExportError(f"the relaxed export assumes {'; '.join(backed_assertions(program))}")
    ranges = {str(k): (int(v.lower), int(v.upper)) for k, v in program.range_constraints.items()}
    narrower = {dims[k]: v for k, v in holding.items() if v != ranges.get(k) and k in dims}
    if not narrower:
        return program
    new = {
        id(dim): torch.export.Dim(dim.__name__, min=low, max=high)
        for dim, (low, high) in narrower.items()
    }
    refined = _replace_dims(dynamic, new)
    cut = _narrowed_below_half(dynamic, refined)
    if cut:
        raise _NarrowedError(cut)
    program = export(refined)
    example, dims = _size_symbols(program, kwargs, refined)
    holding = holding_ranges(program, example, _one_size(dims))
    ranges = {str(k): (int(v.lower), int(v.upper)) for k, v in program.range_constraints.items()}
    if holding is None or any(v != ranges.get(k) for k, v in holding.items()):
        raise ExportError(f"the relaxed export assumes {'; '.join(backed_assertions(program))}")
    return program


def _size_symbols(program: Any, kwargs: dict[str, Any], dynamic: Any) -> tuple[Any, Any]:
    """Each size symbol of ``program``'s inputs (``s53``): its traced value, and the ``Dim``
    of ``dynamic`` it stands for."""
    values: dict[str, int] = {}
    dims: dict[str, Any] = {}
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in kwargs:
            continue
        shape = getattr(node.meta.get("val"), "shape", ())
        axes = dynamic.get(node.name) or {}
        for axis, size in enumerate(shape):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if expr is None or not getattr(expr, "is_Symbol", False):
                continue
            values[str(expr)] = int(kwargs[node.name].shape[axis])
            if axis in axes:
                dims[str(expr)] = axes[axis]
    return values, dims


def _one_size(dims: dict[str, Any]) -> dict[str, str]:
    """Symbols of one ``Dim`` (``{"s53": dim, "s70": dim}``) → the first of them."""
    first: dict[int, str] = {}
    return {name: first.setdefault(id(dim), name) for name, dim in dims.items()}


def _replace_dims(spec: Any, new: dict[int, Any]) -> Any:
    """``spec`` (dynamic shapes) with each ``Dim`` whose ``id`` is in ``new`` replaced."""
    if isinstance(spec, Mapping):
        return {k: _replace_dims(v, new) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(_replace_dims(v, new) for v in spec)
    return new.get(id(spec), spec)


class _NarrowedError(Exception):
    """torch.export proves the program only for dims far below the asked range (see
    :func:`_narrowed_below_half`); ``dims`` maps each such dim's name to (its max, the max
    asked)."""

    def __init__(self, dims: dict[str, tuple[int, int]]) -> None:
        super().__init__(", ".join(f"{k} <= {v[0]}" for k, v in dims.items()))
        self.dims = dims


def _narrowed_below_half(before: Any, after: Any) -> dict[str, tuple[int, int]]:
    """The dims ``after`` (refined dynamic shapes) bounds below half the max ``before`` asked.

    A position table bounds ``past + new`` by the positions limit, so each dim keeps nearly
    the whole range (GPT-Neo: max - 2); a branch on the length (a mask that switches to top-k
    beyond a window of 8 tokens) cuts it to the example's side of the branch, far below: the
    program would be silently wrong past it.
    """
    cut: dict[str, tuple[int, int]] = {}
    if isinstance(before, Mapping):
        for k, v in before.items():
            cut.update(_narrowed_below_half(v, after.get(k) if after else None))
    elif isinstance(before, (list, tuple)):
        for b, a in zip(before, after or (), strict=False):
            cut.update(_narrowed_below_half(b, a))
    else:
        asked, got = getattr(before, "max", None), getattr(after, "max", None)
        if isinstance(asked, int) and isinstance(got, int) and 2 * got < asked:
            cut[str(getattr(after, "__name__", "dim"))] = (got, asked)
    return cut


def export_causal_lm(
    model: Any,
    *,
    batch: int = 2,
    seq: int = 3,
    past: int = 5,
    position_ids: bool | None = None,
    max_sequence: int | None = None,
    cache: bool = True,
) -> CausalLMExport:
    """Export a transformers causal LM with its KV cache as inputs and outputs.

    The model is exported as it is (call ``model.eval()`` first), without an outer
    ``torch.no_grad()``, at example sizes ``batch``/``seq``/``past`` that become the dynamic
    dims ``batch``, ``sequence``, ``past_sequence`` and ``total_sequence`` (pick sizes ≥ 2 that
    differ from each other so torch.export does not specialize them). The example cache has the
    model's own layout and dtype (:func:`cache_layout`). The model is not modified.

    Args:
        model: A transformers ``*ForCausalLM`` with a decoder-only config.
        batch: Example batch size.
        seq: Example number of new tokens.
        past: Example number of cached tokens.
        position_ids: Add a ``position_ids`` input (default: if ``model.forward`` takes it).
        max_sequence: Upper bound of the sequence dims (default:
            ``config.max_position_embeddings``).
        cache: ``False`` exports the model **without a cache**, as a model without a cache
            argument (GPT-1) is always exported: ``input_ids``, ``attention_mask`` (and
            ``position_ids``) of the whole sequence in, ``logits`` out, ``use_cache=False``;
            :func:`generate_greedy` re-feeds the whole sequence at every step (quadratic in
            the length, exact). For a model whose cached step cannot be captured (its own
            calling convention, a cache class of its own, a guard on the new tokens); not for
            onnxruntime-genai, which carries a cache between steps.

    Returns:
        A :class:`CausalLMExport`: the program and the names for :func:`irkit.lower`.

    Raises:
        LoweringOptionsError: Not a transformers model, or unusable sizes.
        ExportError: transformers or torch.export failed (the message names both versions and
            the tested range; the original exception is chained), or the model has no KV cache.

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

    if min(batch, seq, past) < 2 or len({batch, seq, past, seq + past}) < 4:
        raise LoweringOptionsError(
            f"export_causal_lm: example sizes batch={batch}, seq={seq}, past={past} would be "
            "specialized by torch.export; use distinct sizes >= 2 (e.g. batch=2, seq=3, past=5)"
        )
    binding = _bind(model)
    if position_ids is None:
        position_ids = binding.position_ids
    if not cache:  # (no cache probe: the model's cache may be what cannot be captured)
        first = next(iter(model.parameters()), None)
        layout = CacheLayout((), (), dtype=torch.float32 if first is None else first.dtype)
        return _export_uncached(model, binding, layout, batch, seq, position_ids, max_sequence)
    try:
        return _export_cached(model, binding, batch, seq, past, position_ids, max_sequence)
    except ExportError as exc:
        if not binding.cache:  # (no cache to leave out: the error stands)
            raise
        raise _without_cache_remedy(exc) from (exc.__cause__ or exc)


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """Logger ``name`` silent inside the ``with`` only: a probe's failure on fake tensors is
    irkit's verdict (an ``ExportError``, or none), not a traceback torch logs on stderr."""
    import logging

    logger = logging.getLogger(name)
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


def _check_one_token_step(model: Any, binding: _Binding) -> None:
    """Run the model on a 2-token prompt, then on one new token with the cache it returned,
    as :func:`generate_greedy` drives the exported program; a model that fails there takes
    another calling convention (CPM-Ant: the whole sequence at every step, the cached prefix
    sliced off inside), which a cached program would compute wrong. Weights on the meta device
    run on fake tensors (:func:`irkit.llm._meta.probe_mode`: shapes only, which is where such a
    convention fails); there a value the fake run cannot compute (a data-dependent op) is no
    verdict.

    Raises:
        ExportError: The one-token step fails (the model's error chained).
    """
    import torch
    from torch._subclasses import fake_tensor

    from irkit.llm.kernels import layout_kernels

    no_verdict = (
        fake_tensor.DataDependentOutputException,
        fake_tensor.DynamicOutputShapeException,
        fake_tensor.UnsupportedOperatorException,
        torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode,
    )
    with (
        torch.no_grad(),
        probe_mode(model),
        keep_module_states(model),
        layout_kernels(model),
        _quiet_logger("torch._subclasses.fake_tensor"),
    ):
        device = next(iter(model.parameters())).device
        ids = torch.ones((1, 3), dtype=torch.long, device=device)
        kwargs: dict[str, Any] = {"input_ids": ids[:, :2], binding.cache: _cache([])}
        if binding.use_cache:
            kwargs["use_cache"] = True
        if binding.attention_mask:
            kwargs["attention_mask"] = torch.ones_like(ids[:, :2])
        try:
            cache = _returned_cache(model(**kwargs)) or kwargs[binding.cache]
        except Exception:  # (cache_layout ran this prompt: a failure is not the step's)
            return
        kwargs.update({"input_ids": ids[:, 2:], binding.cache: cache})
        if binding.attention_mask:
            kwargs["attention_mask"] = torch.ones_like(ids)
        try:
            model(**kwargs)
        except no_verdict:
            return
        except Exception as exc:
            name = type(model).__name__
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            where = _model_line(exc)
            raise ExportError(
                f"export_causal_lm: {name} fails on one new token with the cache of the tokens "
                f"before ({type(exc).__name__}{f': {first}' if first else ''}"
                f"{f' at {where}' if where else ''}; {_versions()}): its forward does not take "
                "the new tokens alone with its cache (a calling convention of its own, e.g. the "
                "whole sequence at every step with the cached prefix sliced off inside), so a "
                "cached step exported from it would compute something else. Remedy: none with a "
                "cache in irkit"
            ) from exc


def _without_cache_remedy(exc: ExportError) -> ExportError:
    """``exc`` (a cached export's failure) with the remedy of exporting without a cache."""
    return ExportError(
        f"{exc}\nRemedy without a cache: the failure may be the cached step's alone (a calling "
        "convention of the model's own: the whole sequence at every step, a cache class or "
        "layers of its own, one new token at a time, a guard on the new tokens); "
        "export_causal_lm(model, cache=False) exports ids in, logits out, and "
        "irkit.llm.generate_greedy re-feeds the whole sequence at every step (exact, "
        "quadratic in the length; not for onnxruntime-genai, which needs a cache)"
    )


def _export_cached(
    model: Any,
    binding: _Binding,
    batch: int,
    seq: int,
    past: int,
    position_ids: bool,
    max_sequence: int | None,
) -> CausalLMExport:
    """:func:`export_causal_lm` with the model's cache: a KV cache, or states of several kinds."""
    import torch

    layout = cache_layout(model)
    if not binding.cache and not layout.states:
        return _export_uncached(model, binding, layout, batch, seq, position_ids, max_sequence)
    if not layout.states:
        _check_one_token_step(model, binding)
    if layout.states:
        return _export_states(model, binding, layout, batch, seq, past, position_ids, max_sequence)
    from irkit.llm.kernels import export_kernels

    _register_cache_pytree()
    limit = max_sequence or _positions_limit(model)
    d_batch = torch.export.Dim("batch", max=4096)
    d_seq = torch.export.Dim("sequence", max=limit)
    d_past = torch.export.Dim("past_sequence", max=limit)
    d_total = torch.export.Dim("total_sequence", min=4, max=2 * limit)  # a guard of the mask code
    feeds = causal_lm_feeds(
        model, batch=batch, seq=seq, past=past, position_ids=position_ids, layout=layout
    )

    def convert(array: np.ndarray) -> Any:
        tensor = torch.from_numpy(np.array(array))
        return tensor.to(layout.dtype) if tensor.is_floating_point() else tensor

    kv = {0: d_batch, 2: d_past}
    layers = layout.num_layers
    dynamic: dict[str, Any] = {
        "input_ids": {0: d_batch, 1: d_seq},
        "attention_mask": {0: d_batch, 1: d_total},
        binding.cache: [[kv] * layers, [kv] * layers],
    }
    if binding.use_cache:
        dynamic["use_cache"] = None
    if position_ids:
        dynamic["position_ids"] = {0: d_batch, 1: d_seq}
    try:
        # meta weights are exported as fake CPU tensors: what forward builds from Python data
        # (list indices, torch.tensor(...)) is lifted as a constant with its values
        with (
            _uncached_fake_dispatch(),
            fake_weights(model),
            _windows_by_position(),
            export_kernels(model),
        ):
            device = next(iter(model.parameters())).device
            inputs = _torch_inputs(model, feeds, lambda a: convert(a).to(device))
            program = _export_narrowing(model, inputs, dynamic)
    except Exception as exc:
        name = type(model).__name__
        raise _constraint_error(name, exc) or _export_error(
            f"torch.export.export of {name}", exc
        ) from exc
    past_names = [f"past_key_values.{i}.{kind}" for kind in ("key", "value") for i in range(layers)]
    input_names = ["input_ids", "attention_mask"]
    if position_ids:
        input_names.append("position_ids")
    presents = [n.replace("past_key_values", "present") for n in past_names]
    output_names = _output_names(model, program, presents)
    return CausalLMExport(
        program=program,
        input_names=input_names + past_names,
        output_names=output_names,
        cache=layout,
        position_ids=bool(position_ids),
        dynamic_shapes=dynamic,
    )


def _positions_limit(model: Any) -> int:
    """``max_position_embeddings`` where the config has a usable one (XLNet's is -1), else 4096."""
    limit = getattr(model.config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit >= 4 else 4096


def _dims(model: Any, max_sequence: int | None) -> tuple[Any, Any, Any, Any]:
    import torch

    limit = max_sequence or _positions_limit(model)
    return (
        torch.export.Dim("batch", max=4096),
        torch.export.Dim("sequence", max=limit),
        torch.export.Dim("past_sequence", max=limit),
        torch.export.Dim("total_sequence", min=4, max=2 * limit),  # a guard of the mask code
    )


def _export_uncached(
    model: Any,
    binding: _Binding,
    layout: CacheLayout,
    batch: int,
    seq: int,
    position_ids: bool,
    max_sequence: int | None,
) -> CausalLMExport:
    """:func:`export_causal_lm` without a cache: ids (and mask) in, logits out; each step
    reads the whole sequence (:func:`generate_greedy` feeds it so). A model with a cache
    argument runs with ``use_cache=False`` (``cache=False``) through :func:`_logits_model`."""
    import torch

    from irkit.llm.kernels import export_kernels

    limit = max_sequence or _positions_limit(model)
    # (below the table's length: learned position tables guard sequence != their length)
    d_batch, d_seq, _, _ = _dims(model, limit - 1)
    feeds = causal_lm_feeds(
        model, batch=batch, seq=seq, past=0, position_ids=position_ids, layout=layout
    )
    dynamic: dict[str, Any] = {"input_ids": {0: d_batch, 1: d_seq}}
    if binding.attention_mask:
        dynamic["attention_mask"] = {0: d_batch, 1: d_seq}
    if position_ids:
        dynamic["position_ids"] = {0: d_batch, 1: d_seq}
    try:
        with _uncached_fake_dispatch(), fake_weights(model), export_kernels(model):
            first = next(iter(model.parameters()), None)
            device = first.device if first is not None else torch.device("cpu")
            kwargs = {name: torch.from_numpy(feeds[name]).to(device) for name in dynamic}
            program = _export_narrowing(_logits_model(model, binding), kwargs, dynamic)
    except Exception as exc:
        name = type(model).__name__
        raise _constraint_error(name, exc) or _export_error(
            f"torch.export.export of {name}", exc
        ) from exc
    return CausalLMExport(
        program=program,
        input_names=list(dynamic),
        output_names=["logits"],
        cache=layout,
        position_ids=bool(position_ids),
        dynamic_shapes=dynamic,
    )


def _logits_model(model: Any, binding: _Binding) -> Any:
    """``model`` with a forward ``(input_ids, attention_mask, position_ids) → logits`` that
    passes ``use_cache=False`` (and ``use_mems=False``: XLNet's memory) where ``forward`` takes
    it (nothing cached, nothing returned but the logits: ProphetNet's n-gram logits, a cache
    built anyway are left out).

    A shallow copy of ``model`` (same parameters, buffers and submodules: weight names and
    module paths are the model's own) whose class subclasses the model's under its name, as
    :func:`irkit.llm._states.flat_model` does; ``model`` is not changed.
    """
    import copy

    base = type(model)
    remembers = "use_mems" in inspect.signature(model.forward).parameters

    def forward(
        self: Any, input_ids: Any, attention_mask: Any = None, position_ids: Any = None
    ) -> Any:
        kwargs: dict[str, Any] = {"input_ids": input_ids}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if binding.use_cache:
            kwargs["use_cache"] = False
        if remembers:  # (a memory is a cache by another name: XLNet's, cut to ``mem_len``)
            kwargs["use_mems"] = False
        output = base.forward(self, **kwargs)
        return output["logits"] if isinstance(output, Mapping) else output[0]

    namespace = {
        "forward": forward,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
    }
    logits = copy.copy(model)
    logits.__class__ = type(base.__name__, (base,), namespace)
    return logits


def _export_states(
    model: Any,
    binding: _Binding,
    layout: CacheLayout,
    batch: int,
    seq: int,
    past: int,
    position_ids: bool,
    max_sequence: int | None,
) -> CausalLMExport:
    """:func:`export_causal_lm` for a cache of several kinds (``layout.states``).

    The model is exported through :func:`irkit.llm._states.flat_model` (flat tensors in and out,
    the model's own weights and module paths) with its hub-kernel recurrences swapped for
    irkit's export kernels (:func:`irkit.llm.kernels.export_kernels`), so one program serves a
    prefill of any length and a one-token decode. Every state is fed, zeros before the first
    token: a zero convolution state is the convolution's own zero padding, a zero recurrent
    state the recurrence's start.
    """
    import torch

    from irkit.llm._stacked_states import flat_stacked_model
    from irkit.llm.kernels import export_kernels

    d_batch, d_seq, d_past, d_total = _dims(model, max_sequence)
    feeds = causal_lm_feeds(
        model, batch=batch, seq=seq, past=past, position_ids=position_ids, layout=layout
    )
    state_dims = tuple(
        {0: d_batch, spec.kind.sequence_axis: d_past}
        if spec.kind.sequence_axis is not None
        else {0: d_batch}
        for spec in layout.states
    )
    dynamic: dict[str, Any] = {
        "input_ids": {0: d_batch, 1: d_seq},
        "attention_mask": {0: d_batch, 1: d_total},
        "states": state_dims,
    }
    if position_ids:
        dynamic["position_ids"] = {0: d_batch, 1: d_seq}
    flat = (
        flat_model(model, layout.states, binding.cache, binding.use_cache)
        if binding.cache
        else flat_stacked_model(model, layout.states)  # a state list of its own (RWKV)
    )
    try:
        with (
            _uncached_fake_dispatch(),
            fake_weights(model),
            _windows_by_position(),
            export_kernels(model),
        ):
            device = next(iter(model.parameters())).device
            kwargs: dict[str, Any] = {
                name: torch.from_numpy(feeds[name]).to(device) for name in dynamic if name in feeds
            }
            kwargs["states"] = tuple(
                torch.from_numpy(feeds[spec.past_name]).to(spec.dtype).to(device)
                for spec in layout.states
            )
            program = _export_narrowing(flat, kwargs, dynamic)
    except Exception as exc:
        name = type(model).__name__
        raise _constraint_error(name, exc) or _export_error(
            f"torch.export.export of {name}", exc
        ) from exc
    input_names = ["input_ids", "attention_mask"]
    if position_ids:
        input_names.append("position_ids")
    return CausalLMExport(
        program=program,
        input_names=input_names + [spec.past_name for spec in layout.states],
        output_names=["logits"] + [spec.present_name for spec in layout.states],
        cache=layout,
        position_ids=bool(position_ids),
        dynamic_shapes=dynamic,
    )


def one_cache_shape(layout: CacheLayout) -> tuple[int, int]:
    """The one ``(heads, head size)`` every key and value tensor is stored with: the widest.

    onnxruntime-genai has one head count and one head size for all keys and values. A model
    whose values are narrower than its keys (MLA: DeepSeek-V3's keys carry the rotary part),
    whose keys are narrower than its values (MiniCPM3), or whose layers differ (Gemma 4's
    global layers) is stored with every tensor zero-padded to the widest heads and head size
    (:func:`pad_value_cache`); the model slices each back before use.

    Args:
        layout: The model's cache layout.

    Returns:
        ``(heads, head_size)``.

    Raises:
        LoweringOptionsError: The layout has no keys and values.
    """
    shapes = [*layout.keys, *layout.values]
    if not shapes:
        raise LoweringOptionsError("export: the cache holds no keys and values")
    return max(h for h, _ in shapes), max(d for _, d in shapes)


def _kv_entries(layout: CacheLayout) -> list[tuple[str, str, int, int]]:
    """``(past name, present name, heads, head size)`` of every key and value tensor."""
    if layout.states:
        return [
            (spec.past_name, spec.present_name, spec.shape[0], spec.shape[2])
            for spec in layout.states
            if spec.kind.sequence_axis is not None
        ]
    return [
        (f"past_key_values.{i}.{kind}", f"present.{i}.{kind}", heads, dim)
        for kind, shapes in (("key", layout.keys), ("value", layout.values))
        for i, (heads, dim) in enumerate(shapes)
    ]


def pad_value_cache(model: Any, layout: CacheLayout) -> Any:
    """Store every key and value tensor zero-padded to :func:`one_cache_shape` (in place).

    Each narrower ``past_key_values.*`` input becomes ``(batch, heads, past, head_size)`` of the
    widest heads and head size and is sliced back (axes 1 and 3) before its first use; each
    ``present.*`` output is the model's tensor padded with zeros on those axes. The model
    computes exactly what it did; only the cache tensors are wider.

    Args:
        model: The ``onnx_ir.Model`` lowered from :func:`export_causal_lm`'s program.
        layout: Its cache layout.

    Returns:
        ``model``.
    """
    import onnx_ir as ir

    entries = _kv_entries(layout)
    if not entries:
        return model
    heads, width = one_cache_shape(layout)
    graph = model.graph
    inputs = {value.name: value for value in graph.inputs}
    outputs = {value.name: i for i, value in enumerate(graph.outputs)}

    def constant(values: list[int]) -> ir.Node:
        return ir.node("Constant", [], attributes={"value": ir.tensor(np.array(values))})

    added: list[ir.Node] = []
    for past_name, present_name, own_heads, own_dim in entries:
        if (own_heads, own_dim) == (heads, width):
            continue
        past = inputs[past_name]
        uses = list(past.uses())
        narrower = [
            (axis, n) for axis, n, m in ((1, own_heads, heads), (3, own_dim, width)) if n < m
        ]
        starts = constant([0] * len(narrower))
        ends = constant([n for _, n in narrower])
        axes = constant([axis for axis, _ in narrower])
        sliced = ir.node(
            "Slice",
            [past, starts.outputs[0], ends.outputs[0], axes.outputs[0]],
            num_outputs=1,
        )
        sliced.outputs[0].name = f"{past_name}.unpadded"
        sliced.outputs[0].dtype = past.dtype
        for user, index in uses:
            user.replace_input_with(index, sliced.outputs[0])
        dims = list(past.shape.dims) if past.shape is not None else [None] * 4
        past.shape = ir.Shape([dims[0], heads, dims[2], width])
        added += [starts, ends, axes, sliced]
        present = graph.outputs[outputs[present_name]]
        present.name = f"{present_name}.unpadded"
        pads = constant([0, 0, 0, 0, 0, heads - own_heads, 0, width - own_dim])
        padded = ir.node("Pad", [present, pads.outputs[0]], num_outputs=1)
        padded.outputs[0].name = present_name
        padded.outputs[0].dtype = present.dtype
        if present.shape is not None:
            out = list(present.shape.dims)
            padded.outputs[0].shape = ir.Shape([out[0], heads, out[2], width])
        graph.outputs[outputs[present_name]] = padded.outputs[0]
        added += [pads, padded]
    if added:
        first = next(iter(graph), None)
        if first is None:
            graph.extend(added)
        else:
            graph.insert_before(first, added)
        graph.sort()
    return model


_ORT_FLOATS = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
}


def _positions(mask: np.ndarray) -> np.ndarray:
    """Position ids as transformers' ``generate`` derives them: ``cumsum(mask) - 1``, pads 0."""
    positions: np.ndarray = np.maximum(np.cumsum(mask, axis=-1) - 1, 0).astype(np.int64)
    return positions


def _empty_past(session: Any, batch: int) -> dict[str, np.ndarray]:
    feeds = {}
    for arg in session.get_inputs():
        if arg.name.startswith("past."):  # a state: fixed-size (conv), or growing (indexer keys)
            dims = [d if isinstance(d, int) else 0 for d in arg.shape[1:]]
            growing = sum(not isinstance(d, int) for d in arg.shape[1:])
            if growing > 1 or arg.type not in _ORT_FLOATS:
                raise LoweringOptionsError(
                    f"generate_greedy: input {arg.name!r} has shape {arg.shape} and type "
                    f"{arg.type}; expected (batch, …) with static dims after batch but at most "
                    "one (the past sequence) and a float type, as irkit.llm.export_causal_lm "
                    "writes"
                )
            feeds[arg.name] = np.zeros((batch, *dims), dtype=_ORT_FLOATS[arg.type])
            continue
        if not arg.name.startswith("past_key_values."):
            continue
        heads, dim = arg.shape[1], arg.shape[3]
        if not isinstance(heads, int) or not isinstance(dim, int) or arg.type not in _ORT_FLOATS:
            raise LoweringOptionsError(
                f"generate_greedy: input {arg.name!r} has shape {arg.shape} and type {arg.type}; "
                "expected (batch, heads, past_sequence, head_dim) with static heads and head_dim "
                "and a float type, as irkit.llm.export_causal_lm writes"
            )
        feeds[arg.name] = np.zeros((batch, heads, 0, dim), dtype=_ORT_FLOATS[arg.type])
    return feeds


def _past_name(present: str) -> str:
    """The input a present output is fed back to (``present.3.conv`` → ``past.3.conv``,
    ``present.3.conv.1`` → ``past.3.conv.1``)."""
    from irkit.llm._stacked_states import STACKED_KINDS

    _, layer, rest = present.split(".", 2)
    kind, dot, index = rest.partition(".")
    formats = {**past_to_present(), **{k.present_format: k.past_format for k in STACKED_KINDS}}
    for present_format, past_format in formats.items():
        if present_format == f"present.%d.{kind}":
            return past_format % int(layer) + dot + index
    return present.replace("present.", "past_key_values.", 1)


def generate_greedy(
    session: Any,
    input_ids: Any,
    attention_mask: Any = None,
    *,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> np.ndarray:
    """Greedy decoding of a model exported by :func:`export_causal_lm`, with its KV cache.

    A prefill with an empty cache, then one decode step per new token: the arg-max of the last
    logits is the next token, ``present.*`` is fed back as ``past_key_values.*``, the mask grows
    by one and ``position_ids`` are ``cumsum(attention_mask) - 1`` (pads 0), as transformers'
    ``generate(do_sample=False)`` does; batches may be left-padded (zeros on the left of
    ``attention_mask``). No tokenizer: ids in, ids out.

    Args:
        session: An ``onnxruntime.InferenceSession`` of the lowered model (or anything with its
            ``get_inputs()``/``get_outputs()``/``run(None, feeds)``).
        input_ids: ``(batch, prompt)`` int token ids.
        attention_mask: ``(batch, prompt)`` 0/1 (default: all ones).
        max_new_tokens: Tokens to generate.
        eos_token_id: A sequence that produced it is finished (later tokens are
            ``pad_token_id``); generation stops when every sequence is finished.
        pad_token_id: Token after the end of a finished sequence (default: ``eos_token_id``).

    Returns:
        ``(batch, prompt + generated)`` int64 ids: the prompt, then the new tokens.

    Raises:
        LoweringOptionsError: The session's inputs are not those ``export_causal_lm`` names.

    Example:
        >>> import onnxruntime as ort                                       # doctest: +SKIP
        >>> from irkit.llm import generate_greedy
        >>> session = ort.InferenceSession("llama.onnx")                    # doctest: +SKIP
        >>> generate_greedy(session, [[5, 17, 42]], max_new_tokens=4)       # doctest: +SKIP
        array([[ 5, 17, 42, 96, 96, 11,  3]])
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim != 2:
        raise LoweringOptionsError(f"generate_greedy: input_ids must be 2-d, got {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int64)
    if mask.shape != ids.shape:
        raise LoweringOptionsError(
            f"generate_greedy: attention_mask {mask.shape} and input_ids {ids.shape} differ"
        )
    inputs = {arg.name for arg in session.get_inputs()}
    outputs = [arg.name for arg in session.get_outputs()]
    if "input_ids" not in inputs or "logits" not in outputs:
        raise LoweringOptionsError(
            f"generate_greedy: the session takes {sorted(inputs)} and returns {outputs}; expected "
            "input_ids, attention_mask, past_key_values.* and logits, present.* (the names "
            "irkit.llm.export_causal_lm gives)"
        )
    pad = eos_token_id if pad_token_id is None else pad_token_id
    step_ids, past = ids, _empty_past(session, ids.shape[0])
    fed_back = {name for name in outputs if name.startswith("present.")}
    finished = np.zeros(ids.shape[0], dtype=bool)
    new: list[np.ndarray] = []
    for _ in range(max_new_tokens):
        feeds = {"input_ids": step_ids, **past}
        if "attention_mask" in inputs:
            feeds["attention_mask"] = mask
        if "position_ids" in inputs:
            feeds["position_ids"] = _positions(mask)[:, -step_ids.shape[1] :]
        result = dict(zip(outputs, session.run(None, feeds), strict=True))
        token = result["logits"][:, -1].argmax(-1).astype(np.int64)
        if eos_token_id is not None:
            token = np.where(finished, pad, token)
            finished |= token == eos_token_id
        new.append(token)
        if finished.all():
            break
        step_ids = token[:, None]
        mask = np.concatenate([mask, np.ones_like(step_ids)], axis=1)
        if not fed_back:  # a model without a cache re-reads the whole sequence
            step_ids = np.concatenate([ids, *(t[:, None] for t in new)], axis=1)
        past = {_past_name(name): value for name, value in result.items() if name in fed_back}
    return np.concatenate([ids, np.stack(new, axis=1)], axis=1) if new else ids
