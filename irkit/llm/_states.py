"""Cache kinds: the tensors a causal LM carries between steps, by kind, as ONNX inputs/outputs.

transformers 5.x keeps every layer's state in one ``DynamicCache`` whose layers are typed by the
config (``get_layer_types_and_kwargs``): attention layers hold keys and values that grow by the
new tokens; linear-attention / state-space layers (``LinearAttentionLayer``) hold a convolution
state and a recurrent state of fixed size; hybrid layers hold both. Each tensor kind is one
:class:`StateKind` here: how it is read from and written into a transformers cache layer, its
ONNX names (the ones onnxruntime-genai's ``genai_config.json`` maps), which axis grows with the
sequence, and the genai keys. A new kind is one more subclass in :data:`KINDS`.

Names, as onnxruntime-genai's model builder writes them (``N`` is the decoder layer's index):

===========  ===========================  =========================  ========================
kind         input                        output                     shape
===========  ===========================  =========================  ========================
key          ``past_key_values.N.key``    ``present.N.key``          (batch, heads, past, d)
value        ``past_key_values.N.value``  ``present.N.value``        (batch, heads, past, d)
conv         ``past.N.conv``              ``present.N.conv``         (batch, channels, K - 1)
recurrent    ``past.N.recurrent``         ``present.N.recurrent``    (batch, …) fixed
indexer_key  ``past.N.indexer_key``       ``present.N.indexer_key``  (batch, past, d)
===========  ===========================  =========================  ========================

The convolution state is the last ``K - 1`` inputs of a width-``K`` causal convolution (what
genai allocates, ``conv_cache_size``); transformers keeps ``K`` columns, whose oldest no output
reads, so it is padded by one zero column on the way in and dropped on the way out. A layer
that keeps several states of one kind (transformers' ``state_idx``: a convolution per
projection) names the later ones with a suffix, ``past.N.conv.1``; genai maps one per layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

__all__ = [
    "KINDS",
    "StateKind",
    "StateSpec",
    "has_state_layers",
    "probe_states",
    "fill_cache",
    "read_states",
    "past_to_present",
]


class StateKind:
    """One kind of cache tensor (see the module docstring)."""

    name: ClassVar[str]
    past_format: ClassVar[str]
    present_format: ClassVar[str]
    genai_input: ClassVar[str]
    genai_output: ClassVar[str]
    #: The axis that grows by the new tokens (KV), or ``None`` for a fixed-size state.
    sequence_axis: ClassVar[int | None] = None

    def read(self, layer: Any, index: int = 0) -> Any:
        """The tensor of this kind in a transformers cache layer, as ONNX carries it, or None.

        Args:
            layer: The transformers cache layer.
            index: Which of the layer's states of this kind (transformers' ``state_idx``: a
                layer may keep several, one per convolution); keys and values have one.
        """
        raise NotImplementedError

    def write(self, layer: Any, tensor: Any, index: int = 0) -> None:
        """Put ``tensor`` (ONNX layout) into a transformers cache layer, as a past state."""
        raise NotImplementedError

    def count(self, layer: Any) -> int:
        """How many states of this kind a transformers cache layer can hold."""
        return 1

    def empty_shape(self, batch: int, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of the state before the first token (``shape``: the dims after batch)."""
        dims = [batch, *shape]
        if self.sequence_axis is not None:
            dims[self.sequence_axis] = 0
        return tuple(dims)


class _Key(StateKind):
    name = "key"
    past_format = "past_key_values.%d.key"
    present_format = "present.%d.key"
    genai_input = "past_key_names"
    genai_output = "present_key_names"
    sequence_axis = 2
    attribute = "keys"

    def read(self, layer: Any, index: int = 0) -> Any:
        tensor = getattr(layer, self.attribute, None)
        return tensor if getattr(tensor, "ndim", 0) == 4 else None

    def write(self, layer: Any, tensor: Any, index: int = 0) -> None:
        if not layer.is_initialized:
            layer.lazy_initialization(tensor, tensor)
        setattr(layer, self.attribute, tensor)


class _Value(_Key):
    name = "value"
    past_format = "past_key_values.%d.value"
    present_format = "present.%d.value"
    genai_input = "past_value_names"
    genai_output = "present_value_names"
    attribute = "values"


#: Attributes of a transformers cache layer that irkit's conv state uses while tracing: the
#: past state as given (``K - 1`` columns) and the new one held at the pads
#: (:func:`_hold_conv_state_at_pads`).
_PAST, _HELD = "irkit_conv_past", "irkit_conv_held"


