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
reads, so it is padded by one zero column on the way in and dropped on the way out. That is
probed, not assumed: where the model's output reads the oldest column too (ZAYA's stacked
convolutions keep exactly their joint left context), the state is carried whole
(:func:`widened`); ``export_causal_lm`` checks it with a NaN in that column on a model with
weights. A layer
that keeps several states of one kind (transformers' ``state_idx``: a convolution per
projection) names the later ones with a suffix, ``past.N.conv.1``; genai maps one per layer.

A model may keep its states on its modules instead (RecurrentGemma: ``conv1d_state`` on each
recurrent block, ``recurrent_states`` on its RG-LRU; no transformers cache layer holds them).
Those are kinds with :attr:`StateKind.on_module` set, under the same ``conv`` / ``recurrent``
names: read and written as the attribute of the module of decoder layer ``N`` (the ``N``-th
module of the model's list of decoder layers, or a submodule of it, that defines the
attribute), given already in the ONNX layout. Every function taking ``model`` reaches them; :func:`keep_module_states` puts the
attributes back after a probe or a trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

__all__ = [
    "KINDS",
    "ListedStates",
    "StateKind",
    "StateSpec",
    "has_state_layers",
    "probe_states",
    "widened",
    "fill_cache",
    "read_states",
    "past_to_present",
    "module_holders",
    "keep_module_states",
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
    #: Held by a module of the layer (its attribute), not by a transformers cache layer.
    on_module: ClassVar[bool] = False

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


class _WholeConv(_Conv):
    """A convolution state carried with all the columns transformers keeps: for a layer whose
    convolutions read its oldest column too (ZAYA's CCA: two stacked kernels whose joint
    left context is the whole state). :func:`widened` makes a conv spec one of these."""

    def read(self, layer: Any, index: int = 0) -> Any:
        states = getattr(layer, "conv_states", None)
        return states.get(index) if states else None

    def write(self, layer: Any, tensor: Any, index: int = 0) -> None:
        layer.conv_states[index] = tensor.clone()  # updated in place by the model
        layer.conv_kernel_size[index] = int(tensor.shape[-1])
        layer.is_conv_states_initialized[index] = True
        layer.has_previous_state[index] = True
        layer.dtype, layer.device = tensor.dtype, tensor.device


_WHOLE_CONV = _WholeConv()


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


class _ModuleState(StateKind):
    """A state its mixer module keeps as an attribute (module docstring), in the ONNX layout;
    ``read``/``write``/``count`` take that module as ``layer``."""

    on_module = True
    attribute: ClassVar[str]

    def read(self, layer: Any, index: int = 0) -> Any:
        tensor = vars(layer).get(self.attribute)
        return tensor if hasattr(tensor, "ndim") else None

    def write(self, layer: Any, tensor: Any, index: int = 0) -> None:
        setattr(layer, self.attribute, tensor)

    def count(self, layer: Any) -> int:
        return int(self.attribute in vars(layer))


class _ModuleConv(_ModuleState, _Conv):
    """The last ``K - 1`` inputs of a recurrent block's convolution (RecurrentGemma's
    ``conv1d_state``, ``(batch, channels, K - 1)``)."""

    attribute = "conv1d_state"


class _ModuleRecurrent(_ModuleState, _Recurrent):
    """An RG-LRU's state (RecurrentGemma's ``recurrent_states``, ``(batch, width)`` float32)."""

    attribute = "recurrent_states"


#: Every kind, in the order of the ONNX inputs/outputs (all of one kind, then the next).
KINDS: tuple[StateKind, ...] = (_Key(), _Value(), _Conv(), _Recurrent(), _IndexerKey())
KINDS += (_ModuleConv(), _ModuleRecurrent())


def module_holders(model: Any, kind: StateKind) -> dict[int, Any]:
    """Decoder layer index → the module holding ``kind``'s attribute (an ``on_module`` kind).

    Args:
        model: The transformers model, or None (no holders).
        kind: The kind.

    Returns:
        For each decoder layer (the modules of the model's first ``ModuleList`` with one module
        per ``num_hidden_layers`` of its text config), its first submodule (itself included)
        that defines the attribute.
    """
    holders: dict[int, Any] = {}
    if model is None or not kind.on_module:
        return holders
    for index, layer in enumerate(_decoder_layers(model)):
        holder = next((sub for sub in layer.modules() if kind.count(sub)), None)
        if holder is not None:
            holders[index] = holder
    return holders


def _decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers: its first ``ModuleList`` of ``num_hidden_layers`` modules."""
    import torch

    config = getattr(model, "config", None)
    try:
        count = config.get_text_config(decoder=True).num_hidden_layers  # type: ignore[union-attr]
    except AttributeError:
        return []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return list(module)
    return []


@contextlib.contextmanager
def keep_module_states(model: Any) -> Iterator[None]:
    """Inside the ``with``, the module-held states may change; on exit they are put back.

    A probe leaves the model as it was, and a trace assigns no tensor attribute
    (``torch.export`` refuses a forward that does).

    Args:
        model: The transformers model.

    Yields:
        Nothing.
    """
    kept = [
        (holder, kind.attribute, vars(holder)[kind.attribute])  # type: ignore[attr-defined]
        for kind in KINDS
        for holder in module_holders(model, kind).values()
    ]
    try:
        yield
    finally:
        for holder, attribute, value in kept:
            setattr(holder, attribute, value)


def _holder(cache: Any, model: Any, spec: StateSpec) -> Any:
    """The cache layer or module holding ``spec``'s tensor."""
    if not spec.kind.on_module:
        return cache.layers[spec.layer]
    holder = module_holders(model, spec.kind).get(spec.layer)
    if holder is None:
        from irkit.errors import ExportError

        raise ExportError(
            f"cache kind {spec.kind.name!r} of layer {spec.layer} is held by a module "
            f"(attribute {getattr(spec.kind, 'attribute', '?')!r}), and "
            f"{type(model).__name__} has no module of layer_idx {spec.layer} defining it; "
            "pass the model the layout was probed from"
        )
    return holder


_RECURRENT = _Recurrent()


@dataclasses.dataclass(frozen=True)
class _Zeros:
    """A tensor attribute of a model's own cache, made again as zeros (its shape and dtype)."""

    shape: tuple[int, ...]
    dtype: Any

    def make(self, device: Any) -> Any:
        import torch

        return torch.zeros(self.shape, dtype=self.dtype, device=device)


@dataclasses.dataclass(frozen=True)
class ListedStates:
    """A model's own cache class that keeps each layer's recurrent states in a container of its
    own: a list indexed by decoder layer, or a dict keyed by it.

    MiniMax's ``MiniMaxCache`` is a ``DynamicCache`` whose layers hold the attention layers'
    keys and values, and whose ``linear_cache`` list, indexed by decoder layer (``[]`` where a
    layer has none), the lightning-attention states; the model refuses any other cache class.
    xLSTM's ``xLSTMCache`` is no transformers ``Cache`` at all: its ``rnn_state`` dict maps
    every decoder layer to a tuple of three tensors (the mLSTM's ``C``, ``n``, ``m``). Such a
    cache is found by what it holds (:func:`find_listed_states`), not by its class, and its
    states are the ``recurrent`` kind, one per tuple position (``past.N.recurrent``,
    ``past.N.recurrent.1``, …): :meth:`wrap` makes one of a typed cache filled by
    :func:`fill_cache` (sharing its layers), :meth:`unwrap` reads one as typed layers.

    Attributes:
        cls: The cache class.
        attribute: The name of its per-layer container of recurrent states.
        keyed: The container is a dict keyed by layer index (else a list indexed by it).
        width: ``0``: each layer's entry is one tensor; ``n``: a tuple of ``n`` tensors.
        made: The cache's other attributes as the model made them, ``(name, value)``, a tensor
            among them as :class:`_Zeros` (xLSTM's token counter ``seqlen_offset``): a wrapped
            cache starts from them. ``layers`` is named with the value ``None``: the typed
            cache's layers are shared.
    """

    cls: type
    attribute: str
    keyed: bool = False
    width: int = 0
    made: tuple[tuple[str, Any], ...] = dataclasses.field(default=(), compare=False, repr=False)

    def wrap(self, cache: Any) -> Any:
        """An instance of :attr:`cls` with ``cache``'s layers and their recurrent states held.

        Made without calling the class (its arguments are the model's business): its
        attributes are :attr:`made`'s, tensors as zeros, containers copied.

        Args:
            cache: A typed ``DynamicCache`` (:func:`fill_cache`).

        Returns:
            The model's own cache, whose layers are ``cache``'s (keys and values updated there)
            and whose container holds the very tensors of their recurrent states.
        """
        import copy

        count = max(self.width, 1)
        states = [
            None if layer is None else tuple(_RECURRENT.read(layer, i) for i in range(count))
            for layer in cache.layers
        ]
        entries = {
            number: (state if self.width else state[0])
            for number, state in enumerate(states)
            if state is not None and all(t is not None for t in state)
        }
        device = next((t.device for state in entries.values() for t in _tensors(state)), None)
        own: Any = object.__new__(self.cls)
        for name, value in self.made:
            if name == "layers":
                value = cache.layers
            elif isinstance(value, _Zeros):
                value = value.make(device)
            elif isinstance(value, (list, dict, set)):
                value = copy.copy(value)
            own.__dict__[name] = value
        if self.keyed:
            held: Any = entries
        else:
            held = [entries.get(number, []) for number in range(len(states))]
        setattr(own, self.attribute, held)
        return own

    def unwrap(self, own: Any) -> Any:
        """A view of the model's own cache whose ``layers`` hold its listed states as typed
        layers do (``recurrent_states``), for the kinds to read.

        Args:
            own: An instance of :attr:`cls` after a forward.

        Returns:
            An object with ``layers``: the cache's own layers (none for a cache without), with
            a transformers ``LinearAttentionLayer`` holding the states at each listed layer.
        """
        import types

        from transformers.cache_utils import LinearAttentionLayer

        listed = getattr(own, self.attribute)
        entries = dict(listed.items() if self.keyed else enumerate(listed))
        count = max([len(getattr(own, "layers", ())), *(n + 1 for n in entries)])
        layers = list(getattr(own, "layers", ())) + [None] * count
        for number, entry in entries.items():
            tensors = _tensors(entry)
            if not tensors:
                continue
            if not hasattr(layers[number], "recurrent_states"):
                layers[number] = LinearAttentionLayer(number_of_states=len(tensors))
            for index, tensor in enumerate(tensors):
                layers[number].recurrent_states[index] = tensor
        return types.SimpleNamespace(layers=layers[:count])


def _tensors(entry: Any) -> tuple[Any, ...]:
    """The state tensors of one layer's entry: a tensor of 2 dims or more, or a tuple (list) of
    them; ``()`` for anything else (MiniMax's ``[]`` at an attention layer)."""
    if getattr(entry, "ndim", 0) >= 2:
        return (entry,)
    listed = isinstance(entry, (tuple, list)) and bool(entry)
    if listed and all(getattr(t, "ndim", 0) >= 2 for t in entry):
        return tuple(entry)
    return ()


def find_listed_states(cache: Any, config: Any) -> ListedStates | None:
    """How ``cache``, a model's own cache class, keeps its recurrent states, if in a list or a
    dict of its own by decoder layer.

    A list attribute of the cache (besides ``layers``), or a dict keyed by layer index,
    qualifies when it holds states (a tensor, or a tuple of as many tensors at every layer) at
    exactly the decoder layers that hold a recurrent state: those transformers types with one
    for ``config`` (``DynamicCache(config=…)``'s ``LinearAttentionLayer`` layers), or, where it
    types none (a config of attention layers only, xLSTM's), every decoder layer.

    Args:
        cache: The cache the model made itself (given none).
        config: The model's config.

    Returns:
        The :class:`ListedStates`, or ``None`` where no attribute qualifies, or where
        transformers has no ``LinearAttentionLayer`` (before its typed cache layers), which
        :meth:`ListedStates.unwrap` holds the states in.
    """
    try:
        from transformers.cache_utils import LinearAttentionLayer  # noqa: F401
    except ImportError:
        return None
    recurrent = {
        number for number, layer in enumerate(_typed_layers(config)) if _RECURRENT.count(layer)
    }
    try:
        layers = int(config.get_text_config(decoder=True).num_hidden_layers)
    except (AttributeError, TypeError, ValueError):
        layers = 0
    expected = recurrent or set(range(layers))
    for attribute, value in vars(cache).items():
        if attribute == "layers" or not expected:
            continue
        if isinstance(value, list):
            entries, keyed = dict(enumerate(value)), False
        elif isinstance(value, dict) and all(type(key) is int for key in value):
            entries, keyed = dict(value), True
        else:
            continue
        held = {number: entry for number, entry in entries.items() if _tensors(entry)}
        bare = {getattr(entry, "ndim", 0) >= 2 for entry in held.values()}
        widths = {len(_tensors(entry)) for entry in held.values()}
        if set(held) != expected or len(bare) != 1 or len(widths) != 1:
            continue
        width = 0 if bare == {True} else widths.pop()
        return ListedStates(type(cache), attribute, keyed, width, _made(cache, attribute))
    return None


def _made(cache: Any, attribute: str) -> tuple[tuple[str, Any], ...]:
    """``cache``'s attributes but ``attribute``, for :attr:`ListedStates.made` (tensors as
    their shapes and dtypes: the probe's may be fake tensors; ``layers`` as ``None``)."""
    import torch

    made: list[tuple[str, Any]] = []
    for name, value in vars(cache).items():
        if name == attribute:
            continue
        if name == "layers":
            value = None
        elif isinstance(value, torch.Tensor):
            value = _Zeros(tuple(int(n) for n in value.shape), value.dtype)
        made.append((name, value))
    return tuple(made)


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
    #: The model's own cache class, where it keeps recurrent states outside transformers'
    #: layers (:class:`ListedStates`); ``None`` for transformers' typed ``DynamicCache``.
    listed: ListedStates | None = dataclasses.field(default=None, compare=False, repr=False)

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
    try:
        from transformers.cache_utils import (
            DYNAMIC_LAYER_TYPE_MAPPING,
            DynamicLayer,
            get_layer_types_and_kwargs,
        )
    except ImportError:  # older transformers (4.54): no typed layers, plain attention layers
        return []
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


def probe_states(
    cache: Any, model: Any = None, listed: ListedStates | None = None
) -> list[StateSpec]:
    """The cache tensors of every layer of a cache the model returned, kind by kind.

    Args:
        cache: The ``DynamicCache`` after a forward.
        model: The model after that forward, for the module-held kinds (None: none).
        listed: How the model's own cache class keeps its recurrent states, where ``cache`` is
            one (:func:`find_listed_states`).

    Returns:
        The specs, in the ONNX order (every layer's keys, then values, conv, recurrent).
    """
    if listed is not None:
        cache = listed.unwrap(cache)
    specs = []
    for kind in KINDS:
        if kind.on_module:
            for number, holder in sorted(module_holders(model, kind).items()):
                tensor = kind.read(holder)
                if tensor is not None:
                    specs.append(StateSpec(kind, number, tuple(tensor.shape[1:]), tensor.dtype))
            continue
        for number, layer in enumerate(cache.layers):
            for index in range(kind.count(layer)):
                tensor = kind.read(layer, index)
                if tensor is not None:
                    shape = tuple(tensor.shape[1:])
                    blank = _blank_layer(layer)
                    spec = StateSpec(kind, number, shape, tensor.dtype, index, blank, listed)
                    specs.append(spec)
    return specs


def widened(spec: StateSpec, layer: Any) -> StateSpec:
    """``spec`` (a conv state) carried whole: all the columns ``layer`` keeps, not the last
    ``K - 1``; same names. For a model found to read the oldest column (see the module
    docstring).

    Args:
        spec: A conv state's spec.
        layer: The transformers cache layer holding it after a forward.

    Returns:
        The spec with the whole state's shape.
    """
    tensor = _WHOLE_CONV.read(layer, spec.index)
    return dataclasses.replace(spec, kind=_WHOLE_CONV, shape=tuple(tensor.shape[1:]))


def _blank_layer(layer: Any) -> Callable[[], Any]:
    """A maker of an empty cache layer like ``layer`` (its class and state count)."""
    cls, count = type(layer), getattr(layer, "number_of_states", None)

    def blank() -> Any:
        return cls(number_of_states=count) if isinstance(count, int) else cls()

    return blank


def fill_cache(
    config: Any, specs: Sequence[StateSpec], tensors: Sequence[Any], model: Any = None
) -> Any:
    """A cache of the config's layer types holding ``tensors`` as the past states.

    Args:
        config: The model's config.
        specs: What each tensor is.
        tensors: The tensors, in the order of ``specs``.
        model: The model whose modules take the module-held kinds (set as their attributes).

    Returns:
        The ``DynamicCache``.
    """
    cache = empty_cache(config)
    for spec in specs:  # layers past the config's: the model would append them itself
        if spec.kind.on_module:
            continue
        while len(cache.layers) <= spec.layer:
            cache.layers.append(None)
        layer = cache.layers[spec.layer]
        # the config types no layer, or one that cannot hold the state the model's own cache
        # keeps there (xLSTM's config types attention layers): the probed layer's class
        unfit = layer is None or spec.index >= spec.kind.count(layer)
        if unfit and spec.blank is not None:
            cache.layers[spec.layer] = spec.blank()
    for spec, tensor in zip(specs, tensors, strict=True):
        spec.kind.write(_holder(cache, model, spec), tensor, spec.index)
    listed = next((spec.listed for spec in specs if spec.listed is not None), None)
    return cache if listed is None else listed.wrap(cache)


def read_states(cache: Any, specs: Sequence[StateSpec], model: Any = None) -> list[Any]:
    """The present tensors of ``specs`` from the cache the model returned.

    Args:
        cache: The ``DynamicCache`` after the forward.
        specs: The specs.
        model: The model, for the module-held kinds.

    Returns:
        The tensors, in the order of ``specs``.
    """
    listed = next((spec.listed for spec in specs if spec.listed is not None), None)
    if listed is not None and isinstance(cache, listed.cls):
        cache = listed.unwrap(cache)
    return [spec.kind.read(_holder(cache, model, spec), spec.index) for spec in specs]


def past_to_present() -> dict[str, str]:
    """``{"present.%d.key": "past_key_values.%d.key", …}``: each kind's output → input format."""
    return {kind.present_format: kind.past_format for kind in KINDS}


def _assign_recurrent_states(layer: Any) -> None:
    """Make the layer's ``update_recurrent_state`` an assignment, not an in-place copy.

    transformers' ``LinearAttentionLayer`` copies the new state into the cache tensor
    (``recurrent_states[i].copy_(new)``: a static address for CUDA graphs); traced, that is an
    in-place write into a program input, which makes :func:`irkit.lower` functionalize the
    whole program (a second trace: 5.7 s of a tiny Qwen3.5's export). The layer's state is
    rebound to the new tensor instead (in the old one's dtype, as ``copy_`` converts): the
    same values wherever the model or irkit reads the state after the update.
    """
    states = getattr(layer, "recurrent_states", None)
    flags = getattr(layer, "is_recurrent_states_initialized", None)
    update = getattr(layer, "update_recurrent_state", None)
    if not isinstance(states, (list, dict)) or flags is None or update is None:
        return

    def assign(recurrent_states: Any, state_idx: int = 0, **kwargs: Any) -> Any:
        if not flags[state_idx]:  # (no state yet: the layer's own lazy initialization)
            return update(recurrent_states, state_idx, **kwargs)
        old = states[state_idx]
        states[state_idx] = recurrent_states.to(old.dtype)
        return states[state_idx]

    layer.update_recurrent_state = assign


def _hold_conv_state_at_pads(layer: Any, mask: Any) -> None:
    """Make the layer keep, as its convolution state, the inputs up to each row's last real token.

    transformers keeps the last ``K`` columns of ``cat(state, new inputs)``; where a row ends in
    pads (onnxruntime-genai right-pads a batch's shorter prompts) those are pads, and the next
    token's convolution would read zeros instead of the prompt's last inputs. The state is
    gathered at the row's last real token instead (the same columns without right pads): the
    ``K - 1`` columns of ``cat(past state, new inputs)`` (the past as given, not transformers'
    padded copy) up to the last new column ``m ≤ S`` whose mask is 1 (``m = 0``: all pads, the
    past kept), i.e. columns ``m … m + K - 2``. Where every new token is real (each decode
    step), those are the last ``K - 1`` columns, which the layer's convolution already
    holds (``CausalConvWithState``'s new state under ``--target ort``): the layer records both,
    and :func:`_settle_held_states` chooses once for all layers, after the forward. A model that
    passes its new state rather than the new inputs (ZAYA: the last ``K`` columns it computed
    itself) is left as it is: its right-padded rows keep pad columns.
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    update = layer.update_conv_state

    def held(conv_states: Any, state_idx: int = 0, **kwargs: Any) -> Any:
        full = update(conv_states, state_idx, **kwargs)
        past = getattr(layer, _PAST, {}).get(state_idx)
        if past is None:  # (no past given: nothing to hold)
            return full
        if not statically_known_true(conv_states.shape[-1] == mask.shape[-1]):
            return full  # the model passed its new state, not the new inputs (ZAYA): kept as is
        pending = _HeldConv(past, conv_states, full[..., -past.shape[-1] :])
        setattr(layer, _PENDING, {**getattr(layer, _PENDING, {}), state_idx: pending})
        return full

    layer.update_conv_state = held


#: The attribute of a transformers cache layer with its :class:`_HeldConv` by state index.
_PENDING = "irkit_conv_pending"


@dataclasses.dataclass(frozen=True)
class _HeldConv:
    """A layer's convolution state to hold at the pads (:func:`_hold_conv_state_at_pads`): the
    past state as given, the new inputs, and the last ``K - 1`` columns of their concatenation
    as the layer's convolution read them."""

    past: Any
    new: Any
    last: Any


def _settle_held_states(layers: Sequence[Any], mask: Any) -> None:
    """Each layer's held convolution state, chosen once for all layers after the forward.

    Where every new token is real (each decode step), the state is the last ``K - 1`` columns
    the layer's convolution read (no work: under ``--target ort``, ``CausalConvWithState``'s own
    new state); else each row's columns up to its last real token are gathered (the same
    columns where a row's last token is real). One
    ``torch.cond`` (an ``If``) for all layers: a decode step runs none of the gathers. Its
    results are written after every layer has read its past state (onnxruntime-genai may give a
    present state the buffer of its past).
    """
    import torch

    found = [
        (layer, index, pending)
        for layer in layers
        for index, pending in getattr(layer, _PENDING, {}).items()
    ]
    if not found:
        return
    count = len(found)

    def last(mask: Any, *tensors: Any) -> tuple[Any, ...]:
        # (in the past state's shape: the branches' results the same symbols, whatever torch
        # made of the slice's length; else torch.cond gives them an unbacked size)
        pasts = tensors[:count]
        return tuple(
            t.reshape(p.shape).clone() for p, t in zip(pasts, tensors[2 * count :], strict=True)
        )

    def gathered(mask: Any, *tensors: Any) -> tuple[Any, ...]:
        steps = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
        end = (mask.to(steps.dtype) * steps).amax(-1)  # (batch,): m
        states = []
        for past, new in zip(tensors[:count], tensors[count : 2 * count], strict=True):
            keep = past.shape[-1]
            index = end[:, None] + torch.arange(keep, device=mask.device)
            index = index[:, None, :].expand(past.shape[0], past.shape[1], keep)
            states.append(torch.gather(torch.cat([past, new], -1), -1, index))
        return tuple(states)

    tensors = (
        *(p.past for _, _, p in found),
        *(p.new for _, _, p in found),
        *(p.last for _, _, p in found),
    )
    # (every new token real, not only each row's last: the same choice at each decode step, and
    # the minimum reads the mask slice the graph has, with no Gather of its last column)
    every_new_real = mask.amin() > 0
    # (the operator itself, not ``torch.cond``: under export's tracing ``torch.cond`` first
    # compiles the branches with dynamo, ~1.5 s of a 10-conv-layer export; the operator traces
    # them with make_fx alone, into the same program)
    states = torch.ops.higher_order.cond(every_new_real, last, gathered, (mask, *tensors))
    for (layer, index, _), state in zip(found, states, strict=True):
        setattr(layer, _HELD, {**getattr(layer, _HELD, {}), index: lambda state=state: state})
        getattr(layer, _PENDING).pop(index)


def _state_hooks(model: Any, cache: Any) -> list[Any]:
    """Hooks that make each layer's past recurrent state :func:`~irkit.llm.kernels.layer_state`
    while a module of that layer (``layer_idx``) runs, for kernels called without one."""
    from irkit.llm.kernels import enter_state, leave_state

    hooks = []
    layers = getattr(cache, "layers", ())  # (xLSTM's own cache has none)
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if not isinstance(index, int) or not 0 <= index < len(layers):
            continue
        states = getattr(layers[index], "recurrent_states", None)
        state = states.get(0) if states else None
        if state is None:
            continue
        hooks.append(module.register_forward_pre_hook(enter_state(state)))
        hooks.append(module.register_forward_hook(leave_state))
    return hooks


def _keeping_module_states(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` inside :func:`keep_module_states` of its module."""
    import functools

    @functools.wraps(forward)
    def kept(self: Any, *args: Any, **kwargs: Any) -> Any:
        with keep_module_states(self):
            return forward(self, *args, **kwargs)

    return kept


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
        cache = fill_cache(self.config, specs, states, self)
        mask = None if attention_mask is None else attention_mask[:, -input_ids.shape[1] :]
        for layer in getattr(cache, "layers", ()):  # (xLSTM's own cache has none)
            _assign_recurrent_states(layer)
            if mask is not None and getattr(layer, "conv_states", None) is not None:
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
        if mask is not None:
            _settle_held_states(getattr(returned or cache, "layers", ()), mask)
        return (output.logits, *read_states(returned or cache, specs, self))

    namespace = {
        "forward": _keeping_module_states(forward),
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
    }
    flat = copy.copy(model)
    flat.__class__ = type(base.__name__, (base,), namespace)
    return flat