class _Conv(StateKind):
    name = "conv"
    past_format = "past.%d.conv"
    present_format = "present.%d.conv"
    genai_input = "past_conv_names"
    genai_output = "present_conv_names"

    def read(self, layer: Any, index: int = 0) -> Any:
        held = getattr(layer, _HELD, {}).get(index)  # (gathered at the last real tokens)
        if held is not None:
            return held()
        states = getattr(layer, "conv_states", None)
        tensor = states.get(index) if states else None
        return None if tensor is None else tensor[..., 1:]

    def write(self, layer: Any, tensor: Any, index: int = 0) -> None:
        import torch

        full = torch.nn.functional.pad(tensor, (1, 0))  # the column no output reads
        setattr(layer, _PAST, {**getattr(layer, _PAST, {}), index: tensor})
        layer.conv_states[index] = full
        layer.conv_kernel_size[index] = int(full.shape[-1])
        layer.is_conv_states_initialized[index] = True
        layer.has_previous_state[index] = True
        layer.dtype, layer.device = full.dtype, full.device

    def count(self, layer: Any) -> int:
        return len(getattr(layer, "conv_states", None) or ())


class _Recurrent(StateKind):
    name = "recurrent"
    past_format = "past.%d.recurrent"
    present_format = "present.%d.recurrent"
    genai_input = "past_recurrent_names"
    genai_output = "present_recurrent_names"

    def read(self, layer: Any, index: int = 0) -> Any:
        states = getattr(layer, "recurrent_states", None)
        return states.get(index) if states else None

    def write(self, layer: Any, tensor: Any, index: int = 0) -> None:
        layer.recurrent_states[index] = tensor.clone()  # updated in place by the model
        layer.is_recurrent_states_initialized[index] = True
        layer.has_previous_state[index] = True
        if layer.dtype is None:
            layer.dtype, layer.device = tensor.dtype, tensor.device

    def count(self, layer: Any) -> int:
        return len(getattr(layer, "recurrent_states", None) or ())


class _IndexerKey(StateKind):
    """The single-head keys of a sparse-attention indexer (DeepSeek-V3.2, GLM-MoE-DSA), which
    grow with the sequence like the attention keys (``DynamicIndexedLayer.indexer_keys``)."""

    name = "indexer_key"
    past_format = "past.%d.indexer_key"
    present_format = "present.%d.indexer_key"
    genai_input = "past_indexer_key_names"  # (genai 0.18 has no such input: refused)
    genai_output = "present_indexer_key_names"
    sequence_axis = 1

    def read(self, layer: Any, index: int = 0) -> Any:
        tensor = getattr(layer, "indexer_keys", None)
        return tensor if getattr(tensor, "ndim", 0) == 3 else None

    def write(self, layer: Any, tensor: Any, index: int = 0) -> None:
        layer.lazy_initialization_indexer(tensor)
        layer.indexer_keys = tensor

    def count(self, layer: Any) -> int:
        return int(hasattr(layer, "indexer_keys"))


#: Every kind, in the order of the ONNX inputs/outputs (all of one kind, then the next).
KINDS: tuple[StateKind, ...] = (_Key(), _Value(), _Conv(), _Recurrent(), _IndexerKey())


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One cache tensor of the model: its kind, decoder layer, dims after batch and dtype.

    Attributes:
        kind: The :class:`StateKind`.
        layer: The decoder layer's index (``N`` in the names).
        shape: The dims after batch (the sequence axis's example size for keys/values).
        dtype: The ``torch.dtype``.
        index: Which of the layer's states of this kind (transformers' ``state_idx``); a layer
            with several (one convolution state per projection) names the later ones with a
            suffix, ``past.N.conv.1``.
    """

    kind: StateKind
    layer: int
    shape: tuple[int, ...]
    dtype: Any
    index: int = 0
    #: Makes an empty transformers cache layer of the holder's class, for a layer the config
    #: does not type (a looped model appends cache layers for its later passes itself).
    blank: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def past_name(self) -> str:
        """The ONNX input name."""
        return self.kind.past_format % self.layer + self._suffix

    @property
    def present_name(self) -> str:
        """The ONNX output name."""
        return self.kind.present_format % self.layer + self._suffix

    @property
    def _suffix(self) -> str:
        return f".{self.index}" if self.index else ""


def has_state_layers(config: Any) -> bool:
    """Whether transformers types any of the config's cache layers to hold more than keys and
    values (conv/recurrent states, indexer keys).

    Args:
        config: A transformers config.

    Returns:
        True when a layer of ``DynamicCache(config=config)`` can hold a tensor of a kind other
        than key and value.
    """
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs  # noqa: F401
    except ImportError:  # older transformers: no typed layers
        return False
    extra = [kind for kind in KINDS if kind.name not in ("key", "value")]
    return any(kind.count(layer) for layer in _typed_layers(config) for kind in extra)


def _typed_layers(config: Any) -> list[Any]:
    """The cache layers transformers makes for ``config``, sliding windows kept unbounded.

    A sliding-window layer's transformers cache keeps only the window; an exported model's
    present holds every token (the window is the mask's), as for the other layers.
    """
    from transformers.cache_utils import (
        DYNAMIC_LAYER_TYPE_MAPPING,
        DynamicLayer,
        get_layer_types_and_kwargs,
    )

    try:
        types, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except Exception:  # a config transformers cannot type: plain attention layers
        return []
    unbounded = {"sliding_attention": "full_attention", "chunked_attention": "full_attention"}
    unbounded["hybrid_sliding"] = "hybrid"
    layers = []
    for kind, options in zip(types, kwargs, strict=True):
        cls = DYNAMIC_LAYER_TYPE_MAPPING.get(unbounded.get(kind, kind), DynamicLayer)
        if kind in unbounded:  # the window is the mask's; the other options stay (state counts)
            options = {k: v for k, v in options.items() if k != "sliding_window"}
        layers.append(cls(**options))
    return layers


def typed_cache_layers(config: Any) -> list[tuple[str, Any]]:
    """The cache layers transformers types for ``config``, with their layer-type names (the
    classes as :func:`_typed_layers` makes them); ``[]`` where transformers cannot type them.

    Args:
        config: A transformers config.

    Returns:
        ``(layer type, layer)`` per layer.
    """
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except Exception:  # older transformers, or a config it cannot type
        return []
    layers = _typed_layers(config)
    return list(zip(types, layers, strict=False)) if len(layers) == len(types) else []


def empty_cache(config: Any) -> Any:
    """A ``DynamicCache`` with the config's layer types (sliding layers unbounded), empty.

    Args:
        config: The model's config.

    Returns:
        The cache.
    """
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = _typed_layers(config)
    cache.layer_class_to_replicate = None
    return cache


def probe_states(cache: Any) -> list[StateSpec]:
    """The cache tensors of every layer of a cache the model returned, kind by kind.

    Args:
        cache: The ``DynamicCache`` after a forward.

    Returns:
        The specs, in the ONNX order (every layer's keys, then values, conv, recurrent).
    """
    specs = []
    for kind in KINDS:
        for number, layer in enumerate(cache.layers):
            for index in range(kind.count(layer)):
                tensor = kind.read(layer, index)
                if tensor is not None:
                    shape = tuple(tensor.shape[1:])
                    blank = _blank_layer(layer)
                    specs.append(StateSpec(kind, number, shape, tensor.dtype, index, blank))
    return specs


def _blank_layer(layer: Any) -> Callable[[], Any]:
    """A maker of an empty cache layer like ``layer`` (its class and state count)."""
    cls, count = type(layer), getattr(layer, "number_of_states", None)

    def blank() -> Any:
        return cls(number_of_states=count) if isinstance(count, int) else cls()

    return blank


def fill_cache(config: Any, specs: Sequence[StateSpec], tensors: Sequence[Any]) -> Any:
    """A cache of the config's layer types holding ``tensors`` as the past states.

    Args:
        config: The model's config.
        specs: What each tensor is.
        tensors: The tensors, in the order of ``specs``.

    Returns:
        The ``DynamicCache``.
    """
    cache = empty_cache(config)
    for spec in specs:  # layers past the config's: the model would append them itself
        while len(cache.layers) <= spec.layer:
            cache.layers.append(None)
        if cache.layers[spec.layer] is None and spec.blank is not None:
            cache.layers[spec.layer] = spec.blank()
    for spec, tensor in zip(specs, tensors, strict=True):
        spec.kind.write(cache.layers[spec.layer], tensor, spec.index)
    return cache


def read_states(cache: Any, specs: Sequence[StateSpec]) -> list[Any]:
    """The present tensors of ``specs`` from the cache the model returned.

    Args:
        cache: The ``DynamicCache`` after the forward.
        specs: The specs.

    Returns:
        The tensors, in the order of ``specs``.
    """
    return [spec.kind.read(cache.layers[spec.layer], spec.index) for spec in specs]


def past_to_present() -> dict[str, str]:
    """``{"present.%d.key": "past_key_values.%d.key", …}``: each kind's output → input format."""
    return {kind.present_format: kind.past_format for kind in KINDS}


def _hold_conv_state_at_pads(layer: Any, mask: Any) -> None:
    """Make the layer keep, as its convolution state, the inputs up to each row's last real token.

    transformers keeps the last ``K`` columns of ``cat(state, new inputs)``; where a row ends in
    pads (onnxruntime-genai right-pads a batch's shorter prompts) those are pads, and the next
    token's convolution would read zeros instead of the prompt's last inputs. The state is
    gathered at the row's last real token instead (the same columns without right pads): the
    ``K - 1`` columns of ``cat(past state, new inputs)`` (the past as given, not transformers'
    padded copy) up to the last new column ``m ≤ S`` whose mask is 1 (``m = 0``: all pads, the
    past kept), i.e. columns ``m … m + K - 2``. The gather is traced when the state is read,
    after the forward: onnxruntime-genai may give a present state the buffer of its past, so
    the new state is written after every read of the past (in the graph's node order).
    """
    import torch

    update = layer.update_conv_state

    def held(conv_states: Any, state_idx: int = 0, **kwargs: Any) -> Any:
        full = update(conv_states, state_idx, **kwargs)
        past = getattr(layer, _PAST, {}).get(state_idx)
        if past is None:  # (no past given: nothing to hold)
            return full
        keep, new = past.shape[-1], conv_states.shape[-1]
        steps = torch.arange(1, new + 1, device=mask.device)
        last = (mask.to(steps.dtype) * steps).amax(-1)  # (batch,): m
        index = last[:, None] + torch.arange(keep, device=mask.device)
        index = index[:, None, :].expand(past.shape[0], past.shape[1], keep)

        def state() -> Any:  # (traced when read: after every layer has read its past state)
            return torch.gather(torch.cat([past, conv_states], -1), -1, index)

        setattr(layer, _HELD, {**getattr(layer, _HELD, {}), state_idx: state})
        return full

    layer.update_conv_state = held


def _state_hooks(model: Any, cache: Any) -> list[Any]:
    """Hooks that make each layer's past recurrent state :func:`~irkit.llm.kernels.layer_state`
    while a module of that layer (``layer_idx``) runs, for kernels called without one."""
    from irkit.llm.kernels import enter_state, leave_state

    hooks = []
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if not isinstance(index, int) or not 0 <= index < len(cache.layers):
            continue
        states = getattr(cache.layers[index], "recurrent_states", None)
        state = states.get(0) if states else None
        if state is None:
            continue
        hooks.append(module.register_forward_pre_hook(enter_state(state)))
        hooks.append(module.register_forward_hook(leave_state))
    return hooks


def flat_model(model: Any, specs: Sequence[StateSpec], cache_argument: str, use_cache: bool) -> Any:
    """The model with a forward over flat tensors: ``(input_ids, attention_mask, position_ids,
    states) → (logits, *present states)``, for ``torch.export``.

    A shallow copy of ``model`` (same parameters, buffers and submodules, so weight names and
    module paths are the model's own) whose class is a subclass of the model's, of the same
    name, overriding ``forward``: it fills a cache of the config's layer types with ``states``
    (:func:`fill_cache`), runs the model's own ``forward`` and returns the logits and the
    cache's tensors of ``specs``. ``model`` itself is not changed.

    Args:
        model: The transformers causal LM.
        specs: The cache tensors, in the order of ``states``.
        cache_argument: The name of ``forward``'s cache argument.
        use_cache: Whether ``forward`` takes ``use_cache``.

    Returns:
        The flat model.
    """
    import copy

    from irkit.llm.kernels import padding_mask

    base = type(model)
    attends = any(spec.kind.sequence_axis is not None for spec in specs)

    def forward(
        self: Any,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        states: Sequence[Any] = (),
    ) -> tuple[Any, ...]:
        cache = fill_cache(self.config, specs, states)
        mask = None if attention_mask is None else attention_mask[:, -input_ids.shape[1] :]
        if mask is not None:
            for layer in cache.layers:
                if getattr(layer, "conv_states", None) is not None:
                    _hold_conv_state_at_pads(layer, mask)
        kwargs: dict[str, Any] = {"input_ids": input_ids, cache_argument: cache}
        if attention_mask is not None:  # no attention layer: the mask of the new tokens only
            kwargs["attention_mask"] = attention_mask if attends else mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if use_cache:
            kwargs["use_cache"] = True
        hooks = _state_hooks(self, cache)
        try:
            with padding_mask(mask):
                output = base.forward(self, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        returned = next(
            (v for v in output.values() if v is not None and hasattr(v, "layers")), None
        )
        return (output.logits, *read_states(returned or cache, specs))

    namespace = {
        "forward": forward,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
    }
    flat = copy.copy(model)
    flat.__class__ = type(base.__name__, (base,), namespace)
    return flat
